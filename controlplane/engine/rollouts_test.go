package engine

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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

// A rollout step recomputes the selected Services on the nodes it reached
// (or left) only, and the result is what an engine computing everything
// from scratch holds, through steps, a pause, a newer rollout layered over
// (everything recomputed), success and rollback.
func TestRolloutStepRecomputesOnlyReassignedNodes(t *testing.T) {
	const nodes, services = 20, 30
	pools := map[string]string{} // nodes moved to another pool
	node := func(n string, i int) watch.Change[model.Node] {
		pool := "general"
		if i >= 16 {
			pool = "gpu"
		}
		if p, ok := pools[n]; ok {
			pool = p
		}
		return watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: n, Labels: map[string]string{"pool": pool}}}}
	}
	base := func() *watch.Changes {
		c := changes()
		for i := range nodes {
			n := fmt.Sprintf("n%02d", i)
			c.Nodes[n] = node(n, i)
		}
		for i := range services {
			name := fmt.Sprintf("s%02d", i)
			setService(c, name, fmt.Sprintf("198.18.0.%d", i+1), time.Time{})
			c.Services[model.ServiceKey{Namespace: "ns", Name: name}].Current.Value.Labels = map[string]string{"app": "a"}
			// Endpoints on two nodes: those nodes get variants of their own.
			setSlice(c, name, name+"-1", time.Time{},
				model.Endpoint{Address: netip.MustParseAddr(fmt.Sprintf("198.19.0.%d", i+1)), NodeName: fmt.Sprintf("n%02d", i%nodes), Ready: true, Serving: true},
				model.Endpoint{Address: netip.MustParseAddr(fmt.Sprintf("198.19.1.%d", i+1)), NodeName: fmt.Sprintf("n%02d", (i+7)%nodes), Ready: true, Serving: true})
		}
		setService(c, "other", "198.18.1.1", time.Time{})
		return c
	}
	allVersions := func(st *snapshot.Store) map[string]map[string]string {
		out := map[string]map[string]string{}
		for i := range nodes {
			n := fmt.Sprintf("n%02d", i)
			out[n], _ = versionsOf(st, n)
		}
		return out
	}
	// fromScratch is what a replica starting now computes.
	fromScratch := func(rollouts map[string]*model.Rollout) map[string]map[string]string {
		e, st, _ := newEngine(t)
		c := base()
		for _, r := range rollouts {
			setRollout(c, r)
		}
		apply(t, e, c)
		return allVersions(st)
	}

	e, st, _ := newEngine(t)
	apply(t, e, base())
	sel, _ := labels.Parse("app=a")
	nodeSel, _ := labels.Parse("pool=general")
	first := &model.Rollout{Name: "to-mh", UID: "uid-1", Created: 1, Scheduler: "mh", ServiceSelector: sel, NamespaceSelector: labels.Everything(),
		NodeSelector: nodeSel, Phase: v1alpha1.PhaseProgressing}
	newer := &model.Rollout{Name: "to-sh", UID: "uid-2", Created: 2, Scheduler: "sh", ServiceSelector: sel, NamespaceSelector: labels.Everything(),
		NodeSelector: labels.Everything(), Phase: v1alpha1.PhaseProgressing, Threshold: model.PositionSpace / 3}
	with := func(r *model.Rollout, phase v1alpha1.Phase, threshold int64) *model.Rollout {
		out := *r
		out.Phase, out.Threshold = phase, threshold
		return &out
	}
	active := map[string]*model.Rollout{}
	steps := []struct {
		what string
		r    *model.Rollout
		step bool // only the node set changes
		// relabel moves a node the rollout reached out of its node selector.
		relabel bool
	}{
		{"step 1/4", with(first, v1alpha1.PhaseProgressing, model.PositionSpace/4), false, false}, // the Services' rollouts change
		{"step 2/4", with(first, v1alpha1.PhaseProgressing, model.PositionSpace/2), true, false},
		{"paused", with(first, v1alpha1.PhasePaused, model.PositionSpace/2), true, false},
		{"step 3/4", with(first, v1alpha1.PhaseProgressing, model.PositionSpace/4*3), true, false},
		{"a reached node leaves the pool", with(first, v1alpha1.PhaseProgressing, model.PositionSpace/4*3), true, true},
		{"newer rollout", newer, false, false},
		{"newer's step", with(newer, v1alpha1.PhaseProgressing, model.PositionSpace/3*2), true, false},
		{"succeeded", with(first, v1alpha1.PhaseSucceeded, model.PositionSpace/4*3), true, false},
		{"rolled back", with(first, v1alpha1.PhaseRolledBack, model.PositionSpace/4*3), false, false},
	}
	for _, s := range steps {
		before := allVersions(st)
		translated := counterValue(t, e.translations)
		reachedBefore := map[string]bool{}
		for _, n := range e.RolloutNodes(s.r.Name) {
			reachedBefore[n] = true
		}
		c := changes()
		setRollout(c, s.r)
		if s.relabel {
			left := e.RolloutNodes(s.r.Name)
			if len(left) == 0 {
				t.Fatalf("%s: the rollout reached no node", s.what)
			}
			pools[left[0]] = "gpu"
			i := 0
			fmt.Sscanf(left[0], "n%d", &i)
			c.Nodes[left[0]] = node(left[0], i)
		}
		apply(t, e, c)
		active[s.r.Name] = s.r

		if want, got := fromScratch(active), allVersions(st); !maps.EqualFunc(want, got, maps.Equal) {
			t.Fatalf("%s: the engine holds\n%v\nfrom scratch:\n%v", s.what, got, want)
		}
		if !s.step {
			continue
		}
		moved := map[string]bool{}
		for _, n := range e.RolloutNodes(s.r.Name) {
			if !reachedBefore[n] {
				moved[n] = true
			}
		}
		for n := range reachedBefore {
			if !slices.Contains(e.RolloutNodes(s.r.Name), n) {
				moved[n] = true
			}
		}
		after := allVersions(st)
		for n, vs := range after {
			if !moved[n] && !maps.Equal(vs, before[n]) {
				t.Errorf("%s: %s was not reached or left, but its resources changed", s.what, n)
			}
		}
		// Only the node-specific variants of the moved nodes are translated
		// (Service i has endpoints on nodes i and i+7): the shared ones
		// are cached from before the step.
		want := 0
		for i := range services {
			for _, hosting := range []int{i % nodes, (i + 7) % nodes} {
				if moved[fmt.Sprintf("n%02d", hosting)] {
					want++
				}
			}
		}
		if got := counterValue(t, e.translations) - translated; got != float64(want) {
			t.Errorf("%s: %v translations for %d moved nodes x %d Services, want %d (the moved nodes' own variants)", s.what, got, len(moved), services, want)
		}
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// Random steps of two layered rollouts over Services with zone-hinted
// endpoints (variant keys of two parts, "zone/z0;rollout/new") and a local
// endpoint, nodes relabelled out of and into the older rollout's pool and
// added; after every step the store equals a fresh engine's. Steps keep
// each Service's cached shared variants (recomputeOn): a stale one shows
// here.
func TestRandomRolloutStepsMatchAFreshEngine(t *testing.T) {
	const nodes = 12
	rng := rand.New(rand.NewPCG(3, 4))
	pools := map[string]string{}
	present := map[string]bool{}
	node := func(n string, i int) watch.Change[model.Node] {
		return watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: n, Zone: fmt.Sprintf("z%d", i%3), Labels: map[string]string{"pool": pools[n]}}}}
	}
	for i := range nodes {
		pools[fmt.Sprintf("n%02d", i)] = "general"
		present[fmt.Sprintf("n%02d", i)] = i < nodes-2
	}
	base := func() *watch.Changes {
		c := changes()
		for i := range nodes {
			n := fmt.Sprintf("n%02d", i)
			if present[n] {
				c.Nodes[n] = node(n, i)
			}
		}
		for i := range 4 {
			name := fmt.Sprintf("s%d", i)
			setService(c, name, fmt.Sprintf("198.18.0.%d", i+1), time.Time{})
			c.Services[model.ServiceKey{Namespace: "ns", Name: name}].Current.Value.Labels = map[string]string{"app": "a"}
			var eps []model.Endpoint
			for z := range 2 {
				ep := ready(fmt.Sprintf("198.19.%d.%d", z, i+1), "elsewhere")
				ep.ForZones = []string{fmt.Sprintf("z%d", z)}
				eps = append(eps, ep)
			}
			if i%2 == 0 {
				eps = append(eps, model.Endpoint{Address: netip.MustParseAddr(fmt.Sprintf("198.19.9.%d", i+1)), NodeName: fmt.Sprintf("n%02d", i), Ready: true, Serving: true, ForZones: []string{"z0"}})
			}
			setSlice(c, name, name+"-1", time.Time{}, eps...)
		}
		return c
	}
	sel, _ := labels.Parse("app=a")
	gen, _ := labels.Parse("pool=general")
	older := &model.Rollout{Name: "old", UID: "u1", Created: 1, Scheduler: "mh", ServiceSelector: sel, NamespaceSelector: labels.Everything(), NodeSelector: gen, Phase: v1alpha1.PhaseProgressing}
	newer := &model.Rollout{Name: "new", UID: "u2", Created: 2, Scheduler: "sh", ServiceSelector: sel, NamespaceSelector: labels.Everything(), NodeSelector: labels.Everything(), Phase: v1alpha1.PhaseProgressing}
	active := map[string]*model.Rollout{}
	scratch := func() map[string]map[string]string {
		e, st, _ := newEngine(t)
		c := base()
		for _, r := range active {
			setRollout(c, r)
		}
		apply(t, e, c)
		var ns []string
		for n, ok := range present {
			if ok {
				ns = append(ns, n)
			}
		}
		return versions(st, ns...)
	}
	e, st, _ := newEngine(t)
	apply(t, e, base())
	for step := range 60 {
		c := changes()
		for _, r := range []*model.Rollout{older, newer} {
			if rng.IntN(2) == 0 {
				cp := *r
				cp.Threshold = rng.Int64N(model.PositionSpace)
				if rng.IntN(8) == 0 {
					cp.Phase = v1alpha1.PhaseSucceeded
				}
				setRollout(c, &cp)
				active[r.Name] = &cp
			}
		}
		if rng.IntN(3) == 0 {
			i := rng.IntN(nodes)
			n := fmt.Sprintf("n%02d", i)
			if pools[n] == "general" {
				pools[n] = "gpu"
			} else {
				pools[n] = "general"
			}
			present[n] = true
			c.Nodes[n] = node(n, i)
		}
		apply(t, e, c)
		var ns []string
		for n, ok := range present {
			if ok {
				ns = append(ns, n)
			}
		}
		if got, want := versions(st, ns...), scratch(); !maps.EqualFunc(got, want, maps.Equal) {
			t.Fatalf("step %d: got %v\nwant %v", step, got, want)
		}
	}
}
