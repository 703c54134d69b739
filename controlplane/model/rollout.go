package model

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
)

// Rollout is what every replica needs of a SchedulerRollout to compute the
// same per-node scheduler assignment: the selectors, the scheduler and how
// far the rollout got (its phase and the current step's threshold, both in
// the status the leader writes).
type Rollout struct {
	Name string
	UID  string
	// Created orders rollouts (then Name): a newer one layers over older.
	Created           int64
	Scheduler         string
	Flags             []SchedulerFlag
	ServiceSelector   labels.Selector
	NamespaceSelector labels.Selector
	NodeSelector      labels.Selector
	Phase             v1alpha1.Phase
	// Threshold: the nodes whose Position is below it run the scheduler
	// (in phases Progressing, Paused and Failed); 0 while no step began.
	Threshold int64
}

// PositionSpace is the range of Position: [0, PositionSpace).
const PositionSpace = int64(1) << 62

// Position places a node in a rollout's order: a hash of the rollout's UID
// and the node's name, the same on every replica. A step covers the nodes
// below a threshold, so a node once reached stays reached when others join.
func Position(rolloutUID, node string) int64 {
	sum := sha256.Sum256([]byte(rolloutUID + "/" + node))
	return int64(binary.BigEndian.Uint64(sum[:8]) >> 2)
}

// Applies reports whether the rollout currently decides schedulers (phases
// that have reached nodes and were not rolled back or aborted).
func (r *Rollout) Applies() bool {
	switch r.Phase {
	case v1alpha1.PhaseProgressing, v1alpha1.PhasePaused, v1alpha1.PhaseFailed, v1alpha1.PhaseSucceeded:
		return true
	}
	return false
}

// Reaches reports whether the rollout has reached node (given the node's
// labels for the node selector).
func (r *Rollout) Reaches(n *Node) bool {
	if !r.Applies() || !r.NodeSelector.Matches(labels.Set(n.Labels)) {
		return false
	}
	return r.Phase == v1alpha1.PhaseSucceeded || Position(r.UID, n.Name) < r.Threshold
}

// Selects reports whether the rollout applies to svc, whose namespace has
// nsLabels.
func (r *Rollout) Selects(svc *Service, nsLabels map[string]string) bool {
	return r.ServiceSelector.Matches(labels.Set(svc.Labels)) && r.NamespaceSelector.Matches(labels.Set(nsLabels))
}

// CompareRollouts orders rollouts newest first (creation, then name).
func CompareRollouts(a, b *Rollout) int {
	if a.Created != b.Created {
		if a.Created > b.Created {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// ConvertRollout reads a SchedulerRollout. Bad selectors make it apply to
// nothing (a problem says so); the API server's validation catches the rest.
func ConvertRollout(o *v1alpha1.SchedulerRollout) (*Rollout, []Problem) {
	if o == nil {
		return nil, nil
	}
	var problems []Problem
	sel := func(field string, ls *metav1.LabelSelector) labels.Selector {
		if ls == nil {
			return labels.Everything()
		}
		s, err := metav1.LabelSelectorAsSelector(ls)
		if err != nil {
			problems = append(problems, Problem{Kind: "SchedulerRollout", Object: o.Name, Reason: ReasonBadSelector,
				Detail: fmt.Sprintf("%s: %v (the rollout selects nothing)", field, err)})
			return labels.Nothing()
		}
		return s
	}
	r := &Rollout{
		Name: o.Name, UID: string(o.UID), Created: o.CreationTimestamp.UnixNano(),
		Scheduler:         o.Spec.Scheduler,
		ServiceSelector:   sel("serviceSelector", o.Spec.ServiceSelector),
		NamespaceSelector: sel("namespaceSelector", o.Spec.NamespaceSelector),
		NodeSelector:      sel("nodeSelector", o.Spec.NodeSelector),
		Phase:             o.Status.Phase,
	}
	for _, f := range o.Spec.Flags {
		r.Flags = append(r.Flags, SchedulerFlag(f))
	}
	slices.Sort(r.Flags)
	if n := len(o.Status.Steps); n > 0 && int(o.Status.CurrentStep) < n {
		r.Threshold = o.Status.Steps[o.Status.CurrentStep].Threshold
	}
	if !slices.Contains(Schedulers, r.Scheduler) {
		problems = append(problems, Problem{Kind: "SchedulerRollout", Object: o.Name, Reason: ReasonBadScheduler,
			Detail: fmt.Sprintf("scheduler %q is not an IPVS scheduler (the rollout applies nowhere)", r.Scheduler)})
		r.ServiceSelector = labels.Nothing()
	}
	return r, problems
}
