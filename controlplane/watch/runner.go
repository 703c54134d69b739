package watch

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// runner runs fn like kube-proxy's BoundedFrequencyRunner: on request; at
// least every maxInterval (a periodic run); and again after retryInterval
// when fn fails. Unlike it, the gap it enforces between two runs adapts to
// their cost: busyFactor times the previous run's duration, at most
// minInterval. A cheap run (an idle control plane, one change) lets the
// next change go out at once; expensive runs (a burst on a large cluster)
// coalesce up to minInterval, so at most 1/busyFactor of the time is spent
// running while changes keep coming.
type runner struct {
	fn              func(periodic bool) error
	min, max, retry time.Duration
	clk             clock.Clock
	req             chan struct{}
	onIdle          func() // test hook: the loop is about to wait
}

// busyFactor: see runner.
const busyFactor = 4

func newRunner(fn func(periodic bool) error, min, max, retry time.Duration, clk clock.Clock) *runner {
	return &runner{fn: fn, min: min, max: max, retry: retry, clk: clk, req: make(chan struct{}, 1)}
}

// Run requests a run; requests made while one is pending coalesce.
func (r *runner) Run() {
	select {
	case r.req <- struct{}{}:
	default:
	}
}

// loop runs until ctx is done.
func (r *runner) loop(ctx context.Context) {
	var last time.Time // zero: the first request runs at once
	var gap time.Duration
	lastAttempt := r.clk.Now()
	timer := r.clk.NewTimer(r.max)
	defer timer.Stop()
	reset := func(d time.Duration) {
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
		timer.Reset(d)
	}
	for {
		if r.onIdle != nil {
			r.onIdle()
		}
		select {
		case <-ctx.Done():
			return
		case <-r.req:
		case <-timer.C():
			// Periodic, min-interval wait or retry: all mean "run now if allowed".
		}
		now := r.clk.Now()
		if !last.IsZero() {
			if wait := last.Add(gap).Sub(now); wait > 0 {
				reset(wait)
				continue
			}
		}
		periodic := now.Sub(lastAttempt) >= r.max
		last, lastAttempt = now, now
		err := r.fn(periodic)
		gap = min(r.min, busyFactor*r.clk.Since(now))
		if err != nil {
			reset(max(r.retry, r.min))
			continue
		}
		reset(r.max)
	}
}
