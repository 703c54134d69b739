package reconcile

import (
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Removed addresses. With a kernel that reports addresses removed from its
// interfaces (kernel.AddressWatcher), the agent hands each one to
// AddressRemoved; when a Service address the desired state binds went (`ip
// addr del` on kube-ipvs0, the device deleted, or an UNLESS_LOCAL address
// leaving the interface that held it), a full reconcile runs within
// removalDelay instead of at the end of the period: kube-proxy leaves such
// drift, and the Service's traffic, to its next sync. The agent's own
// unbinds are reported too; they remove addresses no longer desired, which
// are ignored.

const (
	// removalDelay gathers the removals of one command (`ip addr flush`
	// sends one event per address) into one full reconcile.
	removalDelay = 50 * time.Millisecond
	// removalMinInterval keeps full reconciles this far apart at least,
	// however often someone removes an address.
	removalMinInterval = time.Second
	// maxNotedRemovals bounds the addresses held between two looks (24
	// bytes each; the agent's own unbinds of a mass deletion come this
	// way); more count as missed: one full reconcile.
	maxNotedRemovals = 1 << 16
)

// removalNotes are the removals reported since Run last looked.
type removalNotes struct {
	mu     sync.Mutex
	addrs  []netip.Addr
	missed bool // the watch may have missed some (the zero Addr), or too many
}

// AddressRemoved notes that addr was removed from an interface (the zero
// Addr: removals may have been missed) and wakes Run. It does not block on
// an Apply or a full reconcile in progress.
func (r *Reconciler) AddressRemoved(addr netip.Addr) {
	n := &r.removals
	n.mu.Lock()
	if !addr.IsValid() || len(n.addrs) >= maxNotedRemovals {
		n.missed = true
	} else {
		n.addrs = append(n.addrs, addr.Unmap())
	}
	n.mu.Unlock()
	r.wakeRun()
}

// takeRemovals (Run) schedules a full reconcile when a noted removal took
// an address the desired state binds.
func (r *Reconciler) takeRemovals() {
	n := &r.removals
	n.mu.Lock()
	addrs, missed := n.addrs, n.missed
	n.addrs, n.missed = nil, false
	n.mu.Unlock()
	if len(addrs) == 0 && !missed {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full.synced {
		return // fail-static: the first Delta compares everything
	}
	var wanted []netip.Addr
	for _, a := range addrs {
		if always, unlessLocal := r.desired.bindings(a); always || unlessLocal {
			wanted = append(wanted, a)
		}
	}
	if len(wanted) == 0 && !missed {
		return
	}
	at := r.cfg.Now().Add(removalDelay)
	if earliest := r.full.last.Add(removalMinInterval); at.Before(earliest) {
		at = earliest
	}
	if r.full.soon.IsZero() || at.Before(r.full.soon) {
		r.full.soon = at
	}
	r.log.Info("a Service address was removed from its interface: full reconcile",
		zap.Stringers("addresses", wanted), zap.Bool("removalsMissed", missed), zap.Time("at", r.full.soon))
}
