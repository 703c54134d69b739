package reconcile

import "time"

// Retries. A pass that leaves a resource failed on a kernel error, or an
// error no resource owns, arms a retry: Run runs a full reconcile (full.go)
// when it is due, RetryBase after the first such pass, doubling with each
// consecutive one up to RetryMax. A pass with nothing to retry resets the
// backoff. Content errors are not retried: they end when the content
// changes.

// retryBackoff is when the next retry is due.
type retryBackoff struct {
	base, max time.Duration // Config.RetryBase, Config.RetryMax
	n         int           // consecutive passes that left something to retry
	at        time.Time     // when the retry is due (zero: none)
}

// arm schedules the next retry after now, one step of backoff later than
// the last.
func (b *retryBackoff) arm(now time.Time) {
	d := b.base << min(b.n, 20)
	if d > b.max || d <= 0 {
		d = b.max
	}
	b.n++
	b.at = now.Add(d)
}

func (b *retryBackoff) reset() { b.n, b.at = 0, time.Time{} }

// due: a retry is armed and its time has come.
func (b *retryBackoff) due(now time.Time) bool { return !b.at.IsZero() && !now.Before(b.at) }

// scheduleRetry arms a retry (and wakes Run) when the outcomes just
// recorded have something to retry, and resets the backoff otherwise.
func (r *Reconciler) scheduleRetry() {
	if !r.status.retryable() {
		r.retry.reset()
		return
	}
	r.retry.arm(r.cfg.Now())
	r.wakeRun()
}
