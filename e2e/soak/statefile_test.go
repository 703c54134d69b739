package soak

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestTearScript: the torn file keeps its first half and ends in garbage;
// with no state file the script fails (a fault that did nothing must not
// pass as done).
func TestTearScript(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("sh", "-c", TearScript(dir)).CombinedOutput(); err == nil {
		t.Fatalf("no state file, and the script passed: %s", out)
	}
	orig := bytes.Repeat([]byte("0123456789"), 100)
	path := filepath.Join(dir, StateFileName)
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-c", TearScript(dir)).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, orig[:len(orig)/2]...), "soak\377\377\377garbage"...)
	if !bytes.Equal(got, want) {
		t.Errorf("torn file = %q, want %q", got, want)
	}
}

func TestParseSaveFailures(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int
		ok   bool
	}{
		{"# HELP x\nvsplane_agent_state_save_failures_total 3\ngo_goroutines 12\n", 3, true},
		{"vsplane_agent_state_save_failures_total 0\n", 0, true},
		{"vsplane_agent_state_save_failures_total_other 5\n", 0, false},
		{"vsplane_agent_state_save_failures_total x\n", 0, false},
		{"", 0, false},
	} {
		got, err := ParseSaveFailures(tc.text)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSaveFailures(%q) = %d, %v; want %d, ok %v", tc.text, got, err, tc.want, tc.ok)
		}
	}
}
