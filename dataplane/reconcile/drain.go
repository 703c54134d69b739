package reconcile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vsplane/vsplane/dataplane/kernel"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Graceful drain (kube-proxy's graceful termination, pkg/proxy/ipvs):
//
//   - A real server that leaves the desired state of a TCP (or fwmark)
//     virtual server is set to weight 0 and kept while
//     ActiveConn+InactiveConn > 0; with no connections it is deleted at
//     once. UDP and SCTP real servers are deleted at once, like kube-proxy
//     (conntrack/expire_nodest_conn drop their flows).
//   - Draining real servers are checked every DrainCheckInterval (kube-proxy:
//     1 min) and deleted when their connections reach 0 or, unlike
//     kube-proxy (no bound, stale real servers forever), when MaxDrain has
//     passed since the drain started.
//   - An endpoint that comes back while draining gets its weight back with
//     one update; kube-proxy deletes and re-adds it, which drops its
//     connections' destination.
//   - A restarted agent knows nothing of earlier drains: its first (full)
//     pass finds the weight-0 real servers nobody wants and, since they
//     still have connections, keeps draining them (since = first seen by
//     this process). Wanted real servers are compared like any other and
//     never reset (kubernetes#92019).
//   - The drain state lives only here: full and incremental passes go
//     through removeDestination, which keeps a draining real server at
//     weight 0 and deletes it only when it is drained or timed out.

// Drain is one real server being drained.
type Drain struct {
	VirtualServer kernel.VirtualServerKey
	RealServer    kernel.DestinationKey
	// Since is when this process first set or saw it draining.
	Since time.Time
	// ActiveConn and InactiveConn are the kernel's counters at the last
	// check.
	ActiveConn, InactiveConn uint32
}

type drainState struct {
	since            time.Time
	active, inactive uint32
}

// gracefulProto reports whether real servers of a virtual server with this
// protocol are drained rather than deleted (kube-proxy: all but UDP and
// SCTP; fwmark servers have no protocol and drain).
func gracefulProto(p kernel.Protocol) bool {
	return p != kernel.ProtocolUDP && p != kernel.ProtocolSCTP
}

// removeDestination takes a real server that nobody wants out of a
// virtual server: delete it at once (UDP, SCTP, no connections), or keep
// it at weight 0 while it has connections, up to MaxDrain.
func (p *pass) removeDestination(key kernel.VirtualServerKey, d kernel.Destination, names []string) {
	r := p.r
	dk := d.Key()
	ds := r.drains[key][dk]
	graceful := gracefulProto(key.Protocol)
	conns := uint64(d.ActiveConn) + uint64(d.InactiveConn)
	now := r.cfg.Now()
	switch {
	case !graceful || conns == 0:
		if p.deleteDestination(key, dk, names, ds != nil) && ds != nil {
			r.stats.DrainsCompleted++
			r.log.Info("drained real server deleted", zap.Stringer("vs", key), zap.Stringer("rs", dk),
				zap.Duration("after", now.Sub(ds.since)))
		}
	case ds != nil && now.Sub(ds.since) >= r.cfg.MaxDrain:
		if p.deleteDestination(key, dk, names, true) {
			r.stats.DrainsTimedOut++
			r.log.Warn("real server deleted with connections after the maximum drain time", zap.Stringer("vs", key),
				zap.Stringer("rs", dk), zap.Duration("max_drain", r.cfg.MaxDrain),
				zap.Uint32("active", d.ActiveConn), zap.Uint32("inactive", d.InactiveConn))
		}
	default:
		if d.Weight != 0 {
			p.count(OpUpdateDestination)
			d.Weight = 0
			if err := r.k.IPVS.UpdateDestination(key, d); err != nil {
				p.fail(names, fmt.Sprintf("ipvs drain destination %v -> %v (weight 0)", key, dk), err)
				return // not draining yet; the retry tries again
			}
		}
		if ds == nil {
			ds = &drainState{since: now}
			m := r.drains[key]
			if m == nil {
				m = map[kernel.DestinationKey]*drainState{}
				r.drains[key] = m
			}
			m[dk] = ds
			r.log.Info("draining real server", zap.Stringer("vs", key), zap.Stringer("rs", dk),
				zap.Uint32("active", d.ActiveConn), zap.Uint32("inactive", d.InactiveConn))
		}
		ds.active, ds.inactive = d.ActiveConn, d.InactiveConn
	}
}

// deleteDestination deletes a real server and forgets its drain. drain
// marks the delete as the end of a drain, not new work (see countDrain).
func (p *pass) deleteDestination(key kernel.VirtualServerKey, dk kernel.DestinationKey, names []string, drain bool) bool {
	p.count(OpDeleteDestination)
	if drain {
		p.countDrain(OpDeleteDestination)
	}
	if err := p.r.k.IPVS.DeleteDestination(key, dk); err != nil && !errors.Is(err, kernel.ErrNotFound) {
		p.fail(names, fmt.Sprintf("ipvs delete destination %v -> %v", key, dk), err)
		return false
	}
	p.r.untrack(key, dk)
	return true
}

// countDrain marks an operation already counted by count as drain
// housekeeping, so a full reconcile does not report it as drift repair.
func (p *pass) countDrain(op string) {
	if p.drainOps == nil {
		p.drainOps = map[string]uint32{}
	}
	p.drainOps[op]++
}

// untrack forgets the drain of one real server (wanted again or deleted).
func (r *Reconciler) untrack(key kernel.VirtualServerKey, dk kernel.DestinationKey) {
	m := r.drains[key]
	if m == nil {
		return
	}
	delete(m, dk)
	if len(m) == 0 {
		delete(r.drains, key)
	}
}

// scheduleDrains arms the drain check when something drains and disarms
// it when nothing does: the next check is one interval after the last (or
// after the first drain started), or earlier when a drain reaches MaxDrain
// before that, so the bound holds to the clock, not to the interval. Run
// is woken to pick up a new deadline. O(draining real servers).
func (r *Reconciler) scheduleDrains(now time.Time, checked bool) {
	if len(r.drains) == 0 {
		r.drainAt = time.Time{}
		return
	}
	next := r.drainAt
	if checked || next.IsZero() {
		next = now.Add(r.cfg.DrainCheckInterval)
	}
	for _, m := range r.drains {
		for _, ds := range m {
			if end := ds.since.Add(r.cfg.MaxDrain); end.Before(next) {
				next = end
			}
		}
	}
	if next.Equal(r.drainAt) {
		return
	}
	r.drainAt = next
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// CheckDrains checks every draining real server now: those without
// connections, or draining for longer than MaxDrain, are deleted. It lists
// only the destinations of virtual servers with a draining real server, so
// it costs nothing when nothing drains. Run calls it every
// DrainCheckInterval while something drains.
func (r *Reconciler) CheckDrains(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checkDrains(ctx)
}

func (r *Reconciler) checkDrains(ctx context.Context) {
	if len(r.drains) == 0 {
		r.drainErrs = nil
		r.drainAt = time.Time{}
		return
	}
	p := r.newPass(ctx)
	for _, key := range sortedKeys(r.drains, kernel.VirtualServerKey.Compare) {
		r.checkVS(p, key)
	}
	for op, n := range p.ops {
		r.stats.DrainOps[op] += uint64(n)
	}
	// Errors are kept for Stats (never only logged); the next check retries.
	r.drainErrs = slices.Clone(p.global)
	for _, name := range sortedKeys(p.errs, strings.Compare) {
		for _, m := range p.errs[name] {
			r.drainErrs = append(r.drainErrs, name+": "+m)
		}
	}
	if len(p.ops) > 0 || len(r.drainErrs) > 0 {
		r.log.Debug("drain check", zap.Any("ops", p.ops), zap.Strings("errors", r.drainErrs), zap.Int("draining", r.drainCount()))
	}
	r.scheduleDrains(r.cfg.Now(), true)
}

func (r *Reconciler) checkVS(p *pass, key kernel.VirtualServerKey) {
	names := r.store.vsOwners[key]
	list, err := r.k.IPVS.ListDestinations(key)
	if errors.Is(err, kernel.ErrNotFound) {
		delete(r.drains, key) // the virtual server and its real servers are gone
		return
	}
	if err != nil {
		p.fail(names, "ipvs list destinations "+key.String(), err)
		return
	}
	have := make(map[kernel.DestinationKey]kernel.Destination, len(list))
	for _, d := range list {
		have[d.Key()] = d
	}
	wanted := map[kernel.DestinationKey]bool{}
	if want, ok := r.store.wantVS(key); ok {
		for _, d := range want.dests {
			wanted[d.Key()] = true
		}
	}
	for _, dk := range sortedKeys(r.drains[key], kernel.DestinationKey.Compare) {
		d, ok := have[dk]
		switch {
		case !ok: // deleted by someone else: nothing left to drain
			r.untrack(key, dk)
		case wanted[dk]: // passes restore wanted ones; never delete them here
			r.untrack(key, dk)
		default:
			p.removeDestination(key, d, names)
		}
	}
}

func (r *Reconciler) drainCount() int {
	n := 0
	for _, m := range r.drains {
		n += len(m)
	}
	return n
}

// Draining returns the real servers being drained, sorted by virtual
// server and real server.
func (r *Reconciler) Draining() []Drain {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.draining()
}

func (r *Reconciler) draining() []Drain {
	out := make([]Drain, 0, r.drainCount())
	for _, key := range sortedKeys(r.drains, kernel.VirtualServerKey.Compare) {
		m := r.drains[key]
		for _, dk := range slices.SortedFunc(maps.Keys(m), kernel.DestinationKey.Compare) {
			ds := m[dk]
			out = append(out, Drain{VirtualServer: key, RealServer: dk, Since: ds.since,
				ActiveConn: ds.active, InactiveConn: ds.inactive})
		}
	}
	return out
}

func drainProto(ds []Drain) []*vsplanev1.DrainingRealServer {
	out := make([]*vsplanev1.DrainingRealServer, 0, len(ds))
	for _, d := range ds {
		out = append(out, &vsplanev1.DrainingRealServer{
			VirtualServer:       d.VirtualServer.String(),
			Address:             d.RealServer.Address.String(),
			Port:                uint32(d.RealServer.Port),
			Since:               timestamppb.New(d.Since),
			ActiveConnections:   d.ActiveConn,
			InactiveConnections: d.InactiveConn,
		})
	}
	return out
}
