package engine

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func newEngine(t *testing.T) (*Engine, *snapshot.Store, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	st := snapshot.NewStore()
	e, err := New(Config{Metrics: reg}, st, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return e, st, reg
}

func changes() *watch.Changes {
	return &watch.Changes{
		Services: map[model.ServiceKey]watch.Change[model.Service]{},
		Slices:   map[model.SliceKey]watch.Change[model.EndpointSlice]{},
		Nodes:    map[string]watch.Change[model.Node]{},
		Rollouts: map[string]watch.Change[model.Rollout]{},
	}
}

func addNode(c *watch.Changes, name string) {
	c.Nodes[name] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: name}}, Trigger: time.Unix(1, 0)}
}

func delNode(c *watch.Changes, name string) {
	c.Nodes[name] = watch.Change[model.Node]{Previous: &watch.Observed[model.Node]{Value: &model.Node{Name: name}}}
}

func setService(c *watch.Changes, name, clusterIP string, trig time.Time) {
	k := model.ServiceKey{Namespace: "ns", Name: name}
	c.Services[k] = watch.Change[model.Service]{Trigger: trig, Current: &watch.Observed[model.Service]{Value: &model.Service{
		Key: k, ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)},
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}},
	}}}
}

func setSlice(c *watch.Changes, svc, slice string, trig time.Time, eps ...model.Endpoint) {
	k := model.SliceKey{Namespace: "ns", Name: slice}
	c.Slices[k] = watch.Change[model.EndpointSlice]{Trigger: trig, Current: &watch.Observed[model.EndpointSlice]{Value: &model.EndpointSlice{
		Key: k, Service: model.ServiceKey{Namespace: "ns", Name: svc}, Family: model.IPv4,
		Ports: []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}}, Endpoints: eps,
	}}}
}

func ready(addr, node string) model.Endpoint {
	return model.Endpoint{Address: netip.MustParseAddr(addr), NodeName: node, Ready: true, Serving: true}
}

func apply(t *testing.T, e *Engine, c *watch.Changes) {
	t.Helper()
	if err := e.Apply(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, st *snapshot.Store, node, name string) *vsplanev1.Resource {
	t.Helper()
	r, ok := st.Get(node, name)
	if !ok {
		t.Fatalf("node %s has no %s", node, name)
	}
	return r
}

func listNames(st *snapshot.Store, node string) []string {
	rs, _, _ := st.List(node)
	var out []string
	for _, e := range rs {
		out = append(out, e.Resource.Name)
	}
	return out
}

// triggerOf is node's trigger time of name as the store reads it with the
// resource (zero if node does not hold it).
func triggerOf(st *snapshot.Store, node, name string) time.Time {
	found, _, _ := st.Lookup(node, []string{name})
	if len(found) == 0 {
		return time.Time{}
	}
	return found[0].Trigger
}

func TestSharedVariantsAndLocalFlags(t *testing.T) {
	e, st, reg := newEngine(t)
	c := changes()
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		addNode(c, n)
	}
	trig := time.Unix(50, 0)
	setService(c, "web", "198.18.0.10", trig)
	setSlice(c, "web", "web-1", time.Unix(40, 0), ready("198.19.1.5", "n1"), ready("198.19.2.5", "n2"))
	apply(t, e, c)

	const name = "service/ns/web"
	r1, r2, r3, r4 := get(t, st, "n1", name), get(t, st, "n2", name), get(t, st, "n3", name), get(t, st, "n4", name)
	if r3 != r4 {
		t.Error("nodes without endpoints do not share the common value")
	}
	if r1 == r3 || r2 == r3 || r1 == r2 {
		t.Error("nodes hosting endpoints must have their own variants")
	}
	if !r1.GetService().VirtualServers[0].RealServers[0].Local || r3.GetService().VirtualServers[0].RealServers[0].Local {
		t.Error("local flags wrong")
	}
	// 3 translations: common, n1, n2 — not one per node.
	if got := gathered(t, reg, metricTranslations, nil); got != 3 {
		t.Errorf("translations = %v, want 3", got)
	}
	// A new node's resources carry the node's trigger time.
	if got := triggerOf(st, "n3", name); !got.Equal(time.Unix(1, 0)) {
		t.Errorf("trigger %v", got)
	}
	if diff := cmp.Diff([]string{"node/settings", name}, listNames(st, "n1")); diff != "" {
		t.Errorf("n1 resources (-want +got):\n%s", diff)
	}

	// An endpoint change on n2: n1, n3, n4 keep their values untouched.
	sub3 := st.Subscribe("n3")
	defer sub3.Close()
	c = changes()
	setSlice(c, "web", "web-1", time.Unix(60, 0), ready("198.19.1.5", "n1"), ready("198.19.2.6", "n2"))
	apply(t, e, c)
	// Earliest trigger of the changes behind the new value.
	if got := triggerOf(st, "n3", name); !got.Equal(time.Unix(60, 0)) {
		t.Errorf("trigger %v", got)
	}
	if n1 := get(t, st, "n1", name); n1 == r1 {
		t.Error("n1 should see the new remote endpoint")
	}
	if diff := cmp.Diff([]string{name}, sub3.Drain()); diff != "" {
		t.Errorf("n3 notified (-want +got):\n%s", diff)
	}
	if a, b := get(t, st, "n3", name), get(t, st, "n4", name); a != b {
		t.Error("common value not shared after change")
	}

	// A node joining gets node/settings and the shared common value without a new translation.
	before := gathered(t, reg, metricTranslations, nil)
	c = changes()
	addNode(c, "n5")
	apply(t, e, c)
	if get(t, st, "n5", name) != get(t, st, "n3", name) {
		t.Error("new node does not share the common value")
	}
	if got := gathered(t, reg, metricTranslations, nil); got != before {
		t.Errorf("joining node cost %v translations", got-before)
	}
	get(t, st, "n5", snapshot.NodeSettingsName)

	// A node leaving is forgotten.
	c = changes()
	delNode(c, "n5")
	apply(t, e, c)
	if _, _, ok := st.List("n5"); ok {
		t.Error("deleted node still known")
	}
	if got := e.Counts(); got != (Counts{Services: 1, Nodes: 4}) {
		t.Errorf("counts %+v", got)
	}
	// One apply-duration observation per Apply.
	if got := gathered(t, reg, metricApply, nil); got != 4 {
		t.Errorf("%s count = %v, want 4 (one per Apply)", metricApply, got)
	}
}

func TestServiceDeleteAndSliceMove(t *testing.T) {
	e, st, _ := newEngine(t)
	c := changes()
	addNode(c, "n1")
	setService(c, "a", "198.18.0.1", time.Time{})
	setService(c, "b", "198.18.0.2", time.Time{})
	setSlice(c, "a", "s1", time.Time{}, ready("198.19.1.5", "n2"))
	apply(t, e, c)
	if rs := get(t, st, "n1", "service/ns/a").GetService().VirtualServers[0].RealServers; len(rs) != 1 {
		t.Fatalf("a real servers %v", rs)
	}
	// The slice's service label changes from a to b.
	c = changes()
	setSlice(c, "b", "s1", time.Time{}, ready("198.19.1.5", "n2"))
	apply(t, e, c)
	if rs := get(t, st, "n1", "service/ns/a").GetService().VirtualServers[0].RealServers; len(rs) != 0 {
		t.Errorf("a still has real servers %v", rs)
	}
	if rs := get(t, st, "n1", "service/ns/b").GetService().VirtualServers[0].RealServers; len(rs) != 1 {
		t.Errorf("b real servers %v", rs)
	}
	// Deleting Service a removes it from the node; b stays.
	c = changes()
	c.Services[model.ServiceKey{Namespace: "ns", Name: "a"}] = watch.Change[model.Service]{}
	apply(t, e, c)
	if diff := cmp.Diff([]string{"node/settings", "service/ns/b"}, listNames(st, "n1")); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
	if _, ok := e.services[model.ServiceKey{Namespace: "ns", Name: "a"}]; ok {
		t.Error("entry of deleted service kept")
	}
}

func TestInvalidObjects(t *testing.T) {
	e, st, reg := newEngine(t)
	c := changes()
	addNode(c, "n1")
	setService(c, "good", "198.18.0.1", time.Time{})
	bad := model.ServiceKey{Namespace: "ns", Name: "bad"}
	c.Services[bad] = watch.Change[model.Service]{Current: &watch.Observed[model.Service]{Problems: []model.Problem{
		{Kind: "Service", Object: "ns/bad", Reason: model.ReasonBadIP, Detail: "no usable cluster IP"}}}}
	// A slice with a dropped endpoint: the rest is used and the problem shown.
	setSlice(c, "good", "g1", time.Time{}, ready("198.19.1.5", "n2"))
	sk := model.SliceKey{Namespace: "ns", Name: "g1"}
	ch := c.Slices[sk]
	ch.Current.Problems = []model.Problem{{Kind: "EndpointSlice", Object: "ns/g1", Reason: model.ReasonFamilyMismatch, Detail: "endpoints[1]", Dropped: true}}
	c.Slices[sk] = ch
	apply(t, e, c)

	if _, ok := st.Get("n1", "service/ns/bad"); ok {
		t.Error("invalid service programmed")
	}
	good := get(t, st, "n1", "service/ns/good").GetService()
	if len(good.VirtualServers[0].RealServers) != 1 || len(good.Problems) != 1 {
		t.Errorf("good service: %v", good)
	}
	if p := e.Problems(bad); len(p) != 1 || p[0].Reason != model.ReasonBadIP {
		t.Errorf("problems of bad: %v", p)
	}
	if got := len(e.AllProblems()); got != 2 {
		t.Errorf("AllProblems has %d services, want 2", got)
	}
	if got := gathered(t, reg, metricInvalid, map[string]string{"kind": "Service", "reason": "bad_ip"}); got != 1 {
		t.Errorf("invalid Services (bad_ip) = %v, want 1", got)
	}
	if got := gathered(t, reg, metricInvalid, map[string]string{"kind": "EndpointSlice", "reason": "family_mismatch"}); got != 1 {
		t.Errorf("invalid EndpointSlices (family_mismatch) = %v, want 1", got)
	}
	// Fixing the service clears its problems and programs it.
	c = changes()
	setService(c, "bad", "198.18.0.3", time.Time{})
	apply(t, e, c)
	get(t, st, "n1", "service/ns/bad")
	if p := e.Problems(bad); p != nil {
		t.Errorf("problems after fix: %v", p)
	}
}

func TestPeriodicResyncIsQuiet(t *testing.T) {
	e, st, _ := newEngine(t)
	c := changes()
	addNode(c, "n1")
	setService(c, "a", "198.18.0.1", time.Time{})
	apply(t, e, c)
	sub := st.Subscribe("n1")
	defer sub.Close()
	apply(t, e, &watch.Changes{Periodic: true})
	if got := sub.Drain(); got != nil {
		t.Errorf("periodic resync changed %v", got)
	}
}

// gathered reads a counter's value or a histogram's sample count from reg,
// the way a scrape sees it: by the exposed name and exactly these labels. A
// missing series fails the test (an unregistered metric reads as missing,
// never as zero).
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if !maps.Equal(got, labels) {
				continue
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount())
			default:
				t.Fatalf("%s: unexpected type %v", name, mf.GetType())
			}
		}
		t.Fatalf("%s has no series %v", name, labels)
	}
	t.Fatalf("%s is not registered", name)
	return 0
}

const (
	metricTranslations = "vsplane_controlplane_translations_total"
	metricInvalid      = "vsplane_controlplane_invalid_objects_total"
	metricApply        = "vsplane_controlplane_apply_seconds"
)

func counter(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func TestNodeUpdate(t *testing.T) {
	e, st, _ := newEngine(t)
	c := changes()
	addNode(c, "n1")
	setService(c, "a", "198.18.0.1", time.Time{})
	apply(t, e, c)
	if ips := get(t, st, "n1", snapshot.NodeSettingsName).GetNodeSettings().NodeIps; len(ips) != 0 {
		t.Fatalf("node ips %v", ips)
	}
	c = changes()
	c.Nodes["n1"] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{
		Name: "n1", Zone: "z1", Addresses: []netip.Addr{netip.MustParseAddr("198.19.0.11")}}}}
	apply(t, e, c)
	ns := get(t, st, "n1", snapshot.NodeSettingsName).GetNodeSettings()
	if diff := cmp.Diff([]string{"198.19.0.11"}, ns.NodeIps); diff != "" || ns.Zone != "z1" || ns.DefaultScheduler != "rr" {
		t.Errorf("node settings %v", ns)
	}
	// The zone change refilled the node; its Services are still there.
	get(t, st, "n1", "service/ns/a")
}

// Nodes sharing a non-"" variant key (here: a hinted zone) share one
// translation and one value too.
func TestZoneVariantsTranslatedOncePerZone(t *testing.T) {
	e, st, reg := newEngine(t)
	c := changes()
	zones := map[string]string{"e1": "z1", "e2": "z2", "z1a": "z1", "z1b": "z1", "z2a": "z2", "z2b": "z2"}
	for n, z := range zones {
		c.Nodes[n] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: n, Zone: z}}}
	}
	setService(c, "web", "198.18.0.10", time.Time{})
	hinted := func(addr, node, zone string) model.Endpoint {
		ep := ready(addr, node)
		ep.Zone, ep.ForZones = zone, []string{zone}
		return ep
	}
	setSlice(c, "web", "web-1", time.Time{}, hinted("198.19.1.5", "e1", "z1"), hinted("198.19.2.5", "e2", "z2"))
	apply(t, e, c)

	const name = "service/ns/web"
	if get(t, st, "z1a", name) != get(t, st, "z1b", name) || get(t, st, "z2a", name) != get(t, st, "z2b", name) {
		t.Error("nodes of one zone do not share their value")
	}
	if get(t, st, "z1a", name) == get(t, st, "z2a", name) {
		t.Error("zones z1 and z2 share a value although their hints differ")
	}
	if rs := get(t, st, "z1a", name).GetService().VirtualServers[0].RealServers; len(rs) != 1 || rs[0].Address != "198.19.1.5" {
		t.Errorf("zone z1 real servers %v, want only its own endpoint", rs)
	}
	// e1, e2 (they host endpoints), zone/z1, zone/z2.
	if got := gathered(t, reg, metricTranslations, nil); got != 4 {
		t.Errorf("translations = %v, want 4 (one per distinct key)", got)
	}
}

// A periodic resync rechecks every Service, a bounded chunk per Apply, and
// repairs what is wrong in the store on the way.
func TestPeriodicResyncInChunks(t *testing.T) {
	st := snapshot.NewStore()
	reg := prometheus.NewRegistry()
	e, err := New(Config{ResyncSlotsPerApply: 2, Metrics: reg}, st, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	c := changes()
	addNode(c, "n1")
	for i, name := range []string{"a", "b", "c", "d", "e"} {
		setService(c, name, fmt.Sprintf("198.18.0.%d", 10+i), time.Time{})
	}
	apply(t, e, c)
	if e.Pending() {
		t.Fatal("pending work without a periodic resync")
	}
	// Damage the store behind the engine's back: the resync must notice.
	var b snapshot.Batch
	b.Delete("n1", "service/ns/e")
	st.Commit(&b)

	translations := func() float64 { return gathered(t, reg, metricTranslations, nil) }
	before := translations()
	c = changes()
	c.Periodic = true
	apply(t, e, c)
	if got := translations() - before; got != 2 {
		t.Errorf("first resync chunk translated %v Services, want 2 (2 slots / 1 node)", got)
	}
	applies := 1
	for e.Pending() {
		if applies > 10 {
			t.Fatal("resync does not finish")
		}
		apply(t, e, changes())
		applies++
	}
	if applies != 3 || translations()-before != 5 {
		t.Errorf("resync took %d applies and %v translations, want 3 and 5", applies, translations()-before)
	}
	if _, ok := st.Get("n1", "service/ns/e"); !ok {
		t.Error("resync did not restore the damaged resource")
	}
}

// A node hosting an endpoint gets its own variant, but the parts equal to
// another variant's are the same messages (memory), and its content is
// exactly what a translation for that node alone gives.
func TestVariantsShareEqualParts(t *testing.T) {
	e, st, _ := newEngine(t)
	c := changes()
	for _, n := range []string{"n1", "n2", "n3"} {
		addNode(c, n)
	}
	setService(c, "web", "198.18.0.10", time.Unix(50, 0))
	setSlice(c, "web", "web-1", time.Unix(40, 0), ready("198.19.1.5", "n1"), ready("198.19.2.5", "n2"), ready("198.19.3.5", "n2"))
	apply(t, e, c)
	const name = "service/ns/web"
	r1, r3 := get(t, st, "n1", name).GetService(), get(t, st, "n3", name).GetService()
	vs1, vs3 := r1.VirtualServers[0], r3.VirtualServers[0]
	if vs1 == vs3 {
		t.Fatal("n1's virtual server marks its endpoint local; it cannot be n3's")
	}
	if !vs1.RealServers[0].Local || vs1.RealServers[1] != vs3.RealServers[1] || vs1.RealServers[2] != vs3.RealServers[2] {
		t.Errorf("n1: local endpoint not its own, or remote endpoints not shared with n3: %v", vs1.RealServers)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		se := e.services[model.ServiceKey{Namespace: "ns", Name: "web"}]
		want := translate.Service(se.in, e.nodes[n].node, e.cfg.Translate)
		if got := get(t, st, n, name).GetService(); !proto.Equal(got, want) {
			t.Errorf("%s: shared variant differs from its own translation:\n got %v\nwant %v", n, got, want)
		}
	}
}
