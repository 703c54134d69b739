package engine

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/watch"
)

func setRollout(c *watch.Changes, r *model.Rollout) {
	c.Rollouts[r.Name] = watch.Change[model.Rollout]{Current: &watch.Observed[model.Rollout]{Value: r}}
}

func schedulerOf(t *testing.T, st *snapshot.Store, node, name string) string {
	t.Helper()
	r := get(t, st, node, name)
	s := r.GetService().GetVirtualServers()[0].GetScheduler()
	for _, vs := range r.GetService().GetVirtualServers() {
		if vs.GetScheduler() != s {
			t.Fatalf("%s on %s: virtual servers disagree on the scheduler", name, node)
		}
	}
	return s
}

// Every replica derives the same per-node schedulers from a rollout's spec
// and status: the selected Services get the rollout's scheduler on the nodes
// below the step's threshold, every other Service and node is untouched;
// Succeeded reaches every selected node, RolledBack none.
func TestRolloutAssignsSchedulersPerNode(t *testing.T) {
	e, st, _ := newEngine(t)
	c := changes()
	const nodes = 20
	for i := range nodes {
		n := fmt.Sprintf("n%02d", i)
		pool := "general"
		if i >= 16 {
			pool = "gpu"
		}
		c.Nodes[n] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: n, Labels: map[string]string{"pool": pool}}}}
	}
	setService(c, "a", "198.18.0.1", time.Time{})
	setService(c, "b", "198.18.0.2", time.Time{})
	setService(c, "own", "198.18.0.3", time.Time{})
	c.Services[model.ServiceKey{Namespace: "ns", Name: "a"}].Current.Value.Labels = map[string]string{"app": "a"}
	c.Services[model.ServiceKey{Namespace: "ns", Name: "own"}].Current.Value.Labels = map[string]string{"app": "a"}
	c.Services[model.ServiceKey{Namespace: "ns", Name: "own"}].Current.Value.Scheduler = "sh"
	apply(t, e, c)
	bBefore, _ := versionsOf(st, "n00")

	sel, _ := labels.Parse("app=a")
	nodeSel, _ := labels.Parse("pool=general")
	r := &model.Rollout{Name: "to-mh", UID: "uid-1", Scheduler: "mh", ServiceSelector: sel, NamespaceSelector: labels.Everything(),
		NodeSelector: nodeSel, Phase: v1alpha1.PhaseProgressing, Threshold: model.PositionSpace / 2}
	c = changes()
	setRollout(c, r)
	apply(t, e, c)
	reached := map[string]bool{}
	for _, n := range e.RolloutNodes("to-mh") {
		reached[n] = true
	}
	if len(reached) == 0 || len(reached) >= 16 {
		t.Fatalf("half the position space should reach some but not all 16 general nodes, reached %d", len(reached))
	}
	for i := range nodes {
		n := fmt.Sprintf("n%02d", i)
		want := ""
		if reached[n] {
			want = "mh"
			if i >= 16 {
				t.Fatalf("%s outside the node selector was reached", n)
			}
			if model.Position("uid-1", n) >= r.Threshold {
				t.Fatalf("%s above the threshold was reached", n)
			}
		}
		if got := schedulerOf(t, st, n, "service/ns/a"); got != want {
			t.Errorf("%s: a has scheduler %q, want %q", n, got, want)
		}
		if got := schedulerOf(t, st, n, "service/ns/b"); got != "" {
			t.Errorf("%s: b (not selected) has scheduler %q", n, got)
		}
		if got := schedulerOf(t, st, n, "service/ns/own"); got != "sh" {
			t.Errorf("%s: own (annotation) has scheduler %q, want sh", n, got)
		}
	}
	if bAfter, _ := versionsOf(st, "n00"); bAfter["service/ns/b"] != bBefore["service/ns/b"] {
		t.Error("an unselected Service changed")
	}
	if got := len(e.ServicesSelected(r)); got != 1 {
		t.Errorf("ServicesSelected = %d, want 1 (a; own names its own scheduler)", got)
	}

	// Succeeded reaches every selected node; RolledBack none.
	for _, tc := range []struct {
		phase v1alpha1.Phase
		want  int
	}{{v1alpha1.PhaseSucceeded, 16}, {v1alpha1.PhaseRolledBack, 0}} {
		r2 := *r
		r2.Phase = tc.phase
		c = changes()
		setRollout(c, &r2)
		apply(t, e, c)
		n := 0
		for i := range nodes {
			if schedulerOf(t, st, fmt.Sprintf("n%02d", i), "service/ns/a") == "mh" {
				n++
			}
		}
		if n != tc.want {
			t.Errorf("phase %s: %d nodes run mh, want %d", tc.phase, n, tc.want)
		}
	}

	// A node joining the general pool below the threshold is reached.
	r3 := *r
	c = changes()
	setRollout(c, &r3)
	for i := 0; ; i++ {
		n := fmt.Sprintf("late%d", i)
		if model.Position("uid-1", n) < r.Threshold {
			c.Nodes[n] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: n, Labels: map[string]string{"pool": "general"}}}}
			apply(t, e, c)
			if got := schedulerOf(t, st, n, "service/ns/a"); got != "mh" {
				t.Fatalf("joining node below the threshold: scheduler %q, want mh", got)
			}
			break
		}
	}
}
