package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	connectedDesc = prometheus.NewDesc("vsplane_controlplane_connected_agents",
		"Agents with an open stream to this replica.", nil, nil)
	pendingDesc = prometheus.NewDesc("vsplane_controlplane_agent_pending_resources",
		"Resources whose desired version the node's agent has not acknowledged yet (upserts and removals): "+
			"how many versions behind the agent is.", []string{"node"}, nil)
	lagDesc = prometheus.NewDesc("vsplane_controlplane_agent_lag_seconds",
		"Seconds since the trigger time of the node's oldest unacknowledged resource change; 0 when the "+
			"agent is up to date (or the pending changes have no trigger time).", []string{"node"}, nil)
)

// agentsCollector computes the per-agent gauges at scrape time. The pending
// count comes from Agents (O(1) for an agent known to be in sync, else one
// pass over its node's desired state); the oldest trigger needs a second
// pass, done only for nodes that lag.
type agentsCollector struct {
	now func() time.Time

	mu      sync.Mutex
	agents  Agents
	desired Desired
}

func (c *agentsCollector) set(a Agents, d Desired) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.agents, c.desired = a, d
}

func (c *agentsCollector) desiredState() Desired {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.desired
}

func (c *agentsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connectedDesc
	ch <- pendingDesc
	ch <- lagDesc
}

func (c *agentsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	agents, desired := c.agents, c.desired
	c.mu.Unlock()
	if agents == nil {
		ch <- prometheus.MustNewConstMetric(connectedDesc, prometheus.GaugeValue, 0)
		return
	}
	infos := agents.ListAgentsPending()
	ch <- prometheus.MustNewConstMetric(connectedDesc, prometheus.GaugeValue, float64(len(infos)))
	now := c.now()
	for _, info := range infos {
		node := info.GetNodeName()
		if desired != nil && !desired.Has(node) {
			continue // per-node series only for nodes of the cluster
		}
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(info.GetPendingResources()), node)
		lag := 0.0
		if info.GetPendingResources() > 0 && desired != nil {
			if oldest := oldestPending(desired, node, info.GetAcknowledgedVersions()); !oldest.IsZero() {
				lag = max(now.Sub(oldest), 0).Seconds()
			}
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, lag, node)
	}
}

// oldestPending returns the earliest trigger time among node's desired
// resources whose version differs from the acknowledged one (zero if none
// has a trigger time). Pending removals have no trigger time left to read.
func oldestPending(d Desired, node string, acked map[string]string) time.Time {
	res, _, ok := d.List(node)
	if !ok {
		return time.Time{}
	}
	var oldest time.Time
	for _, e := range res {
		if v, ok := acked[e.Resource.GetName()]; ok && v == e.Resource.GetVersion() {
			continue
		}
		if t := e.Trigger; !t.IsZero() && (oldest.IsZero() || t.Before(oldest)) {
			oldest = t
		}
	}
	return oldest
}
