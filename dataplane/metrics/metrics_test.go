package metrics

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fakeApplier struct {
	clk *clock
	ack *vsplanev1.Ack
}

func (f *fakeApplier) Apply(context.Context, *vsplanev1.Delta) *vsplanev1.Ack {
	f.clk.add(20 * time.Millisecond)
	return f.ack
}
func (f *fakeApplier) Versions() map[string]string { return map[string]string{"x": "1"} }

// series returns the gathered series of name whose labels include want.
func series(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue metric
				}
			}
			out = append(out, m)
		}
	}
	return out
}

func one(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	s := series(t, reg, name, labels)
	if len(s) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, labels, len(s))
	}
	return s[0]
}

func TestApplyRecordsSyncMetrics(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	stats := Stats{FullReconciles: 3, RepairsByKind: map[string]uint64{"ipvs_add_destination": 4}, FailedResources: 1,
		Draining: 2, DrainsCompleted: 5, DrainsTimedOut: 1, NoLocalEndpointsInternal: 3, NoLocalEndpointsExternal: 7}
	reg := prometheus.NewRegistry()
	m, err := New(reg, Options{Now: clk.now, Stats: func() Stats { return stats }})
	if err != nil {
		t.Fatal(err)
	}
	if s := series(t, reg, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", nil); len(s) != 0 {
		t.Errorf("last sync reported before any sync: %v", s)
	}
	inner := &fakeApplier{clk: clk, ack: &vsplanev1.Ack{Status: vsplanev1.AckStatus_ACK_STATUS_ACK,
		ApplyDuration: durationpb.New(5 * time.Millisecond), KernelOperations: map[string]uint32{"ipvs_add_service": 2}}}
	a := m.Wrap(inner)
	if v := a.Versions(); v["x"] != "1" {
		t.Errorf("Versions not forwarded: %v", v)
	}
	start := clk.now()
	a.Apply(context.Background(), &vsplanev1.Delta{})
	inner.ack = &vsplanev1.Ack{Status: vsplanev1.AckStatus_ACK_STATUS_NACK} // no duration: measured (20ms)
	a.Apply(context.Background(), &vsplanev1.Delta{})

	h := one(t, reg, "kubeproxy_sync_proxy_rules_duration_seconds", nil).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() < 0.0249 || h.GetSampleSum() > 0.0251 {
		t.Errorf("sync duration count %d sum %v, want 2 and 0.025", h.GetSampleCount(), h.GetSampleSum())
	}
	if got := one(t, reg, "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", nil).GetGauge().GetValue(); got != float64(start.Add(20*time.Millisecond).UnixNano())/1e9 {
		t.Errorf("last queued = %v", got)
	}
	if got := one(t, reg, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", nil).GetGauge().GetValue(); got != float64(clk.now().UnixNano())/1e9 {
		t.Errorf("last sync = %v, want %v", got, clk.now())
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vsplane_agent_kernel_operations_total", map[string]string{"kind": "ipvs_add_service"}, 2},
		{"vsplane_agent_deltas_applied_total", map[string]string{"status": "ack"}, 1},
		{"vsplane_agent_deltas_applied_total", map[string]string{"status": "nack"}, 1},
		{"vsplane_agent_drift_repairs_total", map[string]string{"kind": "ipvs_add_destination"}, 4},
		{"vsplane_agent_full_reconciles_total", nil, 3},
		{"vsplane_agent_drains_total", map[string]string{"outcome": "completed"}, 5},
		{"vsplane_agent_drains_total", map[string]string{"outcome": "timed_out"}, 1},
	} {
		if got := one(t, reg, c.name, c.labels).GetCounter().GetValue(); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := one(t, reg, "vsplane_agent_failed_resources", nil).GetGauge().GetValue(); got != 1 {
		t.Errorf("failed resources = %v, want 1", got)
	}
	if got := one(t, reg, "vsplane_agent_draining_real_servers", nil).GetGauge().GetValue(); got != 2 {
		t.Errorf("draining real servers = %v, want 2", got)
	}
	for policy, want := range map[string]float64{"internal": 3, "external": 7} {
		if got := one(t, reg, "kubeproxy_sync_proxy_rules_no_local_endpoints_total", map[string]string{"traffic_policy": policy}).GetGauge().GetValue(); got != want {
			t.Errorf("no local endpoints %s = %v, want %v", policy, got, want)
		}
	}
	// A later full reconcile moves the last sync timestamp.
	stats.LastFullReconcile = clk.now().Add(time.Second)
	if got := one(t, reg, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", nil).GetGauge().GetValue(); got != float64(stats.LastFullReconcile.UnixNano())/1e9 {
		t.Errorf("last sync after full reconcile = %v", got)
	}
}

type healthResp struct {
	code int
	body map[string]any
}

func get(t *testing.T, h http.Handler) healthResp {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	return healthResp{rec.Code, body}
}

func TestHealthFollowsKubeProxy(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	reg := prometheus.NewRegistry()
	m, err := New(reg, Options{Now: clk.now, HealthTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Starting up, nothing queued: healthy, lastUpdated = now.
	r := get(t, m.HealthzHandler())
	if r.code != 200 || r.body["nodeEligible"] != true || r.body["lastUpdated"] != r.body["currentTime"] {
		t.Errorf("startup healthz = %+v", r)
	}
	if _, ok := get(t, m.LivezHandler()).body["nodeEligible"]; ok {
		t.Error("livez body has nodeEligible")
	}
	// Queued and not applied: healthy until the timeout, then 503 on both.
	m.Queued()
	clk.add(59 * time.Second)
	if r := get(t, m.HealthzHandler()); r.code != 200 {
		t.Errorf("59s after queueing: %d", r.code)
	}
	clk.add(time.Second)
	r = get(t, m.HealthzHandler())
	if r.code != 503 || r.body["lastUpdated"] != "0001-01-01T00:00:00Z" {
		t.Errorf("60s after queueing: %+v", r)
	}
	if r := get(t, m.LivezHandler()); r.code != 503 {
		t.Errorf("livez 60s after queueing: %d", r.code)
	}
	// A second Queued does not reset the oldest pending time.
	m.Queued()
	if r := get(t, m.HealthzHandler()); r.code != 503 {
		t.Errorf("after a second queue: %d", r.code)
	}
	// Applied: healthy again.
	m.Applied(&vsplanev1.Ack{Status: vsplanev1.AckStatus_ACK_STATUS_ACK}, time.Millisecond)
	if r := get(t, m.HealthzHandler()); r.code != 200 {
		t.Errorf("after apply: %d", r.code)
	}
	for code, want := range map[string]float64{"200": 3, "503": 2} {
		if got := one(t, reg, "kubeproxy_proxy_healthz_total", map[string]string{"code": code}).GetCounter().GetValue(); got != want {
			t.Errorf("healthz_total{code=%s} = %v, want %v", code, got, want)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(nil, Options{}); err == nil {
		t.Error("nil registerer accepted")
	}
	if _, err := New(prometheus.NewRegistry(), Options{HealthTimeout: -time.Second}); err == nil {
		t.Error("negative timeout accepted")
	}
}
