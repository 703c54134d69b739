package metrics

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/controlplane/stream"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func newTest(t *testing.T) (*ControlPlane, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// family returns the gathered family name (nil if absent).
func family(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// gauge returns the value of name's series with label node (any series when
// node is empty); it fails the test when there is none.
func gauge(t *testing.T, reg *prometheus.Registry, name, node string) float64 {
	t.Helper()
	for _, m := range family(t, reg, name).GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "node" && l.GetValue() != node {
				goto next
			}
		}
		return m.GetGauge().GetValue()
	next:
	}
	t.Fatalf("no series %s{node=%q}", name, node)
	return 0
}

// value reads a single counter.
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// histogram returns the sample count and sum of a histogram family in reg.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var h *dto.Histogram = mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return 0, 0
}

func TestAckObservesProgrammingLatencyForAppliedResources(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m, reg := newTest(t)
	var chained []string
	h := m.Hooks(stream.Hooks{OnAck: func(ev stream.AckEvent) { chained = append(chained, ev.Node) }})
	m.Track(fakeAgents{}, fakeDesired{res: map[string][]*vsplanev1.Resource{"a": nil, "b": nil}})

	// ACK: both resources observed, 2s and 3s after their triggers.
	h.OnAck(stream.AckEvent{Node: "a", Status: vsplanev1.AckStatus_ACK_STATUS_ACK,
		SentAt: base.Add(time.Second), ReceivedAt: base.Add(3 * time.Second),
		ApplyDuration:    50 * time.Millisecond,
		TriggerTimes:     map[string]time.Time{"svc/x": base.Add(time.Second), "svc/y": base, "svc/z": {}},
		KernelOperations: map[string]uint32{"ipvs_add_service": 2, "made-up kind": 7}})
	// NACK naming svc/x: only svc/y observed (4s).
	h.OnAck(stream.AckEvent{Node: "b", Status: vsplanev1.AckStatus_ACK_STATUS_NACK,
		SentAt: base.Add(time.Second), ReceivedAt: base.Add(4 * time.Second),
		TriggerTimes: map[string]time.Time{"svc/x": base, "svc/y": base},
		Errors:       []*vsplanev1.ResourceError{{Name: "svc/x", Message: "boom"}}})
	// NACK without resource errors: the whole Delta failed, nothing observed.
	h.OnAck(stream.AckEvent{Node: "b", Status: vsplanev1.AckStatus_ACK_STATUS_NACK,
		ReceivedAt: base.Add(time.Minute), TriggerTimes: map[string]time.Time{"svc/y": base}})

	n, sum := histogram(t, reg, "kubeproxy_network_programming_duration_seconds")
	if n != 3 || sum != 2+3+4 {
		t.Errorf("programming latency: count %d sum %v, want 3 and 9", n, sum)
	}
	n, sum = histogram(t, reg, "vsplane_controlplane_delta_queue_seconds")
	if n != 3 || sum != 0+1+1 {
		t.Errorf("queue time: count %d sum %v, want 3 and 2", n, sum)
	}
	if got := value(m.nacks.WithLabelValues("b")); got != 2 {
		t.Errorf("nacks{node=b} = %v, want 2", got)
	}
	// A node the cluster does not have gets no series of its own.
	h.OnAck(stream.AckEvent{Node: "ghost", Status: vsplanev1.AckStatus_ACK_STATUS_NACK, ReceivedAt: base})
	if got := value(m.nacks.WithLabelValues("unknown")); got != 1 {
		t.Errorf("nacks{node=unknown} = %v, want 1", got)
	}
	if got := value(m.acks); got != 4 {
		t.Errorf("acks = %v, want 4", got)
	}
	if got := value(m.kernelOps.WithLabelValues("other")); got != 7 {
		t.Errorf("kernel ops{kind=other} = %v, want 7 (unknown kinds are not labels)", got)
	}
	if got := value(m.kernelOps.WithLabelValues("ipvs_add_service")); got != 2 {
		t.Errorf("kernel ops = %v, want 2", got)
	}
	if n, _ := histogram(t, reg, "vsplane_controlplane_agent_apply_duration_seconds"); n != 1 {
		t.Errorf("agent apply observations = %d, want 1 (zero durations are not reported)", n)
	}
	if strings.Join(chained, ",") != "a,b,b,ghost" {
		t.Errorf("chained hook saw %v", chained)
	}
}

func TestDeltaSentCountsResourcesAndBytes(t *testing.T) {
	m, _ := newTest(t)
	h := m.Hooks(stream.Hooks{})
	d := &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{{Name: "a", Version: "1"}, {Name: "b", Version: "2"}},
		Removed: []string{"c"}}
	h.OnDeltaSent("n", d)
	h.OnDeltaSent("n", d)
	h.OnConnect(stream.ConnectEvent{Node: "n"})
	h.OnDisconnect("n", nil)
	for name, want := range map[string]float64{
		"deltas": 2, "resources": 4, "removed": 2, "bytes": float64(2 * proto.Size(d)), "connects": 1, "disconnects": 1,
	} {
		c := map[string]prometheus.Counter{"deltas": m.deltas, "resources": m.resources, "removed": m.removed,
			"bytes": m.bytes, "connects": m.connects, "disconnects": m.disconnects}[name]
		if got := value(c); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if proto.Size(d) == 0 {
		t.Fatal("test delta has zero size")
	}
}

type fakeAgents []*vsplanev1.AgentInfo

func (f fakeAgents) ListAgentsPending() []*vsplanev1.AgentInfo { return f }

type fakeDesired struct {
	res map[string][]*vsplanev1.Resource // by node
}

func (f fakeDesired) Has(node string) bool { _, ok := f.res[node]; return ok }

func TestAgentGaugesAtScrapeTime(t *testing.T) {
	m, reg := newTest(t)
	if got := gauge(t, reg, "vsplane_controlplane_connected_agents", ""); got != 0 {
		t.Errorf("connected before Track = %v, want 0", got)
	}
	desired := fakeDesired{
		res: map[string][]*vsplanev1.Resource{
			"a": {{Name: "x", Version: "1"}},
			"b": {{Name: "x", Version: "2"}, {Name: "y", Version: "1"}},
		},
	}
	agents := fakeAgents{
		{NodeName: "a"},
		{NodeName: "b", PendingResources: 2, Lag: durationpb.New(7 * time.Second)},
	}
	m.Track(agents, desired)
	for _, c := range []struct {
		name, node string
		want       float64
	}{
		{"vsplane_controlplane_connected_agents", "", 2},
		{"vsplane_controlplane_agent_pending_resources", "a", 0},
		{"vsplane_controlplane_agent_pending_resources", "b", 2},
		{"vsplane_controlplane_agent_lag_seconds", "a", 0},
		{"vsplane_controlplane_agent_lag_seconds", "b", 7},
	} {
		if got := gauge(t, reg, c.name, c.node); got != c.want {
			t.Errorf("%s{node=%q} = %v, want %v", c.name, c.node, got, c.want)
		}
	}
	// An agent of a node the cluster does not have gets no per-node series
	// (it still counts as connected).
	m.Track(append(agents, &vsplanev1.AgentInfo{NodeName: "ghost", PendingResources: 9}), desired)
	if got := gauge(t, reg, "vsplane_controlplane_connected_agents", ""); got != 3 {
		t.Errorf("connected = %v, want 3", got)
	}
	if n := len(family(t, reg, "vsplane_controlplane_agent_lag_seconds").GetMetric()); n != 2 {
		t.Errorf("lag series with an unknown node's agent = %d, want 2", n)
	}
	// Agent b disconnects: its series go with it.
	m.Track(agents[:1], desired)
	if n := len(family(t, reg, "vsplane_controlplane_agent_lag_seconds").GetMetric()); n != 1 {
		t.Errorf("lag series after disconnect = %d, want 1", n)
	}
}

func TestStreamEndsAreCountedByReason(t *testing.T) {
	m, _ := newTest(t)
	h := m.Hooks(stream.Hooks{})
	h.OnDisconnect("a", nil)
	h.OnDisconnect("a", status.Error(codes.Unavailable, "transport is closing"))
	h.OnReject(status.Error(codes.Unauthenticated, "no token"))
	h.OnReject(status.Error(codes.PermissionDenied, "other node"))
	for reason, want := range map[string]float64{"client_closed": 1, "transport": 1} {
		if got := value(m.closed.WithLabelValues(reason)); got != want {
			t.Errorf("closed{reason=%s} = %v, want %v", reason, got, want)
		}
	}
	for reason, want := range map[string]float64{"unauthenticated": 1, "permission_denied": 1} {
		if got := value(m.rejected.WithLabelValues(reason)); got != want {
			t.Errorf("rejected{reason=%s} = %v, want %v", reason, got, want)
		}
	}
}

func TestNewRejectsNilAndDuplicateRegistration(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	reg := prometheus.NewRegistry()
	if _, err := New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil {
		t.Error("second New on the same registry succeeded")
	}
}

func TestBucketsMatchKubeProxy(t *testing.T) {
	b := NetworkProgrammingBuckets()
	if len(b) != 2+59+12+7 || b[0] != 0.25 || b[2] != 1 || b[60] != 59 || b[61] != 60 || b[72] != 115 || b[73] != 120 || b[len(b)-1] != 300 {
		t.Errorf("buckets = %v", b)
	}
}
