package flowlog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJudge(t *testing.T) {
	log := strings.Join([]string{
		"0 steady ok pod-x from 1.2.3.4:5",
		"50 steady ok pod-x from 1.2.3.4:5",
		"garbage line",
		"100 replaced ok pod-x from 1.2.3.4:5", // stale: x was replaced
		"150 replaced fail read answer: i/o timeout",
		"400 replaced ok pod-y from 1.2.3.4:5",
		"450 replaced fail read answer: i/o timeout", // one stray loss
		"700 replaced ok pod-y from 1.2.3.4:5",
		"750 gone fail a", "800 gone fail b", "850 gone fail c",
		"900 stuck ok pod-y x", "950 stuck fail a", "1000 stuck fail b", "1050 stuck fail c",
	}, "\n")
	a := Parse(log)
	if len(a) != 14 {
		t.Fatalf("parsed %d attempts, want 14: %+v", len(a), a)
	}
	cases := []struct {
		phase    string
		expected []string
		want     Verdict
	}{
		{"steady", []string{"pod-x"}, Verdict{Attempts: 2, Recovered: true}},
		{"replaced", []string{"pod-y"}, Verdict{Attempts: 5, Lost: 2, Stale: 1, Recovered: true, RecoveryMS: 300}},
		{"replaced", []string{"pod-x", "pod-y"}, Verdict{Attempts: 5, Lost: 2, Recovered: true}},
		{"gone", []string{"pod-y"}, Verdict{Attempts: 3, Lost: 3}},
		{"stuck", []string{"pod-y"}, Verdict{Attempts: 4, Lost: 3}},
		{"absent", []string{"pod-y"}, Verdict{}},
	}
	for _, c := range cases {
		got := Judge(a, c.phase, c.expected...)
		got.Last = ""
		if got != c.want {
			t.Errorf("Judge(%s, %v) = %+v, want %+v", c.phase, c.expected, got, c.want)
		}
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	phase, stop := filepath.Join(dir, "phase"), filepath.Join(dir, "stop")
	if err := os.WriteFile(phase, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	n := 0
	attempt := func(context.Context) (string, error) {
		n++
		switch n {
		case 2:
			return "", errors.New("read answer:\n timeout")
		case 3:
			if err := os.WriteFile(phase, []byte("two"), 0o644); err != nil {
				t.Fatal(err)
			}
		case 5:
			if err := os.WriteFile(stop, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return "pod-a from x", nil
	}
	if err := Run(context.Background(), Options{PhaseFile: phase, StopFile: stop, Max: 100}, attempt, &b); err != nil {
		t.Fatal(err)
	}
	got := Parse(b.String())
	var phases []string
	for _, a := range got {
		phases = append(phases, a.Phase)
	}
	if strings.Join(phases, ",") != "one,one,one,two,two" || got[1].OK || got[1].Text != "read answer: timeout" || got[0].Backend != "pod-a" {
		t.Fatalf("attempts %+v", got)
	}
	if err := Run(context.Background(), Options{StopFile: stop, Max: 1}, attempt, &b); err == nil {
		t.Fatal("Run without a phase file: no error")
	}
}
