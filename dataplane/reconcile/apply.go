package reconcile

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/vsplane/vsplane/dataplane/kernel"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Incremental apply. Apply stores a Delta and writes only the kernel
// objects the changed resources touch (in their old and new content):
//
//	storeDelta            validate + compile each resource, store it (or
//	                      remove it), note what it touches
//	touchNodePortChanges  re-expand NodePort markers when the node's
//	                      addresses changed
//	touchAdmissionChanges resources let into or out of a full ipset
//	syncChanges           sync the touched objects (the first Delta, or a
//	                      change of exclude_cidrs: everything, full.go)
//	syncIPTables          iptables, when the rendering changed
//	sweepStaleFlows       stale conntrack entries of the UDP and SCTP
//	                      virtual servers written (every one on the first Delta)
//	toEvaluate            the resources whose outcome may have changed
//	recordOutcomes        applied / failed per resource (status.go)
//	ack                   the Ack: NACKs of what the Delta named

// Apply applies a Delta (the stream client's Applier).
func (r *Reconciler) Apply(ctx context.Context, delta *vsplanev1.Delta) *vsplanev1.Ack {
	if delta == nil {
		// Never read a missing delta as "the node has no services".
		return &vsplanev1.Ack{Status: vsplanev1.AckStatus_ACK_STATUS_NACK,
			Errors: []*vsplanev1.ResourceError{{Message: "nil delta"}}}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applies++
	start := time.Now()
	prev := r.desired.settings()
	c := r.storeDelta(delta, prev.defaultScheduler)
	p := r.newPass(ctx)
	r.touchNodePortChanges(p, c)
	r.touchAdmissionChanges(c)
	first := !r.full.synced
	r.full.synced = true
	if first {
		r.full.last = r.cfg.Now() // the first Apply compares everything
	}
	r.syncChanges(p, c, prev, first)
	// iptables depend on every resource at once: blame the changed ones.
	p.syncIPTables(first, c.names)
	r.sweepStaleFlows(p, first)
	evaluate := r.toEvaluate(p, c, first)
	r.recordOutcomes(p, evaluate)
	r.scheduleDrains(r.cfg.Now(), false)
	// This Ack reports the outcome for what the Delta named.
	for _, res := range delta.GetResources() {
		delete(r.status.recovered, res.GetName())
	}
	for _, name := range c.removed {
		delete(r.status.recovered, name)
	}
	ack := r.ack(delta, start, p, c.refused, evaluate)
	r.log.Debug("applied delta", zap.String("nonce", delta.GetNonce()), zap.Int("changed", len(c.names)),
		zap.Int("errors", len(ack.Errors)), zap.Any("ops", p.ops))
	return ack
}

// deltaChanges is what storing a Delta changed.
type deltaChanges struct {
	// names are the changed resources, each once, in the order first
	// changed; named is the same as a set (toEvaluate then adds the
	// co-owners it evaluates too).
	names []string
	named map[string]bool
	// removed are the names the Delta removed (listed, or left out of a
	// replace_all Delta).
	removed []string
	// refused are the resources with a bad name or version: nothing of
	// them is stored.
	refused []*vsplanev1.ResourceError
	// touched are the kernel objects to sync, with the changed resources
	// that touched each.
	touched *touched
}

func (c *deltaChanges) add(name string) {
	if !c.named[name] { // a list search would be O(n²) on a full delta
		c.named[name] = true
		c.names = append(c.names, name)
	}
}

// storeDelta validates and compiles the Delta's resources, stores them and
// removes what it removes. defaultScheduler is the one in force.
func (r *Reconciler) storeDelta(delta *vsplanev1.Delta, defaultScheduler string) *deltaChanges {
	c := &deltaChanges{named: map[string]bool{}, touched: newTouched()}
	r.schedulers.load(r.k.IPVS, r.log)
	comp := &compiler{families: r.families, schedulers: r.schedulers.names, defaultScheduler: defaultScheduler}
	// A name given twice is ambiguous: neither is applied, and what was
	// applied before stays (a ReplaceAll Delta does not remove it either).
	times := map[string]int{}
	for _, res := range delta.GetResources() {
		times[res.GetName()]++
	}
	keep := map[string]bool{}
	for _, res := range delta.GetResources() {
		name := res.GetName()
		if n := times[name]; n > 1 {
			if !keep[name] {
				keep[name] = true
				c.refused = append(c.refused, &vsplanev1.ResourceError{Name: name, Version: res.GetVersion(),
					Message: fmt.Sprintf("named %d times in one Delta: none applied, what was applied before stays", n)})
			}
			continue
		}
		if err := checkIdentity(res); err != nil {
			// Refused whole: nothing stored, nothing applied.
			c.refused = append(c.refused, &vsplanev1.ResourceError{Name: name, Version: res.GetVersion(), Message: err.Error()})
			continue
		}
		rs := comp.compile(res).expand(r.nodePort, r.marks)
		applied := r.status.applied[name]
		old := r.desired.put(name, rs)
		c.touched.addChange(name, old, rs, old != nil && applied != "" && r.status.wasApplied(name, old.version))
		c.add(name)
	}
	c.removed = slices.Clone(delta.GetRemoved())
	if delta.GetReplaceAll() {
		for name := range r.desired.res {
			if !c.named[name] && !keep[name] {
				c.removed = append(c.removed, name)
			}
		}
	}
	for _, name := range c.removed {
		old := r.desired.put(name, nil)
		r.marks.keep(name, nil)
		r.status.remove(name)
		if old != nil {
			c.touched.add(name, old)
			c.add(name)
		}
	}
	return c
}

// touchNodePortChanges re-expands the NodePort markers when the node's
// addresses or the settings' CIDRs changed (it reads the addresses only
// when some resource has markers) and touches what differs.
func (r *Reconciler) touchNodePortChanges(p *pass, c *deltaChanges) {
	names, olds := r.refreshNodePort(p)
	for i, name := range names {
		c.touched.addChange(name, olds[i], r.desired.res[name], r.status.wasApplied(name, olds[i].version))
		c.add(name)
	}
}

// touchAdmissionChanges recomputes the set capacity admission for the sets
// the Delta touched (every set on the first Delta) and touches the entries
// of the resources let in or out.
func (r *Reconciler) touchAdmissionChanges(c *deltaChanges) {
	var sets map[setRef]bool
	if r.full.synced {
		sets = map[setRef]bool{}
		for ek := range c.touched.entries {
			sets[ek.set] = true
		}
	}
	for _, name := range c.touched.touchAdmissionChanges(r.desired, r.admission.update(r.desired, sets)) {
		c.add(name)
	}
}

// syncChanges writes the kernel: the node settings when they changed, then
// the touched objects; everything on the first Delta and when
// exclude_cidrs changed (items kept only because they were excluded may
// now go).
func (r *Reconciler) syncChanges(p *pass, c *deltaChanges, prev settings, first bool) {
	if first || c.named[SettingsResource] {
		p.syncNodeSettings()
	}
	if !first && prev.defaultScheduler != p.s.defaultScheduler {
		// Every virtual server without a scheduler of its own changes (and
		// the outcome of their other owners may: toEvaluate).
		for key := range r.desired.vsOwners {
			if _, ok := c.touched.vss[key]; !ok {
				c.touched.vss[key] = nil
			}
		}
	}
	if first || !slices.Equal(prev.excludeCIDRs, p.s.excludeCIDRs) {
		r.syncAll(p, nil, writesDuringRead{})
		return
	}
	r.syncTouched(p, c.touched)
}

// syncTouched syncs only the touched objects.
func (r *Reconciler) syncTouched(p *pass, t *touched) {
	p.ensureSets()
	if n := len(t.vss); n >= listThreshold && n*4 >= len(r.known.programmed) {
		// Touching a large share of the table: one dump is cheaper than
		// one get per server (a burst of new Services).
		p.listVirtualServers()
	}
	for _, key := range sortedKeys(t.vss, kernel.VirtualServerKey.Compare) {
		p.syncVS(key, t.vss[key])
	}
	p.listed, p.listedDests = nil, nil
	p.flushIPVS()
	for _, a := range sortedKeys(t.addrs, netipAddr.Compare) {
		p.syncAddr(a, t.addrs[a])
	}
	p.syncEntries(t.entries)
	p.flushWrites()
}

// toEvaluate returns the resources whose outcome this Apply records: every
// resource after the first Delta; otherwise the changed ones, the other
// owners of touched virtual servers (addCoOwners) and every resource the
// pass blamed.
func (r *Reconciler) toEvaluate(p *pass, c *deltaChanges, first bool) []string {
	evaluate := c.names
	if first {
		evaluate = slices.Collect(maps.Keys(r.desired.res))
	} else {
		evaluate = r.addCoOwners(c.touched, evaluate, c.named)
	}
	if len(p.errs) > 0 {
		seen := make(map[string]bool, len(evaluate))
		for _, name := range evaluate {
			seen[name] = true
		}
		for name := range p.errs {
			if !seen[name] {
				evaluate = append(evaluate, name)
			}
		}
	}
	return evaluate
}

// addCoOwners adds to evaluate the other owners of touched virtual servers
// whose outcome may depend on them (NodePort collisions): resources that
// share a key, or that failed on content. Resources waiting for a retry of
// a kernel error are left to that retry. in holds the names already in
// evaluate and is updated.
func (r *Reconciler) addCoOwners(t *touched, evaluate []string, in map[string]bool) []string {
	for key := range t.vss {
		owners := r.desired.vsOwners[key]
		for _, o := range owners {
			if in[o] {
				continue
			}
			f, failed := r.status.failed[o]
			if (len(owners) > 1 && !failed) || (failed && !f.retryable) {
				in[o] = true
				evaluate = append(evaluate, o)
			}
		}
	}
	return evaluate
}

// ack is the Ack of delta: the refused resources, then each evaluated
// resource that failed, and each removed one whose removal left something
// behind (the retry, a full pass, deletes what is still owned).
func (r *Reconciler) ack(delta *vsplanev1.Delta, start time.Time, p *pass, refused []*vsplanev1.ResourceError, evaluate []string) *vsplanev1.Ack {
	ack := &vsplanev1.Ack{
		Nonce:            delta.GetNonce(),
		Status:           vsplanev1.AckStatus_ACK_STATUS_ACK,
		ApplyDuration:    durationpb.New(time.Since(start)),
		KernelOperations: p.ops,
		Errors:           refused,
	}
	slices.Sort(evaluate)
	for _, name := range evaluate {
		if f, ok := r.status.failed[name]; ok {
			ack.Errors = append(ack.Errors, &vsplanev1.ResourceError{Name: name, Version: f.version, Message: strings.Join(f.messages, "; ")})
		} else if _, held := r.desired.res[name]; !held && len(p.errs[name]) > 0 {
			ack.Errors = append(ack.Errors, &vsplanev1.ResourceError{Name: name, Message: strings.Join(p.errs[name], "; ")})
		}
	}
	if len(ack.Errors) > 0 {
		ack.Status = vsplanev1.AckStatus_ACK_STATUS_NACK
	}
	return ack
}

// schedulerList is the IPVS schedulers the kernel offers (sorted; nil: not
// known yet) and, while they cannot be read, why.
type schedulerList struct {
	names []string
	err   string
}

// load reads the schedulers the kernel offers, once (see
// Config.Schedulers).
func (s *schedulerList) load(ipvs kernel.IPVS, log *zap.Logger) {
	if s.names != nil {
		return
	}
	list, err := ipvs.Schedulers()
	if err != nil {
		s.err = fmt.Sprintf("list IPVS schedulers: %v (scheduler names only checked for shape)", err)
		log.Warn("cannot list IPVS schedulers; scheduler names only checked for shape", zap.Error(err))
		return
	}
	s.err = ""
	s.names = slices.Compact(slices.Sorted(slices.Values(list)))
	if s.names == nil {
		s.names = []string{}
	}
}

// touched collects what a change may affect, and which changed resources
// touched each item (errors on an item are reported against them).
type touched struct {
	vss     map[kernel.VirtualServerKey][]string
	addrs   map[netip.Addr][]string
	entries map[entryKey][]string
}

func newTouched() *touched {
	return &touched{
		vss:     map[kernel.VirtualServerKey][]string{},
		addrs:   map[netip.Addr][]string{},
		entries: map[entryKey][]string{},
	}
}

// add records every item of rs (nil is fine) as touched by name.
func (t *touched) add(name string, rs *resourceState) {
	if rs == nil {
		return
	}
	for _, d := range rs.vss {
		key := d.vs.Key
		t.vss[key] = appendOnce(t.vss[key], name)
		t.addrs[key.Address] = appendOnce(t.addrs[key.Address], name)
	}
	for _, e := range rs.entries {
		t.entries[e] = appendOnce(t.entries[e], name)
	}
}

// addChange records what differs between old and cur of resource name.
// Items both versions want identically are skipped: old was applied
// successfully, so they are already right (drift is the full pass's job).
// Without a trusted old (nil, or it had failed) everything is touched.
func (t *touched) addChange(name string, old, cur *resourceState, oldApplied bool) {
	if old == nil || cur == nil || !oldApplied {
		t.add(name, old)
		t.add(name, cur)
		return
	}
	touchVS := func(key kernel.VirtualServerKey, addr bool) {
		t.vss[key] = appendOnce(t.vss[key], name)
		if addr {
			t.addrs[key.Address] = appendOnce(t.addrs[key.Address], name)
		}
	}
	for _, o := range old.vss {
		key := o.vs.Key
		c, ok := cur.vss.get(key)
		switch {
		case !ok:
			touchVS(key, true)
		case !sameVS(o, c):
			touchVS(key, o.binding != c.binding)
		}
	}
	for _, c := range cur.vss {
		if !old.vss.has(c.vs.Key) {
			touchVS(c.vs.Key, true)
		}
	}
	oldEntries := make(map[entryKey]bool, len(old.entries))
	for _, e := range old.entries {
		oldEntries[e] = true
	}
	for _, e := range cur.entries {
		if !oldEntries[e] {
			t.entries[e] = appendOnce(t.entries[e], name)
		}
		delete(oldEntries, e)
	}
	for e := range oldEntries {
		t.entries[e] = appendOnce(t.entries[e], name)
	}
}

func sameVS(a, b desiredVS) bool {
	return a.vs == b.vs && a.binding == b.binding && a.nodePort == b.nodePort && a.reject == b.reject &&
		slices.Equal(a.dests, b.dests)
}
