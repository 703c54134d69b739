package vm

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestBootWithoutKernelNamesDepsScript(t *testing.T) {
	_, err := Boot(context.Background(), Options{CacheDir: t.TempDir()})
	if !errors.Is(err, ErrDepsMissing) || !strings.Contains(err.Error(), "scripts/vm/deps.sh") {
		t.Fatalf("want an ErrDepsMissing naming deps.sh, got %v", err)
	}
}

func TestGuestFwdRules(t *testing.T) {
	got, err := guestFwdRules([]int{2379, 6443})
	if err != nil {
		t.Fatal(err)
	}
	want := ",guestfwd=tcp:198.19.255.100:2379-cmd:socat - TCP:127.0.0.1:2379" +
		",guestfwd=tcp:198.19.255.100:6443-cmd:socat - TCP:127.0.0.1:6443"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	for _, bad := range [][]int{{0}, {70000}, {80, 80}} {
		if _, err := guestFwdRules(bad); err == nil {
			t.Errorf("ports %v accepted", bad)
		}
	}
}

func TestParseSummary(t *testing.T) {
	out := "1 ok pod-a from 198.19.1.13:1\n2 fail: timeout\nsummary {\"ok\":1,\"fail\":1,\"backends\":{\"pod-a\":1}}\n"
	s, err := ParseSummary(out)
	if err != nil {
		t.Fatal(err)
	}
	if s.OK != 1 || s.Fail != 1 || s.Backends["pod-a"] != 1 {
		t.Errorf("got %+v", s)
	}
	if _, err := ParseSummary("no summary here"); err == nil {
		t.Error("missing summary accepted")
	}
	if _, err := ParseSummary("summary {bad"); err == nil {
		t.Error("bad summary accepted")
	}
}

func TestShellQuote(t *testing.T) {
	for _, s := range []string{"", "plain", "it's", `a "b" $c \d`, "x'y'z"} {
		out, err := exec.Command("sh", "-c", "printf %s "+ShellQuote(s)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != s {
			t.Errorf("quoted %q came back as %q", s, out)
		}
	}
}

// TestOptionsRejectBadDisksAndForwards: a missing disk, a directory as a
// disk, a comma in its path, and out-of-range or vmexec's hostfwd ports are
// errors before anything boots.
func TestOptionsRejectBadDisksAndForwards(t *testing.T) {
	dir := t.TempDir()
	comma := filepath.Join(dir, "a,b.img")
	if err := os.WriteFile(comma, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Options{
		"missing disk":   {Disks: []string{filepath.Join(dir, "absent.img")}},
		"directory disk": {Disks: []string{dir}},
		"comma":          {Disks: []string{comma}},
		"port 0":         {HostFwdPorts: []int{0}},
		"vmexec's port":  {HostFwdPorts: []int{guestExecPt}},
	} {
		o.RepoRoot, o.CacheDir = dir, dir
		if err := o.defaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A vmexec connection that breaks says whether QEMU is gone and quotes the
// console, where a guest kernel panic would show.
func TestTransportErrorQuotesConsole(t *testing.T) {
	dir := t.TempDir()
	console := filepath.Join(dir, "console.log")
	if err := os.WriteFile(console, []byte("booting\nKernel panic - not syncing: Attempted to kill init!\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { // accept, then close without answering
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	defer ln.Close()
	v := &VM{execAddr: ln.Addr().String(), console: console, exited: make(chan struct{})}

	_, err = v.Run(context.Background(), "true")
	if err == nil || !strings.Contains(err.Error(), "QEMU still running") || !strings.Contains(err.Error(), "Kernel panic") {
		t.Fatalf("running QEMU: got %v", err)
	}
	v.waitErr = errors.New("exit status 0")
	close(v.exited)
	_, err = v.Run(context.Background(), "true")
	if err == nil || !strings.Contains(err.Error(), "QEMU has exited (exit status 0)") {
		t.Fatalf("exited QEMU: got %v", err)
	}
}

// The names kube-proxy v1.37's own nftables tests expect
// (pkg/proxy/nftables/proxier_test.go): a wrong hash makes the benchmark's
// probe wait for a chain that never exists.
func TestKubeProxyServiceChain(t *testing.T) {
	for _, c := range []struct{ service, want string }{
		{"ns2/svc2", "service-42NFTM6N-ns2/svc2/tcp/p80"},
		{"ns3/svc3", "service-4AT6LBPK-ns3/svc3/tcp/p80"},
		{"ns5/svc5", "service-HVFWP5L3-ns5/svc5/tcp/p80"},
	} {
		if got := KubeProxyServiceChain(c.service, "TCP", "p80"); got != c.want {
			t.Errorf("KubeProxyServiceChain(%q, TCP, p80) = %q, want %q", c.service, got, c.want)
		}
	}
}
