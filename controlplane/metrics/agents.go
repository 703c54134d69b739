package metrics

import (
	"sync"

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
// count and lag come from Agents (O(1) for an agent known to be in sync,
// else one pass over its node's desired state, copying nothing).
type agentsCollector struct {
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
	for _, info := range infos {
		node := info.GetNodeName()
		if desired != nil && !desired.Has(node) {
			continue // per-node series only for nodes of the cluster
		}
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(info.GetPendingResources()), node)
		lag := 0.0
		if info.GetPendingResources() > 0 && info.GetLag() != nil {
			lag = max(info.GetLag().AsDuration(), 0).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, lag, node)
	}
}
