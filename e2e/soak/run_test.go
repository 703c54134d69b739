package soak

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParams(t *testing.T) {
	k := Knobs{Duration: "SOAK_TEST_DURATION", Seed: "SOAK_TEST_SEED", Report: "SOAK_TEST_REPORT"}
	def := Defaults{Duration: 150 * time.Second, Seed: 7, Report: "_out/x"}
	d, seed, dir, err := Params(k, def)
	if err != nil || d != def.Duration || seed != 7 || dir != "_out/x" {
		t.Fatalf("defaults: %v %d %q %v", d, seed, dir, err)
	}
	t.Setenv(k.Duration, "5m")
	t.Setenv(k.Seed, "42")
	t.Setenv(k.Report, "bench/results")
	if d, seed, dir, err = Params(k, def); err != nil || d != 5*time.Minute || seed != 42 || dir != "bench/results" {
		t.Fatalf("given: %v %d %q %v", d, seed, dir, err)
	}
	for _, bad := range [][2]string{{k.Duration, "30s"}, {k.Duration, "soon"}, {k.Seed, "-1"}} {
		t.Run(bad[0]+"="+bad[1], func(t *testing.T) {
			t.Setenv(bad[0], bad[1])
			if _, _, _, err := Params(k, def); err == nil || !strings.Contains(err.Error(), bad[0]) {
				t.Fatalf("want an error naming %s, got %v", bad[0], err)
			}
		})
	}
}

// TestRunFaults: faults run in order, not before their offsets; one that
// did not converge is a violation, and so is the context's end before a
// fault (the rest are not run).
func TestRunFaults(t *testing.T) {
	start := time.Now()
	since := func() time.Duration { return time.Since(start) }
	plan := []Fault{{Seq: 1, At: 20 * time.Millisecond, Kind: AgentKill}, {Seq: 2, At: 30 * time.Millisecond, Kind: DriftIPVSFlush},
		{Seq: 3, At: time.Hour, Kind: ReplicaKill}}
	ctx, cancel := context.WithCancel(context.Background())
	var violations []string
	violate := func(what, format string, args ...any) {
		violations = append(violations, what+": "+fmt.Sprintf(format, args...))
	}
	inject := func(f Fault) FaultResult {
		if since() < f.At {
			t.Errorf("%v injected at %v", f, since())
		}
		res := FaultResult{Fault: f, Started: since()}
		if f.Seq == 2 {
			res.Err = "kernel differs"
			cancel() // the soak's time runs out before fault 3
		}
		return res
	}
	got := RunFaults(ctx, plan, since, inject, violate, t.Logf)
	if len(got) != 2 || got[0].Seq != 1 || got[1].Seq != 2 {
		t.Fatalf("ran %v", got)
	}
	if len(violations) != 2 || !strings.HasPrefix(violations[0], "not converged: #2") || !strings.HasPrefix(violations[1], "deadline: ") {
		t.Fatalf("violations %q", violations)
	}
}

func TestAwaitConverged(t *testing.T) {
	calls := 0
	took, err := AwaitConverged(context.Background(), Fault{Kind: "final"}, time.Minute, time.Millisecond, func(context.Context) error {
		if calls++; calls < 3 {
			return errors.New("node1: 2 resources not acknowledged")
		}
		return nil
	}, t.Logf)
	if err != nil || calls != 3 || took <= 0 {
		t.Fatalf("converging on the third check: %v after %d calls, took %v", err, calls, took)
	}
	answers := []string{"a", "b", "b", "c", "d"}
	calls = 0
	_, err = AwaitConverged(context.Background(), Fault{Seq: 9, Kind: AgentKill}, 50*time.Millisecond, time.Millisecond, func(context.Context) error {
		calls++
		return errors.New(answers[min(calls-1, len(answers)-1)])
	}, t.Logf)
	if err == nil {
		t.Fatal("a check that never passes converged")
	}
	for _, want := range []string{"#9", "distinct answers", "x] a", "[2x] b", "x] c"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q not in %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "] d") {
		t.Errorf("more than the first three answers: %v", err)
	}
}

// TestAwaitConvergedSaysWhatItWaitedOn: a slow convergence is logged with
// the answers it waited through; WithExtra checks extra only after check.
func TestAwaitConvergedSaysWhatItWaitedOn(t *testing.T) {
	defer func(d time.Duration) { SlowConvergence = d }(SlowConvergence)
	SlowConvergence = 0
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }
	checks, extras := 0, 0
	check := func(context.Context) error {
		if checks++; checks < 2 {
			return errors.New("node1: agent not connected")
		}
		return nil
	}
	extra := func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("extra called without a deadline")
		}
		if extras++; extras < 2 {
			return errors.New("agent has not logged it")
		}
		return nil
	}
	if _, err := AwaitConverged(context.Background(), Fault{Seq: 4, Kind: AgentStateCorrupt}, time.Minute, time.Millisecond,
		WithExtra(check, extra, time.Second), logf); err != nil {
		t.Fatal(err)
	}
	if checks != 3 || extras != 2 {
		t.Errorf("%d checks, %d extras; want 3, 2 (extra only once check passes)", checks, extras)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "#4") || !strings.Contains(logged[0], "[1x] node1: agent not connected") ||
		!strings.Contains(logged[0], "[1x] agent has not logged it") {
		t.Errorf("logged %q", logged)
	}
	if c := WithExtra(check, nil, time.Second); c == nil {
		t.Error("WithExtra without extra is nil")
	}
}
