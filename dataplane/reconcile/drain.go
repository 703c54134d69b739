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
	"github.com/vsplane/vsplane/internal/wire"
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

// drainSet is the real servers kept at weight 0 while they have
// connections, and the schedule of their checks.
type drainSet struct {
	byVS map[kernel.VirtualServerKey]map[kernel.DestinationKey]*drainState
	// next is when the next drain check is due (zero: none); errs are the
	// errors of the last check (for Stats: never only logged).
	next time.Time
	errs []string
	// interval and max are Config.DrainCheckInterval and Config.MaxDrain.
	interval, max time.Duration
	// completed and timedOut count the drains that ended (Stats).
	completed, timedOut uint64
}

func newDrainSet(interval, max time.Duration) drainSet {
	return drainSet{byVS: map[kernel.VirtualServerKey]map[kernel.DestinationKey]*drainState{}, interval: interval, max: max}
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
	drains := p.drains
	dk := d.Key()
	ds := drains.byVS[key][dk]
	graceful := gracefulProto(key.Protocol)
	conns := uint64(d.ActiveConn) + uint64(d.InactiveConn)
	now := p.now()
	switch {
	case !graceful || conns == 0:
		if p.deleteDestination(key, dk, names, ds != nil) && ds != nil {
			drains.completed++
			p.log.Info("drained real server deleted", zap.Stringer("vs", key), zap.Stringer("rs", dk),
				zap.Duration("after", now.Sub(ds.since)))
		}
	case ds != nil && now.Sub(ds.since) >= drains.max:
		if p.deleteDestination(key, dk, names, true) {
			drains.timedOut++
			p.log.Warn("real server deleted with connections after the maximum drain time", zap.Stringer("vs", key),
				zap.Stringer("rs", dk), zap.Duration("max_drain", drains.max),
				zap.Uint32("active", d.ActiveConn), zap.Uint32("inactive", d.InactiveConn))
		}
	default:
		if d.Weight != 0 {
			p.count(wire.OpUpdateDestination)
			d.Weight = 0
			if err := p.ipvsNow(kernel.IPVSOp{Kind: kernel.UpdateDestination, Server: kernel.VirtualServer{Key: key}, Destination: d}); err != nil {
				p.fail(names, fmt.Sprintf("ipvs drain destination %v -> %v (weight 0)", key, dk), err)
				return // not draining yet; the retry tries again
			}
		}
		if ds == nil {
			ds = drains.start(key, dk, now)
			p.log.Info("draining real server", zap.Stringer("vs", key), zap.Stringer("rs", dk),
				zap.Uint32("active", d.ActiveConn), zap.Uint32("inactive", d.InactiveConn))
		}
		ds.active, ds.inactive = d.ActiveConn, d.InactiveConn
	}
}

// deleteDestination deletes a real server and forgets its drain. drain
// marks the delete as the end of a drain, not new work (see countDrain).
func (p *pass) deleteDestination(key kernel.VirtualServerKey, dk kernel.DestinationKey, names []string, drain bool) bool {
	p.count(wire.OpDeleteDestination)
	if drain {
		p.countDrain(wire.OpDeleteDestination)
	}
	del := kernel.IPVSOp{Kind: kernel.DeleteDestination, Server: kernel.VirtualServer{Key: key},
		Destination: kernel.Destination{Address: dk.Address, Port: dk.Port}}
	if err := p.ipvsNow(del); err != nil && !errors.Is(err, kernel.ErrNotFound) {
		p.fail(names, fmt.Sprintf("ipvs delete destination %v -> %v", key, dk), err)
		return false
	}
	p.drains.stop(key, dk)
	return true
}

// ipvsNow writes one op at once, as a batch of one: a drain's writes (weight
// 0, the delete that ends it) are not queued with the pass's other IPVS
// writes, because what follows them (the drain's state, its log line)
// depends on their outcome.
func (p *pass) ipvsNow(op kernel.IPVSOp) error { return p.k.IPVS.Apply([]kernel.IPVSOp{op})[0] }

// countDrain marks an operation already counted by count as drain
// housekeeping, so a full reconcile does not report it as drift repair.
func (p *pass) countDrain(op string) {
	if p.drainOps == nil {
		p.drainOps = map[string]uint32{}
	}
	p.drainOps[op]++
}

// start records that dk of key drains from now on.
func (s *drainSet) start(key kernel.VirtualServerKey, dk kernel.DestinationKey, now time.Time) *drainState {
	ds := &drainState{since: now}
	m := s.byVS[key]
	if m == nil {
		m = map[kernel.DestinationKey]*drainState{}
		s.byVS[key] = m
	}
	m[dk] = ds
	return ds
}

// stop forgets the drain of one real server (wanted again or deleted).
func (s *drainSet) stop(key kernel.VirtualServerKey, dk kernel.DestinationKey) {
	m := s.byVS[key]
	if m == nil {
		return
	}
	delete(m, dk)
	if len(m) == 0 {
		delete(s.byVS, key)
	}
}

// schedule arms the drain check when something drains and disarms it
// when nothing does: the next check is one interval after the last
// (checked) or after the first drain started, or earlier when a drain
// reaches its maximum before that, so the bound holds to the clock, not to
// the interval. It reports whether the deadline moved (Run must pick it
// up); disarming does not count. O(draining real servers).
func (s *drainSet) schedule(now time.Time, checked bool) bool {
	if len(s.byVS) == 0 {
		s.next = time.Time{}
		return false
	}
	next := s.next
	if checked || next.IsZero() {
		next = now.Add(s.interval)
	}
	for _, m := range s.byVS {
		for _, ds := range m {
			if end := ds.since.Add(s.max); end.Before(next) {
				next = end
			}
		}
	}
	if next.Equal(s.next) {
		return false
	}
	s.next = next
	return true
}

// scheduleDrains schedules the next drain check and wakes Run when its
// deadline moved.
func (r *Reconciler) scheduleDrains(now time.Time, checked bool) {
	if r.drains.schedule(now, checked) {
		r.wakeRun()
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
	if len(r.drains.byVS) == 0 {
		r.drains.errs = nil
		r.drains.next = time.Time{}
		return
	}
	p := r.newPass(ctx)
	for _, key := range sortedKeys(r.drains.byVS, kernel.VirtualServerKey.Compare) {
		p.checkDrainsOf(key)
	}
	for op, n := range p.ops {
		r.stats.DrainOps[op] += uint64(n)
	}
	// Errors are kept for Stats (never only logged); the next check retries.
	r.drains.errs = slices.Clone(p.unowned)
	for _, name := range sortedKeys(p.errs, strings.Compare) {
		for _, m := range p.errs[name] {
			r.drains.errs = append(r.drains.errs, name+": "+m)
		}
	}
	if len(p.ops) > 0 || len(r.drains.errs) > 0 {
		r.log.Debug("drain check", zap.Any("ops", p.ops), zap.Strings("errors", r.drains.errs), zap.Int("draining", r.drains.count()))
	}
	r.scheduleDrains(r.cfg.Now(), true)
}

// checkDrainsOf checks the draining real servers of key.
func (p *pass) checkDrainsOf(key kernel.VirtualServerKey) {
	names := p.desired.vsOwners[key]
	list, err := p.k.IPVS.ListDestinations(key)
	if errors.Is(err, kernel.ErrNotFound) {
		delete(p.drains.byVS, key) // the virtual server and its real servers are gone
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
	if want, ok := p.desired.wantVS(key); ok {
		for _, d := range want.dests {
			wanted[d.Key()] = true
		}
	}
	for _, dk := range sortedKeys(p.drains.byVS[key], kernel.DestinationKey.Compare) {
		d, ok := have[dk]
		switch {
		case !ok: // deleted by someone else: nothing left to drain
			p.drains.stop(key, dk)
		case wanted[dk]: // passes restore wanted ones; never delete them here
			p.drains.stop(key, dk)
		default:
			p.removeDestination(key, d, names)
		}
	}
}

func (s *drainSet) count() int {
	n := 0
	for _, m := range s.byVS {
		n += len(m)
	}
	return n
}

// Draining returns the real servers being drained, sorted by virtual
// server and real server.
func (r *Reconciler) Draining() []Drain {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drains.list()
}

// list returns the draining real servers, sorted.
func (s *drainSet) list() []Drain {
	out := make([]Drain, 0, s.count())
	for _, key := range sortedKeys(s.byVS, kernel.VirtualServerKey.Compare) {
		m := s.byVS[key]
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
