package reconcile

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Drift probe. Outside drift is found by the full pass, every period (30 s
// by default); a flushed IPVS table (ipvsadm -C) or a destroyed or
// re-created set broke every Service of the node until then. Every
// Config.ProbeInterval (default 5 s) Run makes smaller reads instead: the
// virtual servers without their real servers (one netlink dump), the sets'
// entry counts (their headers) and the iptables fingerprints. A wanted
// virtual server gone or changed by hand (ipvsadm -C, -D, -E), a set the
// reconciler knows as right missing, a set holding another number of
// entries than the agent wrote (ipset flush, an entry deleted or added by
// hand) or an iptables fingerprint other than the last compare's (a
// flushed or edited chain; iptables.go) runs a full pass at once. A
// removed address wakes one already (addrwatch.go). What the probe cannot
// see (one server's real servers, an entry swapped for another) waits for
// the period, as before.
//
// The probe compares with what the last passes found right, not with
// every wish: a virtual server of a failed resource (its write failed, the
// Ack said so, retries run on their own schedule) and drift the pass cannot
// repair (a set of another type it does not replace) do not run a pass per
// probe. Its cost: one virtual-server dump (read without the lock, so a
// Delta does not wait for it), one set-header dump and a fingerprint per
// family (two getsockopts, or one netlink get) per interval. The virtual
// servers are listed and compared only when their digest
// (kernel.VirtualServerDigester: the same dump, nothing sorted or
// compared) differs from that of the last listing found right, or the
// agent wrote since: ~60 ms a probe at 2,000 servers in the TCG VM, most of
// a quiet agent's CPU, before.

// driftProbe is the probe's schedule and counters.
type driftProbe struct {
	next time.Time // zero: not scheduled (before the first Delta)
	// runs counts probes, hits those that found drift and whose full
	// pass has ended.
	runs, hits uint64
	// rightDigest is the kernel.DigestOf of the last listing the probe
	// compared and found right, at write generation rightGen (valid:
	// rightKnown). While the table's digest equals it and the agent wrote
	// nothing since, the next probe neither lists nor compares.
	rightDigest uint64
	rightGen    uint64
	rightKnown  bool
}

// scheduleProbe schedules the next probe after a full pass.
func (r *Reconciler) scheduleProbe() {
	r.probe.next = time.Time{}
	if r.cfg.ProbeInterval > 0 {
		r.probe.next = r.cfg.Now().Add(r.cfg.ProbeInterval)
	}
}

// probeDrift reads the virtual servers, the sets' entry counts and the
// iptables fingerprints and returns what drifted ("" for nothing). The
// virtual servers are listed without mu and compared under it only when no
// Delta or full pass ran in between; the rest is read under mu, so a
// Delta's writes cannot pass the read.
func (r *Reconciler) probeDrift() string {
	r.mu.Lock()
	if !r.full.synced {
		r.mu.Unlock()
		return ""
	}
	gen := r.writeGeneration()
	digestAgainst, checkDigest := r.probe.rightDigest, r.probe.rightKnown && r.probe.rightGen == gen
	r.mu.Unlock()
	unchanged := false
	if d, ok := r.k.IPVS.(kernel.VirtualServerDigester); ok && checkDigest {
		digest, err := d.DigestVirtualServers()
		unchanged = err == nil && digest == digestAgainst
	}
	// Listed and read right: the only listing worth comparing.
	var listed []kernel.VirtualServer
	compare := false
	if !unchanged {
		var err error
		listed, err = r.k.IPVS.ListVirtualServers()
		compare = err == nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if compare && gen == r.writeGeneration() {
		if drift := r.probeVirtualServers(listed); drift != "" {
			r.probe.rightKnown = false
			return drift
		}
		r.probe.rightDigest, r.probe.rightGen, r.probe.rightKnown = kernel.DigestOf(listed), gen, true
	}
	if drift := r.probeSets(); drift != "" {
		return drift
	}
	return r.probeRules()
}

// writeGeneration changes with every Delta applied and every full pass
// (the writes the agent makes). Caller holds mu.
func (r *Reconciler) writeGeneration() uint64 { return r.applies + r.stats.FullReconciles }

// probeVirtualServers compares listed with every wanted virtual server
// whose resources are not failed: gone, or another scheduler, flags,
// timeout or netmask than the agent programs (ipvsadm -C, -D, -E). A
// server nobody wants is the full pass's to find. Caller holds mu.
func (r *Reconciler) probeVirtualServers(listed []kernel.VirtualServer) string {
	// Reads are sorted by key (kernel.IPVS's contract): a binary search per
	// desired server, no map of the whole table at every probe.
	scheduler := r.desired.settings().defaultScheduler
	for key, owners := range r.desired.vsOwners {
		if slices.ContainsFunc(owners, r.status.isFailed) {
			continue
		}
		want, ok := r.desired.wantVS(key)
		if !ok {
			continue
		}
		i, ok := slices.BinarySearchFunc(listed, key, func(vs kernel.VirtualServer, k kernel.VirtualServerKey) int {
			return vs.Key.Compare(k)
		})
		if !ok {
			return "virtual server " + key.String() + " is gone"
		}
		if listed[i] != want.kernelVS(scheduler) {
			return "virtual server " + key.String() + " was changed"
		}
	}
	return ""
}

// probeRules compares each family's iptables fingerprint with the one of
// the last compare that found the tables right (iptables.go): a flushed
// or edited chain, or on nf_tables any ruleset change of the node, runs a
// full pass, which compares and records the fingerprint again. Caller
// holds mu.
func (r *Reconciler) probeRules() string {
	for _, fam := range r.families {
		known, ok := r.known.rulesPrint[fam]
		if !ok {
			continue
		}
		rendered, ok := r.rendered[fam]
		if !ok {
			continue
		}
		if cur, ok := fingerprint(r.k.IPTables, fam, rendered.rs.TableNames()); ok && cur != known.value {
			return "iptables (" + fam.String() + ") changed since the last compare"
		}
	}
	return ""
}

// probeSets reads every set's entry count (one header dump) and compares
// the managed sets with what the last full pass found right: a set gone
// (destroyed, or re-created under another name), or holding another number
// of entries than the agent wrote (ipset flush, an entry deleted or added
// by hand, a set re-created empty). Sets whose entries are unknown (not
// listed since the last failed pass) are only checked for presence.
// Caller holds mu.
func (r *Reconciler) probeSets() string {
	if r.known.sets == nil {
		return "" // unknown since a failed pass: the next full pass lists them
	}
	counts, err := r.k.IPSets.EntryCounts()
	if err != nil {
		return "" // a read error is the full pass's to report
	}
	for _, ref := range r.families.managedSets() {
		spec := ref.spec()
		if known, ok := r.known.sets[spec.Name]; !ok || !known.SameAs(spec) {
			// Not right at the last pass, which reported it (such a pass
			// has an error and leaves the sets unknown, so this is
			// defensive).
			continue
		}
		n, ok := counts[spec.Name]
		if !ok {
			return "ipset " + spec.Name + " is gone"
		}
		if entries, ok := r.known.setEntries[spec.Name]; ok && n >= 0 && n != len(entries) {
			return fmt.Sprintf("ipset %s holds %d entries, the agent wrote %d", spec.Name, n, len(entries))
		}
	}
	return ""
}

// runProbe runs a due probe and, when it finds drift, a full pass.
func (r *Reconciler) runProbe(ctx context.Context) {
	r.mu.Lock()
	r.probe.next = r.cfg.Now().Add(r.cfg.ProbeInterval)
	r.probe.runs++
	r.mu.Unlock()
	drift := r.probeDrift()
	if drift == "" {
		return
	}
	r.log.Info("drift probe: running a full reconcile now", zap.String("drift", drift))
	r.Reconcile(ctx)
	r.mu.Lock()
	r.probe.hits++ // after the pass: a hit counted is a drift repaired
	r.mu.Unlock()
}

// probeDue: the probe is scheduled and its time has come.
func (r *Reconciler) probeDue() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.full.synced && !r.probe.next.IsZero() && !r.cfg.Now().Before(r.probe.next)
}
