// Package reconcile is the agent's reconciler: it holds the node's desired
// state (the resources received from the control plane) and makes the
// kernel match it, like kube-proxy's IPVS proxier but incrementally.
//
//	Delta ──Apply──▶ store (resources + indexes) ──touched items──▶ kernel
//	                                     ▲                          │
//	                       Run: every period / retry backoff ───────┘ full compare
//
// Contract:
//   - Fail-static: New and Run do nothing to the kernel until the first
//     Apply. Nothing is ever flushed; items already right are not written.
//   - Apply applies only the items (virtual servers, destinations, bound
//     addresses, ipset entries) the changed resources touch, then
//     re-renders iptables and restores once per family if it changed. The
//     first Apply instead compares everything with the kernel and removes
//     what the agent owns but nobody wants (deleted while it was down).
//   - Ownership: a virtual server is the agent's when a resource wants it,
//     when it was programmed by this process, or (after the first Apply)
//     when its address is bound to kube-ipvs0. Virtual servers and bound
//     addresses inside excludeCIDRs are never deleted. The kube-proxy sets
//     (KUBE-*, KUBE-6-*) are entirely the agent's.
//   - Nothing from the wire reaches the kernel, an iptables-restore payload
//     or a log line unchecked (validate.go): a bad value is a NACK naming
//     the field and only its part is skipped; a resource with a bad name
//     or version is refused whole.
//   - A failing item fails the resources that own or touched it (NACK with
//     the kernel's message); every other item is still applied. Failed
//     resources are retried by Run with exponential backoff.
//   - Graceful drain (drain.go): a TCP real server nobody wants is kept at
//     weight 0 while it has connections, checked every DrainCheckInterval
//     and deleted when drained or after MaxDrain; UDP/SCTP ones go at once.
//     A restarted agent keeps draining the weight-0 leftovers it finds.
//   - Apply, Versions, Reconcile, CheckDrains, Draining, Stats and Status
//     are safe for concurrent use.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Config configures a Reconciler.
type Config struct {
	// Period of the full reconcile (default 30s); a non-zero
	// NodeSettings.reconcile_period_seconds overrides it.
	Period time.Duration
	// RetryBase and RetryMax bound the retry backoff of failed resources
	// (defaults min(1s, Period) and Period).
	RetryBase, RetryMax time.Duration
	// Families managed by the agent (default IPv4 only).
	Families []kernel.Family
	// Now is the clock (default time.Now); tests may replace it.
	Now func() time.Time
	// DrainCheckInterval is how often draining real servers are checked
	// for connections (default 5s; kube-proxy: 1 min).
	DrainCheckInterval time.Duration
	// MaxDrain bounds a drain: a real server still holding connections
	// this long after its drain started is deleted (default 10 min;
	// kube-proxy has no bound).
	MaxDrain time.Duration

	// Schedulers are the IPVS schedulers virtual servers and the node
	// default may name (the list the agent reports in Hello). Empty: read
	// once from the kernel (IPVS.Schedulers) at the first Apply, and again
	// at each Apply while that read fails (names are then only checked
	// for shape).
	Schedulers []string

	// maxElem overrides the hash sets' maxelem in the admission (tests).
	maxElem uint32
}

// Stats are counters for metrics and AgentStatus.
type Stats struct {
	FullReconciles    uint64
	LastFullReconcile time.Time
	// DriftRepaired counts kernel writes made by full reconciles (drift
	// repairs and retries), RepairsByKind splits them by operation kind.
	DriftRepaired uint64
	RepairsByKind map[string]uint64
	// FailedResources is the number of resources currently failed.
	FailedResources int
	// KernelErrors are the errors of the last pass no resource owns, then
	// those of the last drain check, then a failed read of the IPVS
	// schedulers (Config.Schedulers).
	KernelErrors []string
	// Draining is the number of real servers being drained.
	Draining int
	// DrainsCompleted counts drained real servers deleted once they had no
	// connections; DrainsTimedOut those deleted at MaxDrain.
	DrainsCompleted, DrainsTimedOut uint64
	// DrainOps counts kernel writes of drain housekeeping that no Ack and
	// no drift repair count reports: drain checks, and deletions of drained
	// real servers by full reconciles.
	DrainOps map[string]uint64
	// Recovered: resources a retry applied after they failed (name ->
	// version), until a Delta names them again (AgentStatus.recovered).
	Recovered map[string]string
}

type failure struct {
	version   string
	messages  []string
	retryable bool
}

// Reconciler implements the agent stream client's Applier (dataplane/client).
type Reconciler struct {
	k        kernel.Kernel
	cfg      Config
	log      *zap.Logger
	families familySet

	// tracker records the kernel writes made while a full pass reads the
	// kernel without mu (prefetch.go); fullMu serializes those passes.
	tracker *writeTracker
	fullMu  sync.Mutex

	mu      sync.Mutex
	store   *store
	synced  bool // the first delta (full desired state) arrived
	applied map[string]string
	failed  map[string]failure
	// recovered: failed resources a retry has since applied (name ->
	// version), reported in AgentStatus until a Delta names them again.
	recovered  map[string]string
	programmed map[kernel.VirtualServerKey]struct{}
	rec        record        // what the kernel holds, for incremental passes
	npAddrs    nodePortAddrs // NodePort addresses the markers are expanded over
	// refused are, per full set, the resources whose entries of it are not
	// programmed (maxelem.go).
	refused    map[setRef]map[string]bool
	lastRules  map[kernel.Family][]byte
	globalErrs []string
	retryN     int
	retryAt    time.Time
	lastFull   time.Time
	stats      Stats
	// drains are the real servers kept at weight 0 while they have
	// connections (drain.go); drainAt is the next drain check (zero: none).
	drains    map[kernel.VirtualServerKey]map[kernel.DestinationKey]*drainState
	drainAt   time.Time
	drainErrs []string

	// schedulers the kernel offers (sorted; nil: not known yet), schedErr
	// why they could not be read.
	schedulers []string
	schedErr   string

	wake chan struct{}
}

// New returns a Reconciler over k. It does not touch the kernel.
func New(k kernel.Kernel, cfg Config, log *zap.Logger) (*Reconciler, error) {
	if k.IPVS == nil || k.IPSets == nil || k.Links == nil || k.IPTables == nil || k.Sysctl == nil {
		return nil, errors.New("reconcile: every kernel subsystem is required")
	}
	if cfg.Period < 0 || cfg.RetryBase < 0 || cfg.RetryMax < 0 || cfg.DrainCheckInterval < 0 || cfg.MaxDrain < 0 {
		return nil, errors.New("reconcile: negative durations")
	}
	if cfg.DrainCheckInterval == 0 {
		cfg.DrainCheckInterval = 5 * time.Second
	}
	if cfg.MaxDrain == 0 {
		cfg.MaxDrain = 10 * time.Minute
	}
	if cfg.Period == 0 {
		cfg.Period = wire.DefaultReconcilePeriod
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase = min(time.Second, cfg.Period)
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = max(cfg.Period, cfg.RetryBase)
	}
	if cfg.RetryMax < cfg.RetryBase {
		return nil, fmt.Errorf("reconcile: RetryMax %v < RetryBase %v", cfg.RetryMax, cfg.RetryBase)
	}
	if len(cfg.Families) == 0 {
		cfg.Families = []kernel.Family{kernel.FamilyIPv4}
	}
	for _, f := range cfg.Families {
		if !f.Valid() {
			return nil, fmt.Errorf("reconcile: bad family %v", f)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = zap.NewNop()
	}
	var scheds []string
	if len(cfg.Schedulers) > 0 {
		scheds = slices.Compact(slices.Sorted(slices.Values(cfg.Schedulers)))
	}
	tracker := &writeTracker{}
	return &Reconciler{schedulers: scheds, tracker: tracker,
		k: tracker.wrap(k), cfg: cfg, log: log, families: slices.Compact(slices.Sorted(slices.Values(cfg.Families))),
		store: newStore(), applied: map[string]string{}, failed: map[string]failure{}, recovered: map[string]string{},
		programmed: map[kernel.VirtualServerKey]struct{}{}, lastRules: map[kernel.Family][]byte{},
		stats: Stats{RepairsByKind: map[string]uint64{}, DrainOps: map[string]uint64{}}, wake: make(chan struct{}, 1),
		drains:  map[kernel.VirtualServerKey]map[kernel.DestinationKey]*drainState{},
		refused: map[setRef]map[string]bool{},
	}, nil
}

// Apply applies a Delta (the stream client's Applier).
func (r *Reconciler) Apply(ctx context.Context, delta *vsplanev1.Delta) *vsplanev1.Ack {
	if delta == nil {
		// Never read a missing delta as "the node has no services".
		return &vsplanev1.Ack{Status: vsplanev1.AckStatus_ACK_STATUS_NACK,
			Errors: []*vsplanev1.ResourceError{{Message: "nil delta"}}}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	start := time.Now()
	t := newTouched()
	var changed []string
	prevSettings := r.store.settings()

	inDelta := map[string]bool{}
	var badNames []*vsplanev1.ResourceError
	r.loadSchedulers()
	comp := &compiler{families: r.families, schedulers: r.schedulers, defaultScheduler: prevSettings.defaultScheduler}
	for _, res := range delta.GetResources() {
		name := res.GetName()
		if err := checkIdentity(res); err != nil {
			// Refused whole: nothing stored, nothing applied.
			badNames = append(badNames, &vsplanev1.ResourceError{Name: name, Version: res.GetVersion(), Message: err.Error()})
			continue
		}
		rs := comp.compile(res).expand(r.npAddrs)
		_, failed := r.failed[name]
		oldApplied := !failed && r.applied[name] != ""
		old := r.store.put(name, rs)
		t.addChange(name, old, rs, oldApplied && old != nil && r.applied[name] == old.version)
		if !inDelta[name] { // appendOnce would be O(n²) on a full delta
			changed = append(changed, name)
		}
		inDelta[name] = true
	}
	removed := slices.Clone(delta.GetRemoved())
	if delta.GetReplaceAll() {
		for name := range r.store.res {
			if !inDelta[name] {
				removed = append(removed, name)
			}
		}
	}
	for _, name := range removed {
		old := r.store.put(name, nil)
		delete(r.applied, name)
		delete(r.failed, name)
		if old != nil {
			t.add(name, old)
			if !inDelta[name] {
				changed = append(changed, name)
			}
		}
	}

	p := r.newPass(ctx)
	// NodePort markers follow the node's addresses and the settings'
	// CIDRs: re-expand when either changed (reads addresses only when some
	// resource has markers).
	npNames, npOlds := r.refreshNodePort(p)
	for i, name := range npNames {
		_, failed := r.failed[name]
		t.addChange(name, npOlds[i], r.store.res[name], !failed && r.applied[name] == npOlds[i].version)
		if !inDelta[name] {
			changed = append(changed, name)
			inDelta[name] = true
		}
	}
	// Set capacity: admission may change for the sets this delta touched.
	var sets map[setRef]bool
	if r.synced {
		sets = map[setRef]bool{}
		for ek := range t.entries {
			sets[ek.set] = true
		}
	}
	for _, name := range r.touchRefusals(t, r.admit(sets)) {
		if !inDelta[name] {
			changed = append(changed, name)
			inDelta[name] = true
		}
	}
	first := !r.synced
	r.synced = true
	if first {
		r.lastFull = r.cfg.Now() // the first Apply compares everything
	}
	settingsChanged := !settingsEqual(prevSettings, p.s)
	if first || slices.Contains(changed, SettingsResource) {
		p.syncSettings()
	}
	if first {
		r.fullPass(p, nil, touchedWrites{})
	} else {
		if prevSettings.defaultScheduler != p.s.defaultScheduler {
			for key := range r.store.vsOwners {
				if _, ok := t.vss[key]; !ok {
					t.vss[key] = nil
				}
			}
		}
		if settingsChanged && !slices.Equal(prevSettings.excludeCIDRs, p.s.excludeCIDRs) {
			// Items kept only because they were excluded may now go.
			r.fullPass(p, nil, touchedWrites{})
		} else {
			r.touchedPass(p, t)
		}
	}
	// iptables depend on every resource at once: blame the changed ones.
	p.syncIPTables(first, changed)

	evaluate := changed
	if first {
		evaluate = slices.Collect(maps.Keys(r.store.res))
	} else {
		evaluate = r.recheck(t, evaluate, inDelta)
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
	r.settle(p, evaluate)
	r.scheduleDrains(r.cfg.Now(), false)
	// This Ack reports the outcome for what the Delta named.
	for _, res := range delta.GetResources() {
		delete(r.recovered, res.GetName())
	}
	for _, name := range removed {
		delete(r.recovered, name)
	}

	ack := &vsplanev1.Ack{
		Nonce:            delta.GetNonce(),
		Status:           vsplanev1.AckStatus_ACK_STATUS_ACK,
		ApplyDuration:    durationpb.New(time.Since(start)),
		KernelOperations: p.ops,
		Errors:           badNames,
	}
	slices.Sort(evaluate)
	for _, name := range evaluate {
		if f, ok := r.failed[name]; ok {
			ack.Errors = append(ack.Errors, &vsplanev1.ResourceError{Name: name, Version: f.version, Message: strings.Join(f.messages, "; ")})
		} else if _, held := r.store.res[name]; !held && len(p.errs[name]) > 0 {
			// A removal that left something behind: report it; the retry
			// (a full pass) deletes what is still owned.
			ack.Errors = append(ack.Errors, &vsplanev1.ResourceError{Name: name, Message: strings.Join(p.errs[name], "; ")})
		}
	}
	if len(ack.Errors) > 0 {
		ack.Status = vsplanev1.AckStatus_ACK_STATUS_NACK
	}
	r.log.Debug("applied delta", zap.String("nonce", delta.GetNonce()), zap.Int("changed", len(changed)),
		zap.Int("errors", len(ack.Errors)), zap.Any("ops", p.ops))
	return ack
}

// loadSchedulers reads the schedulers the kernel offers, once (see
// Config.Schedulers).
func (r *Reconciler) loadSchedulers() {
	if r.schedulers != nil {
		return
	}
	list, err := r.k.IPVS.Schedulers()
	if err != nil {
		r.schedErr = fmt.Sprintf("list IPVS schedulers: %v (scheduler names only checked for shape)", err)
		r.log.Warn("cannot list IPVS schedulers; scheduler names only checked for shape", zap.Error(err))
		return
	}
	r.schedErr = ""
	r.schedulers = slices.Compact(slices.Sorted(slices.Values(list)))
	if r.schedulers == nil {
		r.schedulers = []string{}
	}
}

func settingsEqual(a, b settings) bool {
	return a.defaultScheduler == b.defaultScheduler && a.timeouts == b.timeouts && a.strictARP == b.strictARP &&
		a.masqueradeAll == b.masqueradeAll && a.masqueradeBit == b.masqueradeBit &&
		slices.Equal(a.clusterCIDRs, b.clusterCIDRs) && slices.Equal(a.excludeCIDRs, b.excludeCIDRs) &&
		slices.Equal(a.nodePortCIDRs, b.nodePortCIDRs) && a.reconcilePeriod == b.reconcilePeriod &&
		a.nodeDeleting == b.nodeDeleting
}

// recheck adds to evaluate the other owners of touched virtual servers
// whose outcome may depend on them (NodePort collisions): resources that
// share a key, or that failed on content. Resources waiting for a retry of
// a kernel error are left to that retry.
func (r *Reconciler) recheck(t *touched, evaluate []string, in map[string]bool) []string {
	for key := range t.vss {
		owners := r.store.vsOwners[key]
		for _, o := range owners {
			if in[o] {
				continue
			}
			f, failed := r.failed[o]
			if (len(owners) > 1 && !failed) || (failed && !f.retryable) {
				in[o] = true
				evaluate = append(evaluate, o)
			}
		}
	}
	return evaluate
}

// touchedPass applies only the touched items.
func (r *Reconciler) touchedPass(p *pass, t *touched) {
	p.ensureSets()
	if n := len(t.vss); n >= listThreshold && n*4 >= len(r.programmed) {
		// Touching a large share of the table: one dump is cheaper than
		// one get per server (a burst of new Services).
		p.listVirtualServers()
	}
	for _, key := range sortedKeys(t.vss, kernel.VirtualServerKey.Compare) {
		p.syncVS(key, t.vss[key])
	}
	p.listed, p.listedDests = nil, nil
	p.flushIPVS()
	for _, a := range sortedKeys(t.addrs, func(a, b netipAddr) int { return a.Compare(b) }) {
		p.syncAddr(a, t.addrs[a])
	}
	p.syncEntries(t.entries)
	p.flushWrites()
}

// fullPass compares everything the agent owns with the kernel. It lists
// every table and so refreshes the record incremental passes rely on; what
// read (taken before the lock, may be nil) holds that is still current is
// not listed again.
func (r *Reconciler) fullPass(p *pass, read *kernelRead, since touchedWrites) {
	r.forget()
	read.use(p, since)
	p.ensureSets()
	if err := p.loadBound(); err != nil {
		p.fail(nil, "list addresses of "+kernel.DummyDevice, err)
	}
	keys := map[kernel.VirtualServerKey][]string{}
	for key := range r.store.vsOwners {
		keys[key] = nil
	}
	for key := range r.programmed {
		keys[key] = nil
	}
	listed := p.listed
	if listed == nil {
		listed = p.listVirtualServers()
	}
	for key := range listed {
		if key.FWMark == 0 && r.rec.bound[key.Address] && !p.excluded(key.Address) {
			keys[key] = nil
		}
	}
	for _, key := range sortedKeys(keys, kernel.VirtualServerKey.Compare) {
		p.syncVS(key, nil)
	}
	p.listed, p.listedDests = nil, nil
	p.flushIPVS()
	addrs := map[netipAddr][]string{}
	for a := range r.store.addrVS {
		addrs[a] = nil
	}
	for a := range r.rec.bound {
		addrs[a] = nil
	}
	for _, a := range sortedKeys(addrs, func(a, b netipAddr) int { return a.Compare(b) }) {
		p.syncAddr(a, nil)
	}
	// The entries below are read from the record the writes update.
	p.flushWrites()
	entries := map[entryKey][]string{}
	for ek := range r.store.entryRefs {
		entries[ek] = nil
	}
	for _, ref := range r.managedSets() {
		have, err := p.loadEntries(ref)
		if err != nil {
			p.fail(p.setUsers(ref), "list ipset "+ref.name(), err)
			continue
		}
		for e := range have {
			entries[entryKey{set: ref, entry: e}] = nil
		}
	}
	p.syncEntries(entries)
	p.flushWrites()
}

// forget drops the record of kernel state: the next pass lists again.
func (r *Reconciler) forget() {
	r.rec = record{setEntries: map[string]map[kernel.Entry]bool{}}
}

// settle records the outcome of each evaluated resource and schedules a
// retry when something retryable failed.
func (r *Reconciler) settle(p *pass, evaluate []string) {
	// Every phase flushes its writes; this only guards the outcome.
	p.flushIPVS()
	p.flushWrites()
	if len(p.errs) > 0 || len(p.global) > 0 {
		// A failed or partial write leaves the kernel unknown: list again
		// rather than trust the record.
		r.forget()
	}
	for _, name := range evaluate {
		rs, ok := r.store.res[name]
		if !ok {
			continue
		}
		msgs := append(slices.Clone(rs.problems), r.store.conflicts(rs)...)
		msgs = append(msgs, r.refusals(rs)...)
		msgs = capMessages(append(msgs, p.errs[name]...))
		if len(msgs) == 0 {
			r.applied[name] = rs.version
			if _, was := r.failed[name]; was {
				r.recovered[name] = rs.version
			}
			delete(r.failed, name)
			continue
		}
		delete(r.recovered, name)
		delete(r.applied, name)
		r.failed[name] = failure{version: rs.version, messages: msgs, retryable: len(p.errs[name]) > 0}
	}
	r.globalErrs = p.global
	for _, name := range sortedKeys(p.errs, strings.Compare) {
		if _, ok := r.store.res[name]; !ok {
			for _, m := range p.errs[name] {
				r.globalErrs = append(r.globalErrs, name+" (removed): "+m)
			}
		}
	}
	retry := len(r.globalErrs) > 0
	for _, f := range r.failed {
		retry = retry || f.retryable
	}
	if !retry {
		r.retryN, r.retryAt = 0, time.Time{}
		return
	}
	d := r.cfg.RetryBase << min(r.retryN, 20)
	if d > r.cfg.RetryMax || d <= 0 {
		d = r.cfg.RetryMax
	}
	r.retryN++
	r.retryAt = r.cfg.Now().Add(d)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Versions returns the resources applied successfully (the stream client's Applier).
func (r *Reconciler) Versions() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.applied)
}

// Failed returns name -> error message of the resources currently failed.
func (r *Reconciler) Failed() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.failed))
	for name, f := range r.failed {
		out[name] = strings.Join(f.messages, "; ")
	}
	return out
}

// Reconcile compares all desired state with the kernel now, repairs what
// differs and retries failed resources. Before the first Apply it does
// nothing (fail-static). It reads the kernel's tables before taking the
// lock Apply needs (prefetch.go), so a Delta waits only for the comparison
// and the repairs.
func (r *Reconciler) Reconcile(ctx context.Context) {
	r.fullMu.Lock() // one read-then-compare at a time: they share r.tracker
	defer r.fullMu.Unlock()
	r.mu.Lock()
	synced := r.synced
	r.mu.Unlock()
	if !synced {
		return
	}
	start := time.Now()
	r.tracker.start()
	read := r.readKernel(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	since := r.tracker.stop()
	locked := time.Now()
	defer func() {
		r.log.Debug("full reconcile", zap.Duration("read", locked.Sub(start)), zap.Duration("locked", time.Since(locked)),
			zap.Int("writtenMeanwhile", len(since.vs)+len(since.sets)))
	}()
	p := r.newPass(ctx)
	p.syncSettings()
	r.refreshNodePort(p) // the full pass compares everything anyway
	r.admit(nil)
	r.fullPass(p, read, since)
	p.syncIPTables(true, nil)
	r.settle(p, slices.Collect(maps.Keys(r.store.res)))
	now := r.cfg.Now()
	r.scheduleDrains(now, false)
	r.lastFull = now
	r.stats.FullReconciles++
	r.stats.LastFullReconcile = now
	repaired := map[string]uint32{}
	for op, n := range p.ops {
		if d := p.drainOps[op]; d > 0 {
			r.stats.DrainOps[op] += uint64(d)
			n -= d
		}
		if n > 0 {
			repaired[op] = n
			r.stats.DriftRepaired += uint64(n)
			r.stats.RepairsByKind[op] += uint64(n)
		}
	}
	if len(repaired) > 0 {
		r.log.Info("full reconcile repaired drift", zap.Any("ops", repaired))
	}
}

// Stats returns a copy of the counters.
func (r *Reconciler) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.statsLocked()
}

func (r *Reconciler) statsLocked() Stats {
	s := r.stats
	s.RepairsByKind = maps.Clone(r.stats.RepairsByKind)
	s.FailedResources = len(r.failed)
	s.KernelErrors = append(slices.Clone(r.globalErrs), r.drainErrs...)
	if r.schedErr != "" {
		s.KernelErrors = append(s.KernelErrors, r.schedErr)
	}
	s.Draining = r.drainCount()
	s.DrainOps = maps.Clone(r.stats.DrainOps)
	s.Recovered = maps.Clone(r.recovered)
	return s
}

// Status renders Stats and the drain list as an AgentStatus.
func (r *Reconciler) Status() *vsplanev1.AgentStatus {
	r.mu.Lock()
	s, drains := r.statsLocked(), r.draining()
	r.mu.Unlock()
	st := &vsplanev1.AgentStatus{DriftRepaired: uint32(min(s.DriftRepaired, 1<<32-1)), KernelErrors: s.KernelErrors,
		Draining: drainProto(drains)}
	if len(s.Recovered) > 0 {
		st.Recovered = s.Recovered
	}
	if !s.LastFullReconcile.IsZero() {
		st.LastFullReconcile = timestamppb.New(s.LastFullReconcile)
	}
	return st
}

// period is the effective full-reconcile period.
func (r *Reconciler) period() time.Duration {
	if p := r.store.settings().reconcilePeriod; p > 0 {
		return secs(p)
	}
	return r.cfg.Period
}

// nextWake returns how long Run should sleep.
func (r *Reconciler) nextWake() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	if !r.synced {
		return r.period()
	}
	next := r.lastFull.Add(r.period())
	if !r.retryAt.IsZero() && r.retryAt.Before(next) {
		next = r.retryAt
	}
	if !r.drainAt.IsZero() && r.drainAt.Before(next) {
		next = r.drainAt
	}
	return max(next.Sub(now), 0)
}

// Run runs the periodic full reconcile (and retries) until ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	for {
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
		if r.drainDue() {
			r.CheckDrains(ctx)
		}
	}
}

// Start runs Run in a goroutine.
func (r *Reconciler) Start(ctx context.Context) { go func() { _ = r.Run(ctx) }() }

func (r *Reconciler) due() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Now()
	return r.synced && (!now.Before(r.lastFull.Add(r.period())) || (!r.retryAt.IsZero() && !now.Before(r.retryAt)))
}

func (r *Reconciler) drainDue() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.drainAt.IsZero() && !r.cfg.Now().Before(r.drainAt)
}
