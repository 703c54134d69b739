package watch

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

type runRecord struct {
	at       time.Time
	periodic bool
}

// harness drives a runner on a fake clock; idle receives a value each time
// the loop is about to wait.
type harness struct {
	t    *testing.T
	clk  *clocktesting.FakeClock
	r    *runner
	runs chan runRecord
	idle chan struct{}
	fail chan error
	// runTime is how long each run takes on the fake clock.
	runTime time.Duration
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, clk: clocktesting.NewFakeClock(time.Unix(1000, 0)),
		runs: make(chan runRecord, 10), idle: make(chan struct{}, 100), fail: make(chan error, 10)}
	h.r = newRunner(func(periodic bool) error {
		h.runs <- runRecord{h.clk.Now(), periodic}
		h.clk.Step(h.runTime)
		select {
		case err := <-h.fail:
			return err
		default:
			return nil
		}
	}, 100*time.Millisecond, time.Hour, time.Second, h.clk)
	h.r.onIdle = func() { h.idle <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.r.loop(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	h.waitIdle()
	return h
}

func (h *harness) waitIdle() {
	h.t.Helper()
	select {
	case <-h.idle:
	case <-time.After(10 * time.Second):
		h.t.Fatal("runner never went idle")
	}
}

func (h *harness) expectRun(periodic bool) runRecord {
	h.t.Helper()
	select {
	case r := <-h.runs:
		if r.periodic != periodic {
			h.t.Fatalf("run periodic=%v, want %v", r.periodic, periodic)
		}
		h.waitIdle()
		return r
	case <-time.After(10 * time.Second):
		h.t.Fatal("no run")
	}
	return runRecord{}
}

func (h *harness) expectNoRun() {
	h.t.Helper()
	select {
	case r := <-h.runs:
		h.t.Fatalf("unexpected run at %v", r.at)
	default:
	}
}

func TestRunnerMinInterval(t *testing.T) {
	h := newHarness(t)
	h.runTime = 30 * time.Millisecond // 4 x 30 ms > MinInterval: coalesce for all of it
	h.r.Run()
	first := h.expectRun(false) // first request runs at once

	// Requests within the min interval wait for it, and coalesce.
	h.r.Run()
	h.waitIdle()
	h.r.Run()
	h.waitIdle()
	h.expectNoRun()
	h.clk.Step(69 * time.Millisecond) // the run itself took 30
	h.expectNoRun()                   // nothing ran: the timer is not due yet (checked after the step's timer sweep)
	h.clk.Step(time.Millisecond)
	second := h.expectRun(false)
	if d := second.at.Sub(first.at); d != 100*time.Millisecond {
		t.Fatalf("second run after %v", d)
	}
	h.expectNoRun()
}

func TestRunnerPeriodicAndRetry(t *testing.T) {
	h := newHarness(t)
	h.clk.Step(time.Hour)
	h.expectRun(true) // nothing requested for MaxInterval: periodic run

	h.fail <- errors.New("boom")
	h.r.Run()
	h.clk.Step(100 * time.Millisecond)
	h.expectRun(false) // fails
	h.clk.Step(999 * time.Millisecond)
	h.expectNoRun()
	h.clk.Step(time.Millisecond)
	h.expectRun(false) // retried after RetryInterval
}

// A cheap run does not hold the next change for MinInterval: the gap is
// busyFactor times the run's duration.
func TestRunnerAdaptiveGap(t *testing.T) {
	h := newHarness(t)
	h.runTime = 2 * time.Millisecond
	h.r.Run()
	first := h.expectRun(false)
	h.r.Run()
	h.waitIdle()
	h.expectNoRun()
	h.clk.Step(5 * time.Millisecond) // 2 ms run + 5 ms: before the 8 ms gap
	h.expectNoRun()
	h.clk.Step(time.Millisecond)
	second := h.expectRun(false)
	if d := second.at.Sub(first.at); d != 4*h.runTime {
		t.Fatalf("second run %v after the first, want %v (busyFactor x run time)", d, 4*h.runTime)
	}
	// A change long after a cheap run goes at once.
	h.clk.Step(time.Second) // no timer is due: the loop stays waiting
	h.r.Run()
	third := h.expectRun(false)
	if d := third.at.Sub(second.at); d != time.Second+h.runTime {
		t.Fatalf("idle request ran %v after the previous run, want at once", d)
	}
}
