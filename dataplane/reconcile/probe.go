package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Drift probe. Outside drift is found by the full pass, every period (30 s
// by default); a flushed IPVS table (ipvsadm -C) or a destroyed or
// re-created set broke every Service of the node until then. Every
// Config.ProbeInterval (default 5 s) Run makes small reads instead: one
// sentinel virtual server, which the last full pass left in the kernel and
// something still wants, and the sets' entry counts (their headers). When
// the sentinel is gone, a set the reconciler knows as right is missing, or
// a set holds another number of entries than the agent wrote (ipset flush,
// an entry deleted or added by hand), a full pass runs at once; so does an iptables fingerprint other than the
// last compare's (a flushed or edited chain; iptables.go). A removed
// address wakes one already (addrwatch.go). What the probe cannot see (one
// server's real servers, an entry swapped for another) waits for the
// period, as before.
//
// The probe compares with what the last full pass found, not with the
// desired state: drift the pass cannot repair (a set of another type it
// does not replace) is reported by that pass and does not run a pass per
// probe. Its cost: one netlink get, one set-header dump and a fingerprint
// per family (two getsockopts per table, or one netlink get) per interval;
// in the TCG test bed about 6 ms of CPU per probe at 1k Services.

// driftProbe is the probe's schedule and its sentinel.
type driftProbe struct {
	next     time.Time               // zero: not scheduled (before the first Delta)
	sentinel kernel.VirtualServerKey // zero: none (no wanted server was left in place)
	// runs counts probes, hits those that found drift and whose full
	// pass has ended.
	runs, hits uint64
}

// chooseSentinel picks, after a full comparison of keys, the first wanted
// server whose owners had no error in p: it is in the kernel now. It
// schedules the next probe.
func (r *Reconciler) chooseSentinel(p *pass, keys map[kernel.VirtualServerKey][]string) {
	r.probe.next = time.Time{}
	if r.cfg.ProbeInterval > 0 {
		r.probe.next = r.cfg.Now().Add(r.cfg.ProbeInterval)
	}
	r.probe.sentinel = kernel.VirtualServerKey{}
	for _, key := range sortedKeys(keys, kernel.VirtualServerKey.Compare) {
		owners := r.desired.vsOwners[key]
		if len(owners) > 0 && !slices.ContainsFunc(owners, func(n string) bool { return len(p.errs[n]) > 0 }) {
			r.probe.sentinel = key
			return
		}
	}
}

// probeDrift reads the sentinel, the sets' entry counts and the iptables
// fingerprints and returns what drifted ("" for nothing). It holds mu: a
// Delta's writes cannot pass the read.
func (r *Reconciler) probeDrift() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full.synced {
		return ""
	}
	if key := r.probe.sentinel; key != (kernel.VirtualServerKey{}) && len(r.desired.vsOwners[key]) > 0 {
		if _, err := r.k.IPVS.GetVirtualServer(key); errors.Is(err, kernel.ErrNotFound) {
			return "virtual server " + key.String() + " is gone"
		}
	}
	if drift := r.probeSets(); drift != "" {
		return drift
	}
	return r.probeRules()
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
