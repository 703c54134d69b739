package reconcile

import (
	"context"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Full reconcile. The first Apply and then Run, every period (default
// 30 s, NodeSettings.reconcile_period_seconds) and when a retry is due,
// compare everything the agent owns with the kernel: every table is
// listed, so what is known of the kernel (known.go) is reloaded; drift is
// repaired, what the agent owns but nobody wants is removed (each object
// kind's Prune), failed resources are retried and every resource's outcome
// is recorded again. The kernel is read before the lock is taken
// (prefetch.go), so a Delta waits only for the comparison and the writes.

// fullSchedule is when full reconciles run.
type fullSchedule struct {
	synced bool      // the first Delta (the full desired state) arrived
	last   time.Time // the last full reconcile (or the first Apply)
	// soon: a wanted address was removed, a full reconcile is due then
	// (zero: none; addrwatch.go).
	soon time.Time
}

// period is the effective full-reconcile period.
func (r *Reconciler) period() time.Duration {
	if p := r.desired.settings().reconcilePeriod; p > 0 {
		return secs(p)
	}
	return r.cfg.Period
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
	synced := r.full.synced
	r.full.soon = time.Time{} // this pass reads what was removed before it
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
			zap.Int("writtenMeanwhile", len(since.vs)+len(since.sets)),
			zap.Int("servers", len(read.vs)), zap.Int("dumpedServers", read.dumped))
	}()
	p := r.newPass(ctx)
	p.syncNodeSettings()
	r.refreshNodePort(p) // the full pass compares everything anyway
	r.admission.update(r.desired, nil)
	r.syncAll(p, read, since)
	p.syncIPTables(true, nil)
	r.sweepStaleFlows(p, true)
	r.recordOutcomes(p, slices.Collect(maps.Keys(r.desired.res)))
	now := r.cfg.Now()
	r.scheduleDrains(now, false)
	r.full.last = now
	r.stats.FullReconciles++
	r.stats.LastFullReconcile = now
	r.countRepairs(p)
}

// countRepairs counts the writes of a full reconcile as drift repairs,
// except those that ended a drain (housekeeping).
func (r *Reconciler) countRepairs(p *pass) {
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

// syncAll compares everything the agent owns with the kernel: Update or
// Delete of every wanted object and Prune of every owned one nobody wants.
// It lists every table and so reloads what is known of the kernel; what
// read (taken before the lock, may be nil) holds that is still current is
// not listed again.
func (r *Reconciler) syncAll(p *pass, read *kernelRead, since writesDuringRead) {
	r.known.invalidate()
	read.use(p, since)
	p.ensureSets()
	if err := p.loadBound(); err != nil {
		p.fail(nil, "list addresses of "+kernel.DummyDevice, err)
	}
	keys := p.virtualServersToCompare()
	for _, key := range sortedKeys(keys, kernel.VirtualServerKey.Compare) {
		p.syncVS(key, nil)
	}
	p.listed, p.listedDests = nil, nil
	p.flushIPVS()
	r.scheduleProbe()
	addrs := p.addressesToCompare()
	for _, a := range sortedKeys(addrs, netipAddr.Compare) {
		p.syncAddr(a, nil)
	}
	// The entries below are read from what the writes just updated.
	p.flushWrites()
	p.syncAllEntries()
	p.flushWrites()
}
