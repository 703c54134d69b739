package stream

import (
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Defaults of the Delta budget (see Options).
const (
	DefaultTargetApplyTime = 250 * time.Millisecond
	DefaultMinDeltaOps     = 256
	DefaultMaxDeltaOps     = 50_000
	// InitialDeltaOps is a stream's budget before its agent reported a
	// usable Ack (clamped to [MinDeltaOps, MaxDeltaOps]).
	InitialDeltaOps = 4096
)

// ResourceCost estimates the kernel operations that programming r takes on
// a node that has none of it: 1 for the resource, 1 per virtual server, 1
// per real server and 1 per ipset entry (node settings: 1). It is only an
// estimate (the agent expands NodePort virtual servers per address, and an
// update touches fewer objects than a create) and bounds how much one Delta
// carries; it never decides what is sent.
func ResourceCost(r *vsplanev1.Resource) int {
	s := r.GetService()
	if s == nil {
		return 1
	}
	n := 1 + len(s.GetIpsetEntries())
	for _, vs := range s.GetVirtualServers() {
		n += 1 + len(vs.GetRealServers())
	}
	return n
}

// fit returns how many of upserts, in order, the next Delta takes and their
// cost: whole resources until the next would exceed budget, and at least
// one (a resource larger than the budget goes alone; resources are never
// split, so a node only ever holds whole resources).
func fit(upserts []Entry, budget int) (n, cost int) {
	for n < len(upserts) {
		c := ResourceCost(upserts[n].Resource)
		if n > 0 && cost+c > budget {
			break
		}
		n, cost = n+1, cost+c
	}
	return n, cost
}

// Rate samples below minRateSampleOps kernel operations are ignored: their
// apply time is mostly the agent's fixed per-Delta cost (iptables-restore,
// reading kernel state), not the rate at which it programs objects.
const (
	minRateSampleOps = 32
	// rateWeight is the EWMA weight of a new sample: a few Deltas follow a
	// change in the agent's speed, and one outlier moves the budget by a
	// quarter of the difference only.
	rateWeight = 0.25
)

// applyRate estimates one agent's kernel operations per second from its
// Acks and turns it into the kernel work the next Delta may carry: the rate
// times the target apply time, so a Delta in flight delays what comes
// after it by about target, whatever the node's speed. Pure (no clock):
// the durations are the agent's own.
type applyRate struct {
	target time.Duration
	lo, hi int
	// opsPerSec is the EWMA of samples; 0 until the first usable one.
	opsPerSec float64
}

func newApplyRate(target time.Duration, lo, hi int) *applyRate {
	return &applyRate{target: target, lo: lo, hi: hi}
}

// observe takes one Ack: ops kernel operations applied in d.
func (a *applyRate) observe(ops uint64, d time.Duration) {
	if ops < minRateSampleOps || d <= 0 {
		return
	}
	sample := float64(ops) / d.Seconds()
	if a.opsPerSec == 0 {
		a.opsPerSec = sample
		return
	}
	a.opsPerSec += rateWeight * (sample - a.opsPerSec)
}

// budget is the estimated kernel work (ResourceCost units) the next Delta
// may carry, within [lo, hi].
func (a *applyRate) budget() int {
	b := float64(InitialDeltaOps)
	if a.opsPerSec > 0 {
		b = a.opsPerSec * a.target.Seconds()
	}
	return int(max(min(b, float64(a.hi)), float64(a.lo)))
}

// kernelOps sums an Ack's kernel operations.
func kernelOps(ack *vsplanev1.Ack) uint64 {
	var n uint64
	for _, c := range ack.GetKernelOperations() {
		n += uint64(c)
	}
	return n
}
