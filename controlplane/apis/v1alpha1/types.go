package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// SchedulerRollout rolls an IPVS scheduler out to the nodes, step by step:
// the selected Services get Spec.Scheduler on the nodes of the steps done so
// far, every other node keeps the fleet default. Each step waits until its
// nodes' agents acknowledged the change and the health gates hold; a failed
// gate rolls every node back (Spec.Strategy.AutoRollback).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=sro
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Scheduler",type=string,JSONPath=`.spec.scheduler`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Step",type=integer,JSONPath=`.status.currentStep`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.nodesUpdated`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.nodesTotal`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SchedulerRollout struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SchedulerRolloutSpec   `json:"spec"`
	Status SchedulerRolloutStatus `json:"status,omitempty"`
}

// SchedulerRolloutSpec says what to roll out, where, and how.
type SchedulerRolloutSpec struct {
	// Scheduler is the IPVS scheduler to roll out. A node whose kernel does
	// not offer it NACKs the change, which fails the NACK gate.
	// +kubebuilder:validation:Enum=rr;wrr;lc;wlc;lblc;lblcr;dh;sh;sed;nq;mh;fo;ovf;twos
	Scheduler string `json:"scheduler"`
	// Flags are the scheduler's flags (sh and mh only).
	// +optional
	// +listType=set
	Flags []SchedulerFlag `json:"flags,omitempty"`
	// ServiceSelector selects the Services by label; empty: all.
	// +optional
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`
	// NamespaceSelector selects the Services by their namespace's labels;
	// empty: all namespaces.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// NodeSelector selects the nodes; empty: all.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// Strategy is how the rollout proceeds.
	// +optional
	Strategy RolloutStrategy `json:"strategy,omitempty"`
	// Paused stops the rollout after the current step (set it back to
	// resume).
	// +optional
	Paused bool `json:"paused,omitempty"`
	// Abort returns every node to its previous scheduler and ends an
	// unfinished rollout (phase Aborted). A Succeeded rollout stays in effect
	// until it is deleted (or a newer rollout changes the same Services).
	// +optional
	Abort bool `json:"abort,omitempty"`
}

// SchedulerFlag is an IPVS scheduler flag.
// +kubebuilder:validation:Enum=sh-fallback;sh-port;mh-fallback;mh-port
type SchedulerFlag string

// The scheduler flags (ipvsadm's names).
const (
	FlagSHFallback SchedulerFlag = "sh-fallback"
	FlagSHPort     SchedulerFlag = "sh-port"
	FlagMHFallback SchedulerFlag = "mh-fallback"
	FlagMHPort     SchedulerFlag = "mh-port"
)

// RolloutStrategy is the steps and the gates between them.
type RolloutStrategy struct {
	// Steps are the cumulative node counts ("3") or percentages ("25%") of
	// the selected nodes that run the new scheduler after each step, in
	// increasing order; the first is the canary. Default: 1, 25%, 50%,
	// 100%. A last step below 100% is followed by one at 100%.
	// +optional
	// +kubebuilder:validation:MaxItems=20
	Steps []intstr.IntOrString `json:"steps,omitempty"`
	// PauseBetweenSteps waits this long after a step succeeded before the
	// next begins.
	// +optional
	PauseBetweenSteps metav1.Duration `json:"pauseBetweenSteps,omitempty"`
	// Gates must hold for a step to succeed.
	// +optional
	Gates HealthGates `json:"gates,omitempty"`
	// AutoRollback returns every node to its previous scheduler when a gate
	// fails (default true); false leaves the rollout Failed where it is.
	// +optional
	AutoRollback *bool `json:"autoRollback,omitempty"`
}

// HealthGates are what a step's nodes must show.
type HealthGates struct {
	// MaxNACKPercent is the largest share of a step's nodes that may NACK
	// the change (default 0: any NACK fails the step).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	MaxNACKPercent int32 `json:"maxNACKPercent,omitempty"`
	// MaxApplyDuration fails the step when the p99, over the step's nodes,
	// of the agents' last apply duration exceeds it (zero: no limit).
	// +optional
	MaxApplyDuration metav1.Duration `json:"maxApplyDuration,omitempty"`
	// RequireCapability checks, before a step begins, that every node in it
	// lists the scheduler in its agent's capabilities (default true).
	// +optional
	RequireCapability *bool `json:"requireCapability,omitempty"`
	// MinSoakTime keeps a step's nodes on the new scheduler at least this
	// long before the step can succeed.
	// +optional
	MinSoakTime metav1.Duration `json:"minSoakTime,omitempty"`
	// StepTimeout fails a step whose nodes have not all acknowledged in this
	// time (default 10 minutes).
	// +optional
	StepTimeout metav1.Duration `json:"stepTimeout,omitempty"`
}

// Phase of a rollout.
// +kubebuilder:validation:Enum=Pending;Progressing;Paused;Succeeded;Failed;RolledBack;Aborted
type Phase string

// The phases.
const (
	PhasePending     Phase = "Pending"
	PhaseProgressing Phase = "Progressing"
	PhasePaused      Phase = "Paused"
	PhaseSucceeded   Phase = "Succeeded"
	PhaseFailed      Phase = "Failed"
	PhaseRolledBack  Phase = "RolledBack"
	PhaseAborted     Phase = "Aborted"
)

// SchedulerRolloutStatus is written by the control plane's leader.
type SchedulerRolloutStatus struct {
	// ObservedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// CurrentStep is the index (from 0) of the step running or last run.
	// +optional
	CurrentStep int32 `json:"currentStep"`
	// Steps records each step begun: its node count and times.
	// +optional
	Steps []StepStatus `json:"steps,omitempty"`
	// NodesTotal is the number of selected nodes; NodesUpdated those that
	// acknowledged the new scheduler; NodesPending those assigned that have
	// not yet; NodesFailed those that NACKed it.
	// +optional
	NodesTotal   int32 `json:"nodesTotal"`
	NodesUpdated int32 `json:"nodesUpdated"`
	NodesPending int32 `json:"nodesPending"`
	NodesFailed  int32 `json:"nodesFailed"`
	// FailedNodes say why (the agent's NACK message), at most 20.
	// +optional
	FailedNodes []NodeFailure `json:"failedNodes,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// StepStatus is one step begun.
type StepStatus struct {
	// Nodes is the number of selected nodes the step covers (counted when
	// it began).
	Nodes int32 `json:"nodes"`
	// Threshold: the step covers every selected node whose position (a hash
	// of the rollout's UID and the node name, in [0, 2^62)) is below it, so
	// every replica computes the same nodes, and a node that joins later
	// and falls below it is covered too.
	Threshold int64       `json:"threshold"`
	StartTime metav1.Time `json:"startTime"`
	// DoneTime is when every node of the step acknowledged the change.
	// +optional
	DoneTime *metav1.Time `json:"doneTime,omitempty"`
}

// NodeFailure is a node that did not take the change, and why.
type NodeFailure struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// SchedulerRolloutList is a list of SchedulerRollouts.
//
// +kubebuilder:object:root=true
type SchedulerRolloutList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SchedulerRollout `json:"items"`
}

var _ runtime.Object = (*SchedulerRollout)(nil)
