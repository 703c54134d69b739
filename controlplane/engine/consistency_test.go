package engine

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/watch"
)

// newSmallBatchEngine commits every maxBatch store writes, and calls
// afterCommit (with the store) after each commit.
func newSmallBatchEngine(t *testing.T, maxBatch int, afterCommit func(st *snapshot.Store)) (*Engine, *snapshot.Store) {
	t.Helper()
	var st *snapshot.Store
	st = snapshot.NewStoreWithOptions(snapshot.Options{AfterCommit: func(snapshot.CommitStats) { afterCommit(st) }})
	e, err := New(Config{Metrics: prometheus.NewRegistry(), MaxBatch: maxBatch}, st, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return e, st
}

func versionsOf(st *snapshot.Store, node string) (map[string]string, bool) {
	rs, _, ok := st.List(node)
	if !ok {
		return nil, false
	}
	out := make(map[string]string, len(rs))
	for _, e := range rs {
		out[e.Resource.GetName()] = e.Resource.GetVersion()
	}
	return out, true
}

// Initial sync of a replica (every node new) committed in many small
// chunks: after every commit, each node a reader can see holds all of its
// Services. Before nodes were staged, the first commit published every node
// with none or some of its Services, and a resuming agent was told to
// remove the rest.
func TestNodesBecomeVisibleOnlyComplete(t *testing.T) {
	const nodes, services = 5, 40
	commits, violations := 0, []string{}
	e, st := newSmallBatchEngine(t, 7, func(st *snapshot.Store) {
		commits++
		for _, n := range st.Nodes() {
			if got, _ := versionsOf(st, n); len(got) != services+1 {
				violations = append(violations, fmt.Sprintf("commit %d: node %s visible with %d of %d resources", commits, n, len(got), services+1))
			}
		}
	})
	c := changes()
	for i := range nodes {
		addNode(c, fmt.Sprintf("n%d", i))
	}
	for i := range services {
		name := fmt.Sprintf("svc%02d", i)
		setService(c, name, fmt.Sprintf("198.18.0.%d", 10+i), time.Unix(2, 0))
		setSlice(c, name, name+"-1", time.Unix(2, 0), ready(fmt.Sprintf("198.19.1.%d", 10+i), "n0"))
	}
	apply(t, e, c)
	if commits < 5 {
		t.Fatalf("only %d commits: the test must split the work into many small commits", commits)
	}
	for _, v := range violations {
		t.Error(v)
	}
	if got := len(st.Nodes()); got != nodes {
		t.Fatalf("%d nodes published, want %d", got, nodes)
	}

	// A node joining later is published whole too, and nodes already known
	// see nothing change.
	before, _ := versionsOf(st, "n1")
	c = changes()
	addNode(c, "n9")
	apply(t, e, c)
	if got, _ := versionsOf(st, "n9"); len(got) != services+1 {
		t.Fatalf("joined node has %d resources, want %d", len(got), services+1)
	}
	if after, _ := versionsOf(st, "n1"); !maps.Equal(before, after) {
		t.Fatal("a node joining changed another node's resources")
	}
	for _, v := range violations {
		t.Error(v)
	}
}

// A node whose zone changes is restaged: between commits readers see either
// its whole old state or its whole new state, never a mix.
func TestZoneChangeSwapsWholeState(t *testing.T) {
	const services = 30
	recording := false
	var seen []map[string]string
	e, st := newSmallBatchEngine(t, 5, func(st *snapshot.Store) {
		if recording {
			got, _ := versionsOf(st, "n1")
			seen = append(seen, got)
		}
	})
	zoneNode := func(c *watch.Changes, name, zone string) {
		c.Nodes[name] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: name, Zone: zone}}}
	}
	c := changes()
	for _, n := range []string{"n1", "n3", "n4"} {
		zoneNode(c, n, "zone-a")
	}
	zoneNode(c, "n2", "zone-b")
	for i := range services {
		name := fmt.Sprintf("svc%02d", i)
		setService(c, name, fmt.Sprintf("198.18.0.%d", 10+i), time.Time{})
		a, b := ready(fmt.Sprintf("198.19.1.%d", 10+i), "n1"), ready(fmt.Sprintf("198.19.2.%d", 10+i), "n2")
		a.ForZones, b.ForZones = []string{"zone-a"}, []string{"zone-b"}
		setSlice(c, name, name+"-1", time.Time{}, a, b)
	}
	apply(t, e, c)
	old, _ := versionsOf(st, "n1")
	recording = true
	c = changes()
	for _, n := range []string{"n1", "n3", "n4"} { // several nodes: several commits
		zoneNode(c, n, "zone-b")
	}
	apply(t, e, c)
	final, _ := versionsOf(st, "n1")
	if len(seen) < 3 {
		t.Fatalf("only %d commits: the test must split the work", len(seen))
	}
	for i, got := range seen {
		if !maps.Equal(got, old) && !maps.Equal(got, final) {
			t.Errorf("after commit %d a reader saw neither the old nor the new state: %d of %d resources old",
				i+1, countEqual(old, got), len(got))
		}
	}
	if changed := len(final) - countEqual(old, final); changed < services {
		t.Fatalf("%d resources changed with the zone, want at least %d", changed, services)
	}
}

func countEqual(a, b map[string]string) int {
	n := 0
	for k, v := range a {
		if b[k] == v {
			n++
		}
	}
	return n
}
