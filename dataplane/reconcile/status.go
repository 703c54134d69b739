package reconcile

import (
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vsplane/vsplane/dataplane/kernel"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Per-resource status (cilium's statedb reconciler keeps one per object;
// here the object reported to the control plane is the resource). After
// every pass each resource it evaluated is either applied (its version is
// in Versions, the Ack does not name it) or failed (NACKed with its
// messages). A failure on a kernel error is retryable (retry.go); one on
// content (a compile problem, a NodePort collision, a full set) is not: it
// ends when the content or the other resource changes. Errors no resource
// owns are kept for Stats.KernelErrors. Nothing is only logged.

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
	// RestoreFailures counts failed iptables-restore runs by family
	// (kube-proxy's kubeproxy_sync_proxy_rules_iptables_restore_failures_total).
	RestoreFailures map[kernel.Family]uint64
	// NoLocalEndpointsInternal/External count the Services with that
	// Local policy, endpoints in the cluster and none on this node
	// (kubeproxy_sync_proxy_rules_no_local_endpoints_total).
	NoLocalEndpointsInternal, NoLocalEndpointsExternal int
	// StaleFlowsDeleted counts the UDP and SCTP conntrack entries deleted as stale,
	// StaleFlowSweepErrors the sweeps that failed (staleflows.go).
	StaleFlowsDeleted, StaleFlowSweepErrors uint64
}

// failure is why a resource is not applied.
type failure struct {
	version   string
	messages  []string
	retryable bool // a kernel error (content errors are not retried)
}

// resourceStatus is the outcome of each resource, and the errors of the
// last pass no resource owns.
type resourceStatus struct {
	applied map[string]string // name -> version applied without error
	failed  map[string]failure
	// recovered: failed resources a retry has since applied (name ->
	// version), reported in AgentStatus until a Delta names them again.
	recovered map[string]string
	// unowned are the errors of the last pass no resource owns, then those
	// of resources it removed.
	unowned []string
}

func newResourceStatus() resourceStatus {
	return resourceStatus{applied: map[string]string{}, failed: map[string]failure{}, recovered: map[string]string{}}
}

// wasApplied: version of name is applied and name has not failed since.
func (s *resourceStatus) wasApplied(name, version string) bool {
	return !s.isFailed(name) && s.applied[name] == version
}

// set records the outcome of resource name at version: applied when msgs
// is empty, else failed with msgs.
// isFailed: the resource's last outcome was a failure.
func (s *resourceStatus) isFailed(name string) bool {
	_, failed := s.failed[name]
	return failed
}

func (s *resourceStatus) set(name, version string, msgs []string, retryable bool) {
	if len(msgs) == 0 {
		s.applied[name] = version
		if _, was := s.failed[name]; was {
			s.recovered[name] = version
		}
		delete(s.failed, name)
		return
	}
	delete(s.recovered, name)
	delete(s.applied, name)
	s.failed[name] = failure{version: version, messages: msgs, retryable: retryable}
}

// remove forgets a resource that left the desired state.
func (s *resourceStatus) remove(name string) {
	delete(s.applied, name)
	delete(s.failed, name)
}

// retryable: some error is worth retrying (a kernel error).
func (s *resourceStatus) retryable() bool {
	retry := len(s.unowned) > 0
	for _, f := range s.failed {
		retry = retry || f.retryable
	}
	return retry
}

// recordOutcomes records the outcome of each evaluated resource and of the
// errors no resource owns, and arms a retry when something retryable
// failed.
func (r *Reconciler) recordOutcomes(p *pass, evaluate []string) {
	// Every phase flushes its writes; this only guards the outcome.
	p.flushIPVS()
	p.flushWrites()
	for fam, n := range p.restoreFailures {
		if r.stats.RestoreFailures == nil {
			r.stats.RestoreFailures = map[kernel.Family]uint64{}
		}
		r.stats.RestoreFailures[fam] += uint64(n)
	}
	if len(p.errs) > 0 || len(p.unowned) > 0 {
		// A failed or partial write leaves the kernel unknown: list again
		// rather than trust what is known.
		r.known.invalidate()
	}
	for _, name := range evaluate {
		rs, ok := r.desired.res[name]
		if !ok {
			continue
		}
		msgs := append(slices.Clone(rs.problems), r.desired.conflicts(rs)...)
		msgs = append(msgs, r.admission.problems(r.desired, rs)...)
		msgs = capMessages(append(msgs, p.errs[name]...))
		r.status.set(name, rs.version, msgs, len(p.errs[name]) > 0)
	}
	r.status.unowned = p.unowned
	for _, name := range sortedKeys(p.errs, strings.Compare) {
		if _, ok := r.desired.res[name]; !ok {
			for _, m := range p.errs[name] {
				r.status.unowned = append(r.status.unowned, name+" (removed): "+m)
			}
		}
	}
	r.scheduleRetry()
}

// Versions returns the resources applied successfully (the stream client's Applier).
func (r *Reconciler) Versions() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.status.applied)
}

// Failed returns name -> error message of the resources currently failed.
func (r *Reconciler) Failed() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.status.failed))
	for name, f := range r.status.failed {
		out[name] = strings.Join(f.messages, "; ")
	}
	return out
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
	s.FailedResources = len(r.status.failed)
	s.KernelErrors = r.kernelErrorsLocked()
	s.Draining = r.drains.count()
	s.DrainsCompleted, s.DrainsTimedOut = r.drains.completed, r.drains.timedOut
	s.DrainOps = maps.Clone(r.stats.DrainOps)
	s.Recovered = maps.Clone(r.status.recovered)
	s.RestoreFailures = maps.Clone(r.stats.RestoreFailures)
	for _, rs := range r.desired.res {
		if rs.noLocalInternal {
			s.NoLocalEndpointsInternal++
		}
		if rs.noLocalExternal {
			s.NoLocalEndpointsExternal++
		}
	}
	return s
}

// kernelErrorsLocked are the errors no resource owns (a fresh slice).
// Caller holds mu.
func (r *Reconciler) kernelErrorsLocked() []string {
	errs := append(slices.Clone(r.status.unowned), r.drains.errs...)
	if r.schedulers.err != "" {
		errs = append(errs, r.schedulers.err)
	}
	return errs
}

// Status renders the counters an AgentStatus carries and the drain list.
// The agent polls it every second, so it reads only those: Stats walks
// every resource.
func (r *Reconciler) Status() *vsplanev1.AgentStatus {
	r.mu.Lock()
	st := &vsplanev1.AgentStatus{DriftRepaired: uint32(min(r.stats.DriftRepaired, 1<<32-1)), KernelErrors: r.kernelErrorsLocked(),
		Draining: drainProto(r.drains.list())}
	if len(r.status.recovered) > 0 {
		st.Recovered = maps.Clone(r.status.recovered)
	}
	if last := r.stats.LastFullReconcile; !last.IsZero() {
		st.LastFullReconcile = timestamppb.New(last)
	}
	r.mu.Unlock()
	return st
}
