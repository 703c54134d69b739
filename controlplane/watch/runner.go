package watch

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// runner runs fn like kube-proxy's BoundedFrequencyRunner: on request, but
// never more often than minInterval; at least every maxInterval (a periodic
// run); and again after retryInterval when fn fails.
type runner struct {
	fn              func(periodic bool) error
	min, max, retry time.Duration
	clk             clock.Clock
	req             chan struct{}
	onIdle          func() // test hook: the loop is about to wait
}

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
			if wait := last.Add(r.min).Sub(now); wait > 0 {
				reset(wait)
				continue
			}
		}
		periodic := now.Sub(lastAttempt) >= r.max
		last, lastAttempt = now, now
		if err := r.fn(periodic); err != nil {
			reset(max(r.retry, r.min))
			continue
		}
		reset(r.max)
	}
}
