package measure

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseStat(t *testing.T) {
	// A command name with a space and a ')' (comm is taken up to the last
	// one), then 50 fields as Linux writes them.
	line := "4242 (kube) apiserver) S 17 4242 4242 0 -1 4194560 9000 0 0 0 1234 567 89 10 20 0 12 0 300 1000000 5000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
	got, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{Comm: "kube) apiserver", PPID: 17, UTime: 1234, STime: 567, CUTime: 89, CSTime: 10}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseStat (-want +got):\n%s", diff)
	}
	if s := got.CPUSeconds(); s != 18.01 {
		t.Errorf("CPUSeconds = %v, want 18.01 (1801 ticks)", s)
	}
	for _, bad := range []string{"", "4242 kube S 1", "4242 )kube( S 1 2 3 4 5 6 7 8 9 10 11 12 13 14", "4242 (kube) S 17 1 1 0 -1 0 0 0 0 0 1234 567"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) = nil error", bad)
		}
	}
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tetcd\nState:\tS (sleeping)\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nRssAnon:\t   90000 kB\nRssFile:\t   12000 kB\nRssShmem:\t     400 kB\nThreads:\t17\n"
	got := ParseStatus([]byte(status))
	if diff := cmp.Diff(Status{VmRSSKB: 102400, VmHWMKB: 204800, RssAnonKB: 90000, RssFileKB: 12000, RssShmemKB: 400, Threads: 17}, got); diff != "" {
		t.Errorf("ParseStatus (-want +got):\n%s", diff)
	}
	if got.RSSBytes() != 100<<20 || got.HWMBytes() != 200<<20 {
		t.Errorf("RSSBytes %d, HWMBytes %d, want 100 MiB and 200 MiB", got.RSSBytes(), got.HWMBytes())
	}
	// A kernel thread has no Vm* lines.
	if got := ParseStatus([]byte("Name:\tkthreadd\nThreads:\t1\n")); got != (Status{Threads: 1}) {
		t.Errorf("kernel thread: %+v", got)
	}
}

// TestSelf reads this test process from the real /proc.
func TestSelf(t *testing.T) {
	pid := os.Getpid()
	st, err := ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != os.Getppid() || st.Comm == "" {
		t.Errorf("stat of self: %+v, want ppid %d", st, os.Getppid())
	}
	mem, err := ReadStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	if mem.VmRSSKB <= 0 || mem.VmHWMKB < mem.VmRSSKB || mem.Threads < 1 {
		t.Errorf("status of self: %+v", mem)
	}
	pids, err := PIDs()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pids {
		found = found || p == pid
	}
	if !found {
		t.Errorf("PIDs() lacks this process %d", pid)
	}
	if _, err := ReadStat(-1); err == nil {
		t.Error("ReadStat(-1) = nil error")
	}
	if _, err := ReadStatus(-1); err == nil {
		t.Error("ReadStatus(-1) = nil error")
	}
}

func TestLoadAvg(t *testing.T) {
	if got := parseLoadAvg([]byte("0.52 0.48 0.40 2/345 6789\n")); got != "0.52 0.48 0.40" {
		t.Errorf("parseLoadAvg = %q", got)
	}
	if got := parseLoadAvg([]byte("0.52 0.48")); got != "" {
		t.Errorf("short loadavg = %q, want empty", got)
	}
	if LoadAvg() == "" {
		t.Error("LoadAvg() is empty on Linux")
	}
	if f := strings.Fields(LoadAvgLine()); len(f) != 5 {
		t.Errorf("LoadAvgLine() = %q, want /proc/loadavg's 5 fields", LoadAvgLine())
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "e2e", "measure", "repo.go")); err != nil {
		t.Errorf("root %s does not hold this package: %v", root, err)
	}
	// Another module's go.mod (scripts/kube/... have their own) is passed by.
	if sub, err := RepoRoot(filepath.Join(root, "scripts", "kube", "etcd")); err != nil || sub != root {
		t.Errorf("RepoRoot(scripts/kube/etcd) = %q, %v; want %q", sub, err, root)
	}
	if _, err := RepoRoot(t.TempDir()); err == nil {
		t.Error("found a repo root above a temp dir")
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "go.mod"), []byte("module github.com/vsplane/vsplane/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if IsRepoRoot(other) {
		t.Error("a go.mod of module github.com/vsplane/vsplane/other counts as the root")
	}
}

func TestWriteReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	type row struct {
		Name  string  `json:"name"`
		Value float64 `json:"value"`
	}
	if err := WriteReport(dir, "bench", []row{{"a", 1.5}}, "# bench\n"); err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := "[\n  {\n    \"name\": \"a\",\n    \"value\": 1.5\n  }\n]\n"
	if string(js) != want {
		t.Errorf("bench.json = %q, want %q", js, want)
	}
	md, err := os.ReadFile(filepath.Join(dir, "bench.md"))
	if err != nil || string(md) != "# bench\n" {
		t.Errorf("bench.md = %q, %v", md, err)
	}
	if err := WriteJSON(dir, "bad.json", func() {}); err == nil {
		t.Error("WriteJSON of a func = nil error")
	}
	var back []row
	if err := json.Unmarshal(js, &back); err != nil || len(back) != 1 {
		t.Errorf("bench.json does not read back: %v %v", back, err)
	}
}
