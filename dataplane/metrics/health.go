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

// healthBody is kube-proxy's (v1.37) JSON body (nodeEligible only on
// /healthz). The agent applies both families in one pass, so each family's
// status is the agent's.
type healthBody struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible,omitempty"`
	Healthy      bool                    `json:"healthy"`
	Status       map[string]familyHealth `json:"status,omitempty"`
}

// familyHealth is kube-proxy's per-family ProxierHealth.
type familyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// HealthzHandler serves kube-proxy's /healthz: 200 when the last received
// Delta was applied within HealthTimeout (or none is pending), 503 otherwise.
// nodeEligible is always true; see NodeHealthzHandler.
func (m *Agent) HealthzHandler() http.Handler { return m.NodeHealthzHandler(nil) }

// NodeHealthzHandler is HealthzHandler with node eligibility, as kube-proxy
// serves it: while eligible() is false the answer is 503 with nodeEligible
// false, so load balancers using /healthz stop sending to the node. The
// agent's eligible is false until its node settings arrived (kube-proxy:
// until its informer has the Node) and while they say the Node is being
// deleted (deletion timestamp or the cluster autoscaler's
// ToBeDeletedByClusterAutoscaler taint: NodeSettings.node_deleting). nil
// eligible means always eligible. /livez ignores eligibility.
func (m *Agent) NodeHealthzHandler(eligible func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		eligible := eligible == nil || eligible()
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
	proxyHealthy, last, now := m.health()
	body := healthBody{CurrentTime: now, NodeEligible: eligible, Healthy: proxyHealthy, Status: map[string]familyHealth{}}
	for _, fam := range m.opts.Families {
		body.Status[fam] = familyHealth{LastUpdated: last, Healthy: proxyHealthy}
	}
	healthy := proxyHealthy
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
	body.LastUpdated = last
	_ = json.NewEncoder(w).Encode(body)
}
