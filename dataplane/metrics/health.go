package metrics

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// health mirrors kube-proxy's proxier health: healthy while nothing is
// queued, or while the oldest unapplied Delta is younger than HealthTimeout.
func (m *Agent) health() (healthy bool, lastUpdated, now time.Time) {
	m.mu.Lock()
	pending, last := m.oldestPending, m.lastApplied
	m.mu.Unlock()
	now = m.opts.Now()
	return pending.IsZero() || now.Sub(pending) < m.opts.HealthTimeout, last, now
}

// healthBody is kube-proxy's JSON body (nodeEligible only on /healthz).
type healthBody struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
}

// HealthzHandler serves kube-proxy's /healthz: 200 when the last received
// Delta was applied within HealthTimeout (or none is pending), 503 otherwise.
// nodeEligible is always true; see NodeHealthzHandler.
func (m *Agent) HealthzHandler() http.Handler { return m.NodeHealthzHandler(nil) }

// NodeHealthzHandler is HealthzHandler with node eligibility, as kube-proxy
// serves it: while deleting() reports the Node being deleted (deletion
// timestamp or the cluster autoscaler's ToBeDeletedByClusterAutoscaler
// taint; the control plane sends it as NodeSettings.node_deleting), the
// answer is 503 with nodeEligible false, so load balancers using /healthz
// stop sending to the node. nil deleting means never deleting. /livez
// ignores eligibility.
func (m *Agent) NodeHealthzHandler(deleting func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		eligible := deleting == nil || !deleting()
		m.serveHealth(w, &eligible, func(code int) { m.healthz.WithLabelValues(strconv.Itoa(code)).Inc() })
	})
}

// Healthy reports the proxy's health as /livez does (no node eligibility):
// kube-proxy's serviceProxyHealthy in health-check node port answers.
func (m *Agent) Healthy() bool {
	healthy, _, _ := m.health()
	return healthy
}

// LivezHandler serves kube-proxy's /livez: the same check without node
// eligibility.
func (m *Agent) LivezHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		m.serveHealth(w, nil, func(code int) { m.livez.WithLabelValues(strconv.Itoa(code)).Inc() })
	})
}

func (m *Agent) serveHealth(w http.ResponseWriter, eligible *bool, count func(int)) {
	healthy, last, now := m.health()
	if eligible != nil {
		healthy = healthy && *eligible
	}
	code := http.StatusOK
	if !healthy {
		code = http.StatusServiceUnavailable
	} else {
		// Like kube-proxy: a healthy proxy reports lastUpdated = now, for
		// clients that read it as "the sync loop is running".
		last = now
	}
	count(code)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(healthBody{LastUpdated: last, CurrentTime: now, NodeEligible: eligible})
}
