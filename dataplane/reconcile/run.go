package reconcile

import (
	"context"
	"time"
)

// Run is the loop that runs, without a Delta, what is due: the periodic
// full reconcile or a retry (both Reconcile, full.go) and the drain check
// (CheckDrains, drain.go), a full reconcile soon after a wanted address
// was removed (addrwatch.go), and the drift probe (probe.go). It sleeps until the earliest
// deadline; Apply, the drains and AddressRemoved wake it.

// Run runs the periodic full reconcile (and retries) until ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	for {
		r.takeRemovals()
		timer := time.NewTimer(r.nextWake())
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-r.wake:
			timer.Stop()
			continue
		case <-timer.C:
		}
		if r.due() {
			r.Reconcile(ctx)
		}
		if r.probeDue() {
			r.runProbe(ctx)
		}
		if r.drainDue() {
			r.CheckDrains(ctx)
		}
	}
}

// Start runs Run in a goroutine.
func (r *Reconciler) Start(ctx context.Context) { go func() { _ = r.Run(ctx) }() }

// wakeRun tells Run that a deadline moved.
func (r *Reconciler) wakeRun() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// nextWake returns how long Run should sleep.
func (r *Reconciler) nextWake() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	if !r.full.synced {
		return r.period()
	}
	next := r.full.last.Add(r.period())
	if !r.retry.at.IsZero() && r.retry.at.Before(next) {
		next = r.retry.at
	}
	if !r.drains.next.IsZero() && r.drains.next.Before(next) {
		next = r.drains.next
	}
	if !r.full.soon.IsZero() && r.full.soon.Before(next) {
		next = r.full.soon
	}
	if !r.probe.next.IsZero() && r.probe.next.Before(next) {
		next = r.probe.next
	}
	return max(next.Sub(now), 0)
}

// due: a full reconcile is due (its period passed, or a retry is due).
func (r *Reconciler) due() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	soon := !r.full.soon.IsZero() && !now.Before(r.full.soon)
	return r.full.synced && (!now.Before(r.full.last.Add(r.period())) || r.retry.due(now) || soon)
}

func (r *Reconciler) drainDue() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.drains.next.IsZero() && !r.cfg.Now().Before(r.drains.next)
}
