package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// pass is one application of desired state to the kernel, by an Apply
// (apply.go), a full reconcile (full.go) or a drain check (drain.go). It
// reads the desired state, writes the kernel, keeps what the kernel is
// known to hold and the drains up to date as its writes succeed, counts
// its writes and collects errors per resource; the caller turns those
// into outcomes (recordOutcomes, status.go).
//
// The sync of each kind of kernel object lives in its own file, with its
// contract: ipvs.go (virtual servers and their real servers), addresses.go
// (kube-ipvs0 addresses), ipsets.go (sets and entries), iptables.go and
// sysctl.go (node settings).
type pass struct {
	ctx      context.Context
	k        kernel.Kernel
	log      *zap.Logger
	families familySet
	now      func() time.Time
	s        settings // the effective node settings

	desired   *store          // read only
	marks     *inClusterMarks // read only: which fwmark servers are ours
	numCPU    int             // scales the conntrack table
	admission *setAdmission   // read only
	known     *knownKernel    // updated as writes succeed
	drains    *drainSet       // updated by removeDestination
	rendered  renderMemo      // the last iptables renderings (iptables.go)

	// The pass's result: writes by kind, errors by resource name, errors no
	// resource can be blamed for, and which of ops ended a drain
	// (housekeeping, not drift repair).
	ops      map[string]uint32
	errs     map[string][]string
	unowned  []string
	drainOps map[string]uint32
	// restoreFailures counts failed iptables-restore runs by family.
	restoreFailures map[kernel.Family]uint32

	localElse map[netip.Addr]bool // on an interface other than kube-ipvs0
	// listed is the IPVS table read by a full pass (nil: read per key), so
	// a full pass costs one list instead of one get per virtual server.
	listed map[kernel.VirtualServerKey]kernel.VirtualServer
	// listedDests are real servers a full pass read before taking the
	// lock (prefetch.go), by virtual server; one absent is read per key.
	listedDests map[kernel.VirtualServerKey][]kernel.Destination

	// Queued kernel writes (queue.go): IPVS, kube-ipvs0 addresses, ipset
	// entries. addFailed: servers whose add failed in the IPVS batch being
	// reported. dummyMade: this pass recreated kube-ipvs0 after a bind
	// found it gone.
	ipvsq     writeQueue[kernel.IPVSOp]
	addrq     writeQueue[kernel.AddressOp]
	entryq    writeQueue[kernel.EntryOp]
	addFailed map[kernel.VirtualServerKey]bool
	dummyMade bool
	// flowsWritten are the UDP and SCTP virtual servers the pass wrote
	// (staleflows.go).
	flowsWritten map[kernel.VirtualServerKey]struct{}
}

func (r *Reconciler) newPass(ctx context.Context) *pass {
	return &pass{ctx: ctx, k: r.k, log: r.log, families: r.families, now: r.cfg.Now, s: r.desired.settings(),
		desired: r.desired, marks: r.marks, numCPU: r.cfg.NumCPU, admission: &r.admission, known: &r.known, drains: &r.drains, rendered: r.rendered,
		ops: map[string]uint32{}, errs: map[string][]string{}}
}

// fail records err against every named resource (or, with none, as an
// error no resource owns).
func (p *pass) fail(names []string, what string, err error) {
	msg := fmt.Sprintf("%s: %v", what, err)
	p.log.Warn("kernel operation failed", zap.String("op", what), zap.Strings("resources", names), zap.Error(err))
	if len(names) == 0 {
		p.unowned = append(p.unowned, msg)
		return
	}
	for _, n := range names {
		if !slices.Contains(p.errs[n], msg) {
			p.errs[n] = append(p.errs[n], msg)
		}
	}
}

func (p *pass) count(op string) { p.ops[op]++ }

// excluded: a is inside exclude_cidrs, so it is never unbound and its
// virtual servers are never deleted.
func (p *pass) excluded(a netip.Addr) bool {
	for _, c := range p.s.excludeCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// ownersToBlame is who answers for an item's failure: its current owners
// plus the changed resources that touched it, sorted. The result is only
// read, and only during the pass (the store does not change during one):
// with no touchers, sorted owners are returned as they are (clipped, so an
// append copies), sparing a full pass a copy per virtual server.
func ownersToBlame(owners, touchers []string) []string {
	if len(touchers) == 0 && slices.IsSorted(owners) {
		return slices.Clip(owners)
	}
	out := slices.Clone(owners)
	for _, t := range touchers {
		out = appendOnce(out, t)
	}
	slices.Sort(out)
	return out
}
