package engine

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
)

// Scale of the benchmark cluster.
const (
	benchServices  = 10000
	benchEndpoints = 10
	benchNodes     = 1000
)

type benchCluster struct {
	eng       *Engine
	store     *snapshot.Store
	heapBytes uint64 // heap held by engine+store for the full state
	setupTook time.Duration
}

var (
	benchOnce sync.Once
	benchC    *benchCluster
)

// benchAddr returns a distinct-enough address inside 198.18.0.0/15.
func benchAddr(hi byte, k int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, hi, byte(k >> 8), byte(k)})
}

func benchSlice(s, gen int) *model.EndpointSlice {
	return sizedSlice(s, gen, benchEndpoints, benchNodes)
}

// sizedSlice is Service s's slice of endpoints addresses, spread over the
// nodes round-robin; gen shifts the addresses (a change).
func sizedSlice(s, gen, endpoints, nodes int) *model.EndpointSlice {
	svc := model.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", s)}
	es := &model.EndpointSlice{Key: model.SliceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d-1", s)}, Service: svc, Family: model.IPv4,
		Ports: []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}}}
	for j := 0; j < endpoints; j++ {
		k := s*endpoints + j
		es.Endpoints = append(es.Endpoints, model.Endpoint{
			Address: benchAddr(19, (k+gen)%65536), NodeName: fmt.Sprintf("node-%d", k%nodes), Ready: true, Serving: true,
		})
	}
	return es
}

// builtState is an engine and store holding a generated cluster.
type builtState struct {
	eng       *Engine
	store     *snapshot.Store
	heapBytes uint64 // heap held by engine+store for the full state
	took      time.Duration
}

// buildState applies services ClusterIP Services with endpoints endpoints
// each, spread over nodes nodes, in one Apply (a replica's initial sync).
func buildState(tb testing.TB, services, endpoints, nodes int) builtState {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()

	st := snapshot.NewStore()
	eng, err := New(Config{}, st, zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	ch := &watch.Changes{
		Services: map[model.ServiceKey]watch.Change[model.Service]{},
		Slices:   map[model.SliceKey]watch.Change[model.EndpointSlice]{},
		Nodes:    map[string]watch.Change[model.Node]{},
	}
	for n := 0; n < nodes; n++ {
		name := fmt.Sprintf("node-%d", n)
		// Each Node with its own trigger, as the watcher gives them (the
		// time each event arrived).
		ch.Nodes[name] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{
			Name: name, Addresses: []netip.Addr{benchAddr(18, 0xff00+n%256)}}}, Trigger: time.Unix(1_000_000, int64(n))}
	}
	for s := 0; s < services; s++ {
		k := model.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", s)}
		ch.Services[k] = watch.Change[model.Service]{Current: &watch.Observed[model.Service]{Value: &model.Service{
			Key: k, ClusterIPs: []netip.Addr{benchAddr(18, s)},
			Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}},
		}}}
		es := sizedSlice(s, 0, endpoints, nodes)
		ch.Slices[es.Key] = watch.Change[model.EndpointSlice]{Current: &watch.Observed[model.EndpointSlice]{Value: es}}
	}
	if err := eng.Apply(context.Background(), ch); err != nil {
		tb.Fatal(err)
	}
	ch = nil
	took := time.Since(start)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return builtState{eng: eng, store: st, heapBytes: after.HeapAlloc - before.HeapAlloc, took: took}
}

func benchSetup(b *testing.B) *benchCluster {
	benchOnce.Do(func() {
		s := buildState(b, benchServices, benchEndpoints, benchNodes)
		benchC = &benchCluster{eng: s.eng, store: s.store, heapBytes: s.heapBytes, setupTook: s.took}
	})
	if benchC == nil {
		b.Fatal("setup failed earlier")
	}
	return benchC
}

// BenchmarkEndpointChange measures one EndpointSlice change (one endpoint
// address replaced) end to end: model update -> translate (once per variant)
// -> store commit for all 1,000 nodes. It also reports the heap held by the
// full state (engine model + store) for 10,000 Services x 10 endpoints x
// 1,000 nodes.
func BenchmarkEndpointChange(b *testing.B) {
	c := benchSetup(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := i % benchServices
		es := benchSlice(s, 1+i/benchServices) // shifts one endpoint's address
		ch := &watch.Changes{Slices: map[model.SliceKey]watch.Change[model.EndpointSlice]{
			es.Key: {Current: &watch.Observed[model.EndpointSlice]{Value: es}, Trigger: time.Unix(int64(i), 0)}}}
		if err := c.eng.Apply(ctx, ch); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// After the loop: ResetTimer would discard these.
	st := c.store.Stats()
	b.ReportMetric(float64(c.heapBytes), "state-heap-bytes")
	b.ReportMetric(float64(c.heapBytes)/benchNodes, "state-heap-bytes/node")
	b.ReportMetric(float64(st.Distinct), "distinct-values")
	b.ReportMetric(float64(st.Slots), "node-slots")
	b.ReportMetric(float64(st.Exceptions), "per-node-exceptions")
	b.ReportMetric(c.setupTook.Seconds(), "initial-sync-s")
}

// BenchmarkEndpointChangeNaive is the baseline: the same change translated
// and hashed separately for every node (what a per-node computation costs),
// without the store. Compare ns/op with BenchmarkEndpointChange.
func BenchmarkEndpointChangeNaive(b *testing.B) {
	nodes := make([]*model.Node, benchNodes)
	for n := range nodes {
		nodes[n] = &model.Node{Name: fmt.Sprintf("node-%d", n)}
	}
	svc := &model.Service{Key: model.ServiceKey{Namespace: "bench", Name: "svc-0"}, ClusterIPs: []netip.Addr{benchAddr(18, 0)},
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}}}
	cfg := translate.Config{}.WithDefaults()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		in := translate.Input{Service: svc, Slices: []*model.EndpointSlice{benchSlice(0, i)}}
		for _, n := range nodes {
			if _, err := snapshot.NewServiceResource(translate.Service(in, n, cfg)); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkPeriodicResync measures the hourly self-check at full scale: the
// longest single Apply (how long a real change can wait behind it) and the
// whole resync, done at once (the baseline: every Service in one Apply)
// and in chunks of DefaultResyncSlotsPerApply (what the engine does). Run
// with -benchtime 1x; each iteration does both.
func BenchmarkPeriodicResync(b *testing.B) {
	c := benchSetup(b)
	ctx := context.Background()
	run := func(slots int) (longest, total time.Duration, applies int) {
		c.eng.mu.Lock()
		c.eng.cfg.ResyncSlotsPerApply = slots
		c.eng.mu.Unlock()
		start := time.Now()
		ch := &watch.Changes{Periodic: true}
		for {
			t := time.Now()
			if err := c.eng.Apply(ctx, ch); err != nil {
				b.Fatal(err)
			}
			longest = max(longest, time.Since(t))
			applies++
			if !c.eng.Pending() {
				return longest, time.Since(start), applies
			}
			ch = &watch.Changes{}
		}
	}
	var onceLongest, onceTotal, chunkLongest, chunkTotal time.Duration
	var chunkApplies int
	for i := 0; i < b.N; i++ {
		l, t, _ := run(benchServices * benchNodes)
		onceLongest, onceTotal = max(onceLongest, l), onceTotal+t
		l, t, n := run(DefaultResyncSlotsPerApply)
		chunkLongest, chunkTotal, chunkApplies = max(chunkLongest, l), chunkTotal+t, n
	}
	b.ReportMetric(onceLongest.Seconds(), "at-once-longest-apply-s")
	b.ReportMetric(onceTotal.Seconds()/float64(b.N), "at-once-total-s")
	b.ReportMetric(chunkLongest.Seconds(), "chunked-longest-apply-s")
	b.ReportMetric(chunkTotal.Seconds()/float64(b.N), "chunked-total-s")
	b.ReportMetric(float64(chunkApplies), "chunked-applies")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkRolloutStep measures a scheduler rollout over every Service of
// the 10,000 Services x 1,000 nodes cluster, stepping 10% of the nodes at a
// time, against a full resync of the same state in the same run: CPU time
// and bytes allocated per step and per resync, and their ratio (goal: a
// step costs at most a tenth of a resync).
func BenchmarkRolloutStep(b *testing.B) {
	c := benchSetup(b)
	ctx := context.Background()
	measure := func(ch *watch.Changes) (time.Duration, uint64) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		for {
			if err := c.eng.Apply(ctx, ch); err != nil {
				b.Fatal(err)
			}
			if !c.eng.Pending() {
				break
			}
			ch = &watch.Changes{}
		}
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		return took, after.TotalAlloc - before.TotalAlloc
	}
	rollout := func(phase v1alpha1.Phase, tenths int64) *watch.Changes {
		r := &model.Rollout{Name: "bench", UID: "bench-uid", Created: 1, Scheduler: "mh", ServiceSelector: labels.Everything(),
			NamespaceSelector: labels.Everything(), NodeSelector: labels.Everything(), Phase: phase, Threshold: model.PositionSpace / 10 * tenths}
		return &watch.Changes{Rollouts: map[string]watch.Change[model.Rollout]{r.Name: {Current: &watch.Observed[model.Rollout]{Value: r}}}}
	}
	c.eng.mu.Lock()
	c.eng.cfg.ResyncSlotsPerApply = benchServices * benchNodes // the resync in one Apply
	c.eng.mu.Unlock()
	var stepTime, resyncTime time.Duration
	var stepBytes, resyncBytes uint64
	steps := 0
	for i := 0; i < b.N; i++ {
		measure(rollout(v1alpha1.PhaseProgressing, 1)) // the Services' rollouts change: everything
		for tenths := int64(2); tenths <= 9; tenths++ {
			d, n := measure(rollout(v1alpha1.PhaseProgressing, tenths))
			stepTime, stepBytes, steps = stepTime+d, stepBytes+n, steps+1
		}
		d, n := measure(&watch.Changes{Periodic: true})
		resyncTime, resyncBytes = resyncTime+d, resyncBytes+n
		measure(rollout(v1alpha1.PhaseRolledBack, 9))
	}
	// Leave the shared cluster as it was.
	measure(&watch.Changes{Rollouts: map[string]watch.Change[model.Rollout]{"bench": {}}})
	c.eng.mu.Lock()
	c.eng.cfg.ResyncSlotsPerApply = DefaultResyncSlotsPerApply
	c.eng.mu.Unlock()

	step, resync := stepTime.Seconds()/float64(steps), resyncTime.Seconds()/float64(b.N)
	b.ReportMetric(step, "step-s")
	b.ReportMetric(float64(stepBytes)/float64(steps), "step-alloc-bytes")
	b.ReportMetric(resync, "resync-s")
	b.ReportMetric(float64(resyncBytes)/float64(b.N), "resync-alloc-bytes")
	b.ReportMetric(step/resync, "step/resync-time")
	b.ReportMetric(float64(stepBytes)/float64(steps)/(float64(resyncBytes)/float64(b.N)), "step/resync-bytes")
	b.ReportMetric(0, "ns/op")
}
