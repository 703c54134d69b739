// Package soak is the chaos soak (issue 28): the VM test bed with two nodes
// and three control-plane replicas, request loops to stable Services all
// the time, churn of other Services, and faults from a seeded random
// schedule, with invariants checked while it runs and a report at the end.
//
// The schedule (this file) is a pure function of the seed, the duration and
// the cluster's shape: the same seed replays the same faults at the same
// offsets against the same targets. TestSoak (soak_test.go) runs it.
package soak

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Kind is one kind of fault.
type Kind string

const (
	// AgentKill: SIGKILL of a node's agent, then a restart with the same
	// state directory.
	AgentKill Kind = "agent-kill"
	// AgentStop: SIGSTOP of a node's agent for Fault.Hold, then SIGCONT.
	AgentStop Kind = "agent-stop"
	// AgentStateCorrupt: SIGKILL of a node's agent, its state file
	// overwritten with garbage, then a restart.
	AgentStateCorrupt Kind = "agent-state-corrupt"
	// AgentStateDiskFull: a node's state directory full (a small tmpfs
	// filled up) for Fault.Hold: the agent SIGKILLed and restarted on the
	// full disk, its saves failing meanwhile; then the space freed.
	AgentStateDiskFull Kind = "agent-state-disk-full"
	// ReplicaKill: SIGKILL of a control-plane replica, then a restart.
	ReplicaKill Kind = "replica-kill"
	// ReplicaStop: SIGSTOP of a replica for Fault.Hold, then SIGCONT.
	ReplicaStop Kind = "replica-stop"
	// RollingRestart: every replica in turn SIGTERMed, restarted and
	// awaited until it serves.
	RollingRestart Kind = "rolling-restart"
	// AgentCutOff: a node's packets to every replica dropped for Fault.Hold.
	AgentCutOff Kind = "agent-cut-off"
	// APIServerStop: kube-apiserver down for Fault.Hold, then started again.
	APIServerStop Kind = "apiserver-stop"
	// DriftIPVSFlush: ipvsadm -C in a node.
	DriftIPVSFlush Kind = "drift-ipvs-flush"
	// DriftIPSetFlush: ipset flush KUBE-CLUSTER-IP in a node.
	DriftIPSetFlush Kind = "drift-ipset-flush"
	// DriftAddressDelete: one stable Service's ClusterIP deleted from a
	// node's kube-ipvs0.
	DriftAddressDelete Kind = "drift-address-delete"
	// DriftChainFlush: iptables -t nat -F KUBE-SERVICES in a node.
	DriftChainFlush Kind = "drift-chain-flush"

	// Kinds of the real-node bed only (RealKinds), where the kubelet, the
	// DaemonSet and the Deployment start the processes again.

	// AgentPodDelete: a node's agent Pod deleted (its grace period, SIGTERM
	// first); the DaemonSet starts another on the node.
	AgentPodDelete Kind = "agent-pod-delete"
	// ReplicaPodDelete: a control-plane Pod deleted; the Deployment starts
	// another.
	ReplicaPodDelete Kind = "replica-pod-delete"
)

// Kinds are every fault kind, in the order reports list them.
var Kinds = []Kind{AgentKill, AgentStop, AgentStateCorrupt, AgentStateDiskFull, AgentCutOff, ReplicaKill, ReplicaStop, RollingRestart,
	APIServerStop, DriftIPVSFlush, DriftIPSetFlush, DriftAddressDelete, DriftChainFlush}

// RealKinds are the kinds the real-node bed (e2e/realnodes) draws from:
// there the kubelet restarts a killed process in its container (AgentKill,
// ReplicaKill, and the state-file faults, done to the agent's hostPath).
var RealKinds = []Kind{AgentKill, AgentStop, AgentStateCorrupt, AgentStateDiskFull, AgentPodDelete, AgentCutOff, ReplicaKill, ReplicaStop,
	ReplicaPodDelete, RollingRestart, APIServerStop, DriftIPVSFlush, DriftIPSetFlush, DriftAddressDelete, DriftChainFlush}

// Drift reports whether k breaks a node's kernel state on purpose:
// requests through that node may fail until the agent repairs it.
func (k Kind) Drift() bool { return strings.HasPrefix(string(k), "drift-") }

// OnNode reports whether k's target is a node (else a replica, or none).
func (k Kind) OnNode() bool {
	return k.Drift() || k == AgentKill || k == AgentStop || k == AgentStateCorrupt || k == AgentStateDiskFull || k == AgentCutOff ||
		k == AgentPodDelete
}

// OnReplica reports whether k's target is one control-plane replica.
func (k Kind) OnReplica() bool { return k == ReplicaKill || k == ReplicaStop || k == ReplicaPodDelete }

// weights: how often each kind is drawn (process faults more often than
// the apiserver, the slowest to recover).
var weights = map[Kind]int{
	AgentKill: 3, AgentStop: 2, AgentStateCorrupt: 2, AgentStateDiskFull: 2, AgentCutOff: 2, ReplicaKill: 3, ReplicaStop: 2,
	RollingRestart: 1, APIServerStop: 1, AgentPodDelete: 2, ReplicaPodDelete: 2,
	DriftIPVSFlush: 2, DriftIPSetFlush: 2, DriftAddressDelete: 2, DriftChainFlush: 2,
}

// Fault is one scheduled fault.
type Fault struct {
	Seq    int           `json:"seq"`
	At     time.Duration `json:"at_ns"`  // offset from the start of the soak
	Kind   Kind          `json:"kind"`   //
	Target int           `json:"target"` // node index (0 = node1) or replica index; 0 for the apiserver
	// Hold is how long a SIGSTOP or an apiserver outage lasts.
	Hold time.Duration `json:"hold_ns,omitempty"`
}

func (f Fault) String() string {
	s := fmt.Sprintf("#%d +%v %s", f.Seq, f.At, f.Kind)
	switch {
	case f.Kind.OnNode():
		s += fmt.Sprintf(" node%d", f.Target+1)
	case f.Kind.OnReplica():
		s += fmt.Sprintf(" replica %d", f.Target)
	}
	if f.Hold > 0 {
		s += fmt.Sprintf(" for %v", f.Hold)
	}
	return s
}

// Shape is what a schedule is drawn for.
type Shape struct {
	Nodes, Replicas int
	// Warmup is the quiet start; Tail the quiet end (final convergence).
	Warmup, Tail time.Duration
	// MinGap, MaxGap bound the time between two faults' starts.
	MinGap, MaxGap time.Duration
	// Kinds are the kinds drawn from (nil: Kinds, the VM bed's).
	Kinds []Kind
}

// DefaultShape is the soak's: two nodes, three replicas, a fault every
// 15-30 s (each takes a few seconds and its convergence is awaited before
// the next).
var DefaultShape = Shape{Nodes: 2, Replicas: 3, Warmup: 15 * time.Second, Tail: 20 * time.Second,
	MinGap: 15 * time.Second, MaxGap: 30 * time.Second}

// Schedule draws the faults of a soak of duration d from seed: same
// arguments, same schedule. Offsets are whole 100 ms steps, in order, all
// within [Warmup, d-Tail].
func Schedule(seed uint64, d time.Duration, s Shape) []Fault {
	rng := rand.New(rand.NewPCG(seed, 0x736f616b)) // "soak"
	kinds := s.Kinds
	if kinds == nil {
		kinds = Kinds
	}
	total := 0
	for _, k := range kinds {
		total += weights[k]
	}
	var out []Fault
	step := 100 * time.Millisecond
	gapSteps := int64((s.MaxGap - s.MinGap) / step)
	for at := s.Warmup; at <= d-s.Tail; at += s.MinGap + time.Duration(rng.Int64N(gapSteps+1))*step {
		n := rng.IntN(total)
		var k Kind
		for _, c := range kinds {
			if n < weights[c] {
				k = c
				break
			}
			n -= weights[c]
		}
		f := Fault{Seq: len(out) + 1, At: at, Kind: k}
		switch {
		case k.OnNode():
			f.Target = rng.IntN(s.Nodes)
		case k.OnReplica():
			f.Target = rng.IntN(s.Replicas)
		}
		switch k {
		case AgentStop, ReplicaStop:
			f.Hold = time.Duration(20+rng.IntN(61)) * step // 2-8 s
		case APIServerStop, AgentCutOff, AgentStateDiskFull:
			f.Hold = time.Duration(50+rng.IntN(101)) * step // 5-15 s
		}
		out = append(out, f)
	}
	return out
}
