// Package rollout drives SchedulerRollouts: the elected leader among the
// control-plane replicas moves each rollout's status on, step by step, from
// what the agents report; every replica (package engine) derives from that
// status which nodes run the new scheduler. The leader therefore never tells
// replicas anything: a leader failover continues from the status, without
// skipping or repeating a step.
//
// step.go is the pure decision (Next); controller.go is leader election,
// the fleet view and the status writes.
package rollout

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/controlplane/model"
)

// Defaults of a rollout's strategy.
var DefaultSteps = []intstr.IntOrString{intstr.FromInt32(1), intstr.FromString("25%"), intstr.FromString("50%"), intstr.FromString("100%")}

// DefaultStepTimeout fails a step whose nodes have not all acknowledged.
const DefaultStepTimeout = 10 * time.Minute

// maxFailedNodes bounds Status.FailedNodes.
const maxFailedNodes = 20

// NodeState is what a reached node's agent reports about the change.
type NodeState int

const (
	// Pending: not acknowledged yet (or the agent is not connected).
	Pending NodeState = iota
	// Updated: the agent acknowledged the desired version of every selected
	// Service.
	Updated
	// Failed: the agent NACKed the change (Reason says why).
	Failed
)

// Node is one selected node as the leader sees it.
type Node struct {
	Name string
	// State and Reason of the change on the node (reached nodes only).
	State  NodeState
	Reason string
	// Capable: the node's agent lists the scheduler in its capabilities
	// (false if it is not connected).
	Capable bool
	// ApplyDuration is the agent's last apply duration.
	ApplyDuration time.Duration
}

// View is what Next decides from.
type View struct {
	Now time.Time
	// Nodes are the selected nodes (the rollout's node selector), any order.
	Nodes []Node
	// BlockedBy names an older rollout that has not finished ("" if none):
	// one rollout progresses at a time.
	BlockedBy string
}

// Event is a Kubernetes Event to record on the rollout.
type Event struct {
	Warning         bool
	Reason, Message string
}

// Condition types.
const (
	ConditionProgressing = "Progressing"
	ConditionHealthy     = "Healthy"
)

// plannedSteps returns ro's steps: the defaults when it names none, and a
// final 100% step after a last one that may cover fewer nodes.
func plannedSteps(ro *v1alpha1.SchedulerRollout) []intstr.IntOrString {
	steps := ro.Spec.Strategy.Steps
	if len(steps) == 0 {
		steps = DefaultSteps
	}
	if last := steps[len(steps)-1]; resolve(last, 100) < 100 || last.Type == intstr.Int {
		steps = append(slices.Clone(steps), intstr.FromString("100%"))
	}
	return steps
}

// Next returns the rollout's next status and the events to record; a
// status equal to the current one means nothing to write.
func Next(ro *v1alpha1.SchedulerRollout, v View) (v1alpha1.SchedulerRolloutStatus, []Event) {
	st := *ro.Status.DeepCopy()
	st.ObservedGeneration = ro.Generation
	var events []Event
	emit := func(warning bool, reason, format string, args ...any) {
		events = append(events, Event{Warning: warning, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}
	setCond := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: ro.Generation, LastTransitionTime: metav1.NewTime(v.Now)})
	}
	nodes := slices.Clone(v.Nodes)
	slices.SortFunc(nodes, func(a, b Node) int {
		return cmp.Or(cmp.Compare(model.Position(string(ro.UID), a.Name), model.Position(string(ro.UID), b.Name)), cmp.Compare(a.Name, b.Name))
	})
	st.NodesTotal = int32(len(nodes))
	steps := plannedSteps(ro)
	gates := ro.Spec.Strategy.Gates
	autoRollback := ro.Spec.Strategy.AutoRollback == nil || *ro.Spec.Strategy.AutoRollback
	requireCap := gates.RequireCapability == nil || *gates.RequireCapability

	fail := func(reason, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if autoRollback {
			st.Phase = v1alpha1.PhaseRolledBack
			emit(true, "RolledBack", "%s; every node returns to its previous scheduler", msg)
		} else {
			st.Phase = v1alpha1.PhaseFailed
			emit(true, "Failed", "%s; nodes reached so far keep the new scheduler (autoRollback false)", msg)
		}
		setCond(ConditionHealthy, metav1.ConditionFalse, reason, msg)
		setCond(ConditionProgressing, metav1.ConditionFalse, string(st.Phase), msg)
	}
	begin := func(k int) {
		target := min(len(nodes), max(1, resolve(steps[k], len(nodes))))
		threshold := model.PositionSpace
		if target < len(nodes) {
			threshold = model.Position(string(ro.UID), nodes[target].Name)
		}
		if requireCap {
			var lacking []string
			for _, n := range nodes[:target] {
				if !n.Capable {
					lacking = append(lacking, n.Name)
				}
			}
			if len(lacking) > 0 {
				fail("SchedulerMissing", "step %d: %d node(s) do not offer scheduler %q (or their agent is not connected): %s",
					k+1, len(lacking), ro.Spec.Scheduler, first(lacking, 5))
				return
			}
		}
		st.Steps = append(st.Steps, v1alpha1.StepStatus{Nodes: int32(target), Threshold: threshold, StartTime: metav1.NewTime(v.Now)})
		st.CurrentStep = int32(len(st.Steps) - 1)
		st.Phase = v1alpha1.PhaseProgressing
		setCond(ConditionProgressing, metav1.ConditionTrue, "StepStarted", fmt.Sprintf("step %d of %d: %d of %d nodes", k+1, len(steps), target, len(nodes)))
		emit(false, "StepStarted", "step %d of %d: scheduler %s on %d of %d nodes", k+1, len(steps), ro.Spec.Scheduler, target, len(nodes))
	}

	switch st.Phase {
	case v1alpha1.PhaseSucceeded, v1alpha1.PhaseRolledBack, v1alpha1.PhaseAborted, v1alpha1.PhaseFailed:
		count(&st, nodes, ro)
		return st, events
	case "", v1alpha1.PhasePending:
		if ro.Spec.Abort {
			st.Phase = v1alpha1.PhaseAborted
			emit(false, "Aborted", "aborted before it started")
			return st, events
		}
		if v.BlockedBy != "" {
			st.Phase = v1alpha1.PhasePending
			setCond(ConditionProgressing, metav1.ConditionFalse, "Waiting", "waiting for SchedulerRollout "+v.BlockedBy+" to finish")
			return st, events
		}
		if len(nodes) == 0 {
			st.Phase = v1alpha1.PhasePending
			setCond(ConditionProgressing, metav1.ConditionFalse, "NoNodes", "no node matches the node selector")
			return st, events
		}
		begin(0)
		count(&st, nodes, ro)
		return st, events
	}

	// Progressing or Paused.
	if ro.Spec.Abort {
		st.Phase = v1alpha1.PhaseAborted
		setCond(ConditionProgressing, metav1.ConditionFalse, "Aborted", "aborted by spec.abort")
		emit(false, "Aborted", "aborted at step %d; every node returns to its previous scheduler", st.CurrentStep+1)
		return st, events
	}
	reached, updated, pending, failed := count(&st, nodes, ro)
	cur := &st.Steps[st.CurrentStep]
	if reached > 0 && int64(failed)*100 > int64(gates.MaxNACKPercent)*int64(reached) {
		fail("NACKs", "step %d: %d of %d nodes NACKed the change (at most %d%% allowed): %s", st.CurrentStep+1, failed, reached,
			gates.MaxNACKPercent, failureSummary(st.FailedNodes))
		return st, events
	}
	if max := gates.MaxApplyDuration.Duration; max > 0 {
		if p99 := p99Apply(nodes, &st, ro); p99 > max {
			fail("SlowApply", "step %d: p99 of the nodes' apply duration %v exceeds %v", st.CurrentStep+1, p99, max)
			return st, events
		}
	}
	timeout := gates.StepTimeout.Duration
	if timeout <= 0 {
		timeout = DefaultStepTimeout
	}
	if pending > 0 && v.Now.Sub(cur.StartTime.Time) > timeout {
		fail("StepTimeout", "step %d: %d of %d nodes did not acknowledge within %v", st.CurrentStep+1, pending, reached, timeout)
		return st, events
	}
	if pending == 0 && updated+failed == reached && cur.DoneTime == nil {
		t := metav1.NewTime(v.Now)
		cur.DoneTime = &t
		emit(false, "StepDone", "step %d: all %d nodes acknowledged scheduler %s", st.CurrentStep+1, reached, ro.Spec.Scheduler)
	}
	if cur.DoneTime == nil || v.Now.Sub(cur.StartTime.Time) < gates.MinSoakTime.Duration {
		return st, events
	}
	if int(st.CurrentStep) == len(steps)-1 {
		st.Phase = v1alpha1.PhaseSucceeded
		setCond(ConditionProgressing, metav1.ConditionFalse, "Succeeded", fmt.Sprintf("all %d nodes run %s", len(nodes), ro.Spec.Scheduler))
		setCond(ConditionHealthy, metav1.ConditionTrue, "GatesHeld", "every step's gates held")
		emit(false, "Succeeded", "all %d nodes run scheduler %s", len(nodes), ro.Spec.Scheduler)
		return st, events
	}
	if ro.Spec.Paused {
		if st.Phase != v1alpha1.PhasePaused {
			st.Phase = v1alpha1.PhasePaused
			setCond(ConditionProgressing, metav1.ConditionFalse, "Paused", fmt.Sprintf("paused after step %d", st.CurrentStep+1))
			emit(false, "Paused", "paused after step %d", st.CurrentStep+1)
		}
		return st, events
	}
	if st.Phase == v1alpha1.PhasePaused {
		emit(false, "Resumed", "resumed after step %d", st.CurrentStep+1)
	}
	if v.Now.Sub(cur.DoneTime.Time) < ro.Spec.Strategy.PauseBetweenSteps.Duration {
		st.Phase = v1alpha1.PhaseProgressing
		return st, events
	}
	setCond(ConditionHealthy, metav1.ConditionTrue, "GatesHeld", fmt.Sprintf("step %d's gates held", st.CurrentStep+1))
	begin(int(st.CurrentStep) + 1)
	count(&st, nodes, ro)
	return st, events
}

// count fills the node counters and failures from the reached nodes and
// returns them.
func count(st *v1alpha1.SchedulerRolloutStatus, nodes []Node, ro *v1alpha1.SchedulerRollout) (reached, updated, pending, failed int) {
	st.FailedNodes = nil
	for _, n := range nodes {
		if !reaches(st, ro, n.Name) {
			continue
		}
		reached++
		switch n.State {
		case Updated:
			updated++
		case Failed:
			failed++
			if len(st.FailedNodes) < maxFailedNodes {
				st.FailedNodes = append(st.FailedNodes, v1alpha1.NodeFailure{Node: n.Name, Reason: n.Reason})
			}
		default:
			pending++
		}
	}
	st.NodesUpdated, st.NodesPending, st.NodesFailed = int32(updated), int32(pending), int32(failed)
	if st.Phase == v1alpha1.PhaseRolledBack || st.Phase == v1alpha1.PhaseAborted {
		st.NodesUpdated, st.NodesPending = 0, 0
	}
	return reached, updated, pending, failed
}

// reaches is model.Rollout.Reaches on the status being built.
func reaches(st *v1alpha1.SchedulerRolloutStatus, ro *v1alpha1.SchedulerRollout, node string) bool {
	switch st.Phase {
	case v1alpha1.PhaseSucceeded:
		return true
	case v1alpha1.PhaseProgressing, v1alpha1.PhasePaused, v1alpha1.PhaseFailed:
		if len(st.Steps) == 0 {
			return false
		}
		return model.Position(string(ro.UID), node) < st.Steps[st.CurrentStep].Threshold
	}
	return false
}

// resolve turns a step (count or percentage, rounded up) into a node count
// out of total.
func resolve(s intstr.IntOrString, total int) int {
	if s.Type == intstr.Int {
		return int(s.IntVal)
	}
	pct, err := intstr.GetScaledValueFromIntOrPercent(&s, 100, true)
	if err != nil {
		return total
	}
	return int(math.Ceil(float64(pct) * float64(total) / 100))
}

// p99Apply is the 99th percentile of the reached nodes' apply durations.
func p99Apply(nodes []Node, st *v1alpha1.SchedulerRolloutStatus, ro *v1alpha1.SchedulerRollout) time.Duration {
	var ds []time.Duration
	for _, n := range nodes {
		if reaches(st, ro, n.Name) && n.ApplyDuration > 0 {
			ds = append(ds, n.ApplyDuration)
		}
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(math.Ceil(0.99*float64(len(ds))))-1)]
}

func failureSummary(f []v1alpha1.NodeFailure) string {
	var parts []string
	for i, n := range f {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(f)-3))
			break
		}
		parts = append(parts, n.Node+": "+n.Reason)
	}
	return strings.Join(parts, "; ")
}

func first(s []string, n int) string {
	if len(s) > n {
		return strings.Join(s[:n], ", ") + fmt.Sprintf(" and %d more", len(s)-n)
	}
	return strings.Join(s, ", ")
}
