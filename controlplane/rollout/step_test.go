package rollout

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
)

// fleet simulates agents: a reached node acknowledges at once unless it is
// listed in nack (it NACKs) or slow (it stays pending).
type fleet struct {
	names      []string
	nack, slow map[string]bool
	incapable  map[string]bool
}

func newFleet(n int) *fleet {
	f := &fleet{nack: map[string]bool{}, slow: map[string]bool{}, incapable: map[string]bool{}}
	for i := range n {
		f.names = append(f.names, fmt.Sprintf("node-%02d", i))
	}
	return f
}

func (f *fleet) view(ro *v1alpha1.SchedulerRollout, now time.Time) View {
	v := View{Now: now}
	for _, n := range f.names {
		nd := Node{Name: n, Capable: !f.incapable[n], ApplyDuration: 5 * time.Millisecond}
		if reaches(&ro.Status, ro, n) {
			switch {
			case f.nack[n]:
				nd.State, nd.Reason = Failed, `virtual_servers[0].scheduler "mh": not offered by this kernel`
			case f.slow[n]:
				nd.State = Pending
			default:
				nd.State = Updated
			}
		}
		v.Nodes = append(v.Nodes, nd)
	}
	return v
}

func newRollout(steps ...intstr.IntOrString) *v1alpha1.SchedulerRollout {
	no := false
	return &v1alpha1.SchedulerRollout{
		ObjectMeta: metav1.ObjectMeta{Name: "to-mh", UID: "uid-1", Generation: 1},
		Spec: v1alpha1.SchedulerRolloutSpec{Scheduler: "mh", Strategy: v1alpha1.RolloutStrategy{Steps: steps,
			Gates: v1alpha1.HealthGates{RequireCapability: &no}}},
	}
}

// run applies Next until the phase is one of stop or n rounds passed; each
// round advances the clock by a second. It returns the events.
func run(t *testing.T, ro *v1alpha1.SchedulerRollout, f *fleet, now *time.Time, n int, stop ...v1alpha1.Phase) []Event {
	t.Helper()
	var all []Event
	for range n {
		st, ev := Next(ro, f.view(ro, *now))
		ro.Status = st
		all = append(all, ev...)
		*now = now.Add(time.Second)
		for _, p := range stop {
			if st.Phase == p {
				return all
			}
		}
	}
	return all
}

func reasons(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Reason)
	}
	return out
}

func TestStepsReachEveryNode(t *testing.T) {
	f := newFleet(40)
	ro := newRollout(intstr.FromInt32(1), intstr.FromString("25%"), intstr.FromString("50%"), intstr.FromString("100%"))
	now := time.Unix(1000, 0)
	var counts []int32
	for i := 0; i < 50 && ro.Status.Phase != v1alpha1.PhaseSucceeded; i++ {
		st, _ := Next(ro, f.view(ro, now))
		if len(st.Steps) > len(ro.Status.Steps) {
			counts = append(counts, st.Steps[len(st.Steps)-1].Nodes)
		}
		ro.Status = st
		now = now.Add(time.Second)
	}
	if ro.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("phase %s after 50 rounds", ro.Status.Phase)
	}
	if fmt.Sprint(counts) != "[1 10 20 40]" {
		t.Errorf("step node counts %v, want [1 10 20 40]", counts)
	}
	// Thresholds grow, so a node once reached stays reached.
	for i := 1; i < len(ro.Status.Steps); i++ {
		if ro.Status.Steps[i].Threshold < ro.Status.Steps[i-1].Threshold {
			t.Fatalf("threshold of step %d shrank", i)
		}
	}
	if ro.Status.NodesUpdated != 40 || ro.Status.NodesTotal != 40 || ro.Status.ObservedGeneration != 1 {
		t.Errorf("status %+v", ro.Status)
	}
	// The status is stable once done: nothing to write.
	st, ev := Next(ro, f.view(ro, now))
	if len(ev) != 0 || fmt.Sprint(st) != fmt.Sprint(ro.Status) {
		t.Errorf("a finished rollout changed: %v", ev)
	}
}

func TestNACKsRollBackAndSayWhy(t *testing.T) {
	f := newFleet(10)
	ro := newRollout(intstr.FromString("50%"), intstr.FromString("100%"))
	now := time.Unix(1000, 0)
	// Every node NACKs: the first step fails.
	for _, n := range f.names {
		f.nack[n] = true
	}
	ev := run(t, ro, f, &now, 10, v1alpha1.PhaseRolledBack)
	if ro.Status.Phase != v1alpha1.PhaseRolledBack {
		t.Fatalf("phase %s, want RolledBack (events %v)", ro.Status.Phase, reasons(ev))
	}
	if len(ro.Status.FailedNodes) == 0 || ro.Status.FailedNodes[0].Reason == "" {
		t.Errorf("failed nodes not reported: %+v", ro.Status.FailedNodes)
	}
	if e := ev[len(ev)-1]; !e.Warning || e.Reason != "RolledBack" {
		t.Errorf("last event %+v", e)
	}
	// Rolled back: no node is reached any more.
	for _, n := range f.names {
		if reaches(&ro.Status, ro, n) {
			t.Fatalf("%s still reached after the rollback", n)
		}
	}
}

func TestMaxNACKPercentAllowsSome(t *testing.T) {
	f := newFleet(10)
	ro := newRollout(intstr.FromString("100%"))
	ro.Spec.Strategy.Gates.MaxNACKPercent = 20
	f.nack[f.names[0]] = true
	now := time.Unix(1000, 0)
	run(t, ro, f, &now, 10, v1alpha1.PhaseSucceeded, v1alpha1.PhaseRolledBack)
	if ro.Status.Phase != v1alpha1.PhaseSucceeded || ro.Status.NodesFailed != 1 {
		t.Fatalf("phase %s failed %d, want Succeeded with 1 failed node", ro.Status.Phase, ro.Status.NodesFailed)
	}
}

func TestPauseResumeAbort(t *testing.T) {
	f := newFleet(8)
	ro := newRollout(intstr.FromInt32(2), intstr.FromInt32(4), intstr.FromString("100%"))
	ro.Spec.Paused = true
	now := time.Unix(1000, 0)
	run(t, ro, f, &now, 10, v1alpha1.PhasePaused)
	if ro.Status.Phase != v1alpha1.PhasePaused || ro.Status.CurrentStep != 0 || ro.Status.NodesUpdated != 2 {
		t.Fatalf("paused: %+v", ro.Status)
	}
	run(t, ro, f, &now, 3)
	if ro.Status.CurrentStep != 0 {
		t.Fatal("a paused rollout moved on")
	}
	ro.Spec.Paused = false
	run(t, ro, f, &now, 1)
	if ro.Status.CurrentStep == 0 || ro.Status.Phase != v1alpha1.PhaseProgressing {
		t.Fatal("a resumed rollout did not move on")
	}
	ro.Spec.Abort = true
	run(t, ro, f, &now, 2)
	if ro.Status.Phase != v1alpha1.PhaseAborted || ro.Status.NodesUpdated != 0 {
		t.Fatalf("aborted: %+v", ro.Status)
	}
}

func TestGatesCapabilityTimeoutSoakBlocked(t *testing.T) {
	now := time.Unix(1000, 0)
	t.Run("capability", func(t *testing.T) {
		f := newFleet(4)
		ro := newRollout(intstr.FromString("100%"))
		ro.Spec.Strategy.Gates.RequireCapability = nil // default: required
		f.incapable[f.names[2]] = true
		run(t, ro, f, &now, 3, v1alpha1.PhaseRolledBack)
		if ro.Status.Phase != v1alpha1.PhaseRolledBack || len(ro.Status.Steps) != 0 {
			t.Fatalf("a node lacking the scheduler: %+v", ro.Status)
		}
	})
	t.Run("step timeout", func(t *testing.T) {
		f := newFleet(4)
		ro := newRollout(intstr.FromString("100%"))
		ro.Spec.Strategy.Gates.StepTimeout = metav1.Duration{Duration: 5 * time.Second}
		for _, n := range f.names {
			f.slow[n] = true
		}
		run(t, ro, f, &now, 20, v1alpha1.PhaseRolledBack)
		if ro.Status.Phase != v1alpha1.PhaseRolledBack {
			t.Fatalf("pending nodes past the timeout: %s", ro.Status.Phase)
		}
	})
	t.Run("soak", func(t *testing.T) {
		f := newFleet(4)
		ro := newRollout(intstr.FromString("50%"), intstr.FromString("100%"))
		ro.Spec.Strategy.Gates.MinSoakTime = metav1.Duration{Duration: 10 * time.Second}
		start := now
		run(t, ro, f, &now, 30, v1alpha1.PhaseSucceeded)
		if got := now.Sub(start); got < 20*time.Second {
			t.Fatalf("two steps with 10 s soak each took %v", got)
		}
	})
	t.Run("blocked by an older rollout", func(t *testing.T) {
		f := newFleet(4)
		ro := newRollout()
		st, _ := Next(ro, View{Now: now, Nodes: f.view(ro, now).Nodes, BlockedBy: "older"})
		if st.Phase != v1alpha1.PhasePending || len(st.Steps) != 0 {
			t.Fatalf("blocked: %+v", st)
		}
	})
}
