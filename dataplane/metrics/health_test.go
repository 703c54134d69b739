package metrics

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// kube-proxy: a Node being deleted makes /healthz 503 with nodeEligible
// false (lastUpdated then is not "now"); /livez does not look at it.
func TestHealthzNodeDeleting(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	m, err := New(prometheus.NewRegistry(), Options{Now: clk.now, HealthTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var deleting atomic.Bool
	h := m.NodeHealthzHandler(func() bool { return !deleting.Load() })
	r := get(t, h)
	if r.code != 200 || r.body["nodeEligible"] != true || r.body["healthy"] != true {
		t.Errorf("eligible node: %+v", r)
	}
	// kube-proxy v1.37's per-family status (IPv4 by default).
	if st, _ := r.body["status"].(map[string]any); len(st) != 1 || st["IPv4"] == nil {
		t.Errorf("status: %v, want one entry for IPv4", r.body["status"])
	}
	deleting.Store(true)
	r = get(t, h)
	if r.code != 503 || r.body["nodeEligible"] != false || r.body["healthy"] != true || r.body["lastUpdated"] == r.body["currentTime"] {
		t.Errorf("node being deleted: %+v", r)
	}
	if r := get(t, m.LivezHandler()); r.code != 200 {
		t.Errorf("livez while the node is deleted: %+v", r)
	}
	if !m.Healthy() {
		t.Error("Healthy() false while only the node is being deleted")
	}
	// Both: still 503.
	m.Queued()
	clk.add(2 * time.Minute)
	if r := get(t, h); r.code != 503 || m.Healthy() {
		t.Errorf("stale and deleting: %+v healthy=%v", r, m.Healthy())
	}
	deleting.Store(false)
	if r := get(t, h); r.code != 503 || r.body["nodeEligible"] != true {
		t.Errorf("stale only: %+v", r)
	}
}
