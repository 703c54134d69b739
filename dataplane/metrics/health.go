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
// The agent does not watch its Node, so nodeEligible is always true (a node
// being deleted is drained by the control plane, not by this probe).
func (m *Agent) HealthzHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		eligible := true
		m.serveHealth(w, &eligible, func(code int) { m.healthz.WithLabelValues(strconv.Itoa(code)).Inc() })
	})
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
