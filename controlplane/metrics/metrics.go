// Package metrics turns the control plane's stream hooks and agent registry
// into Prometheus metrics. Names follow kube-proxy where kube-proxy has the
// metric (kubeproxy_ subsystem, so existing dashboards work: summing
// kube-proxy's per-node histograms gives the same distribution as this one
// fleet-wide histogram), and vsplane_controlplane_ otherwise.
package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// NetworkProgrammingBuckets are kube-proxy's buckets for
// network_programming_duration_seconds: 0.25s, 0.5s, 1..59s, 60..115s by 5s,
// 2..5min by 30s.
func NetworkProgrammingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// Agents is the view of connected agents the scrape-time collector reads;
// *stream.Registry satisfies it.
type Agents interface {
	// ListAgentsPending returns every connected agent with NodeName and
	// PendingResources filled, and Lag (the age of the oldest pending
	// change's trigger) for those with pending resources.
	ListAgentsPending() []*vsplanev1.AgentInfo
}

// Desired is the per-node desired state; *snapshot.Store satisfies it.
type Desired interface {
	// Has reports whether node is in the desired state (a known Node).
	Has(node string) bool
}

// ControlPlane holds the control plane's stream metrics. Hooks feed the
// counters and histograms; the connected/lag gauges are computed at scrape
// time from Agents, so a disconnected agent's series disappear with it and a
// replaced stream is never counted twice.
type ControlPlane struct {
	programming  prometheus.Histogram
	queue        prometheus.Histogram
	nacks        *prometheus.CounterVec
	acks         prometheus.Counter
	deltas       prometheus.Counter
	resources    prometheus.Counter
	removed      prometheus.Counter
	bytes        prometheus.Counter
	connects     prometheus.Counter
	disconnects  prometheus.Counter
	agentApply   prometheus.Histogram
	kernelOps    *prometheus.CounterVec
	closed       *prometheus.CounterVec
	rejected     *prometheus.CounterVec
	agentsSource *agentsCollector
}

// New registers the control plane's metrics on reg.
func New(reg prometheus.Registerer) (*ControlPlane, error) {
	if reg == nil {
		return nil, errors.New("metrics: a Registerer is required")
	}
	m := &ControlPlane{
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "network_programming_duration_seconds",
			Help: "In-cluster network programming latency: from a Service/EndpointSlice change (its trigger time) " +
				"to the agent's ACK of the resource it produced, one observation per node and resource, fleet-wide.",
			Buckets: NetworkProgrammingBuckets(),
		}),
		queue: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vsplane_controlplane_delta_queue_seconds",
			Help: "Control-plane side of the programming latency: from a resource's trigger time to the moment " +
				"the Delta carrying it was sent (debounce, translation and stream queueing), per node and resource.",
			Buckets: NetworkProgrammingBuckets(),
		}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_controlplane_nacks_total",
			Help: "Deltas an agent NACKed, by node (nodes of the cluster only; others count as \"unknown\").",
		}, []string{"node"}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_acks_total",
			Help: "Acks received that matched an in-flight Delta (ACK and NACK).",
		}),
		deltas: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_deltas_sent_total",
			Help: "Deltas sent to agents.",
		}),
		resources: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_resources_sent_total",
			Help: "Resources (upserts) carried by the Deltas sent to agents.",
		}),
		removed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_removals_sent_total",
			Help: "Resource removals carried by the Deltas sent to agents.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_delta_bytes_sent_total",
			Help: "Serialized size (protobuf) of the Deltas sent to agents.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_agent_connects_total",
			Help: "Agent streams accepted (after a valid Hello).",
		}),
		disconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_agent_disconnects_total",
			Help: "Accepted agent streams that ended.",
		}),
		agentApply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vsplane_controlplane_agent_apply_duration_seconds",
			Help:    "Apply duration the agents reported in their Acks, fleet-wide.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		kernelOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_controlplane_agent_kernel_operations_total",
			Help: "Kernel operations the agents reported in their Acks, fleet-wide, by kind (the kinds of internal/wire; others count as \"other\").",
		}, []string{"kind"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_controlplane_agent_streams_closed_total",
			Help: "Accepted agent streams that ended, by reason (client_closed, transport, replaced, shutdown, ack_timeout, unknown_node_timeout, too_many_unknown_nodes, protocol_error).",
		}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_controlplane_agent_streams_rejected_total",
			Help: "Agent streams refused before they were accepted, by reason (unauthenticated, permission_denied, protocol_error, hello_timeout, shutdown, transport).",
		}, []string{"reason"}),
		agentsSource: &agentsCollector{},
	}
	for _, c := range []prometheus.Collector{m.programming, m.queue, m.nacks, m.acks, m.deltas, m.resources,
		m.removed, m.bytes, m.connects, m.disconnects, m.agentApply, m.kernelOps, m.closed, m.rejected, m.agentsSource} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: registering: %w", err)
		}
	}
	return m, nil
}

// Hooks returns stream hooks that record metrics and then call next's hooks
// (each optional).
func (m *ControlPlane) Hooks(next stream.Hooks) stream.Hooks {
	return stream.Hooks{
		OnConnect: func(ev stream.ConnectEvent) {
			m.connects.Inc()
			if next.OnConnect != nil {
				next.OnConnect(ev)
			}
		},
		OnDisconnect: func(node string, err error) {
			m.disconnects.Inc()
			m.closed.WithLabelValues(string(stream.ReasonOf(err))).Inc()
			if next.OnDisconnect != nil {
				next.OnDisconnect(node, err)
			}
		},
		OnReject: func(err error) {
			m.rejected.WithLabelValues(string(stream.ReasonOf(err))).Inc()
			if next.OnReject != nil {
				next.OnReject(err)
			}
		},
		OnDeltaSent: func(node string, d *vsplanev1.Delta) {
			m.DeltaSent(d)
			if next.OnDeltaSent != nil {
				next.OnDeltaSent(node, d)
			}
		},
		OnAck: func(ev stream.AckEvent) {
			m.Ack(ev)
			if next.OnAck != nil {
				next.OnAck(ev)
			}
		},
	}
}

// DeltaSent counts one sent Delta.
func (m *ControlPlane) DeltaSent(d *vsplanev1.Delta) {
	m.deltas.Inc()
	m.resources.Add(float64(len(d.GetResources())))
	m.removed.Add(float64(len(d.GetRemoved())))
	// The Delta's resources are shared by every agent's Delta and their
	// sizes cached by their encoding (stream/encode.go): a plain Size
	// walked every resource again for every agent (perf: ~3% of the
	// control plane's CPU in the fan-out burst).
	m.bytes.Add(float64(proto.MarshalOptions{UseCachedSize: true}.Size(d)))
}

// Ack records one Ack. Programming latency is observed only for resources
// the agent applied: a NACK without per-resource errors (or with an error
// naming no resource) fails the whole Delta, as the stream server treats it.
func (m *ControlPlane) Ack(ev stream.AckEvent) {
	m.acks.Inc()
	if ev.ApplyDuration > 0 {
		m.agentApply.Observe(ev.ApplyDuration.Seconds())
	}
	for kind, n := range ev.KernelOperations {
		m.kernelOps.WithLabelValues(wire.KnownOp(kind)).Add(float64(n))
	}
	nack := ev.Status == vsplanev1.AckStatus_ACK_STATUS_NACK
	if nack {
		m.nacks.WithLabelValues(m.nodeLabel(ev.Node)).Inc()
	}
	failed := make(map[string]bool, len(ev.Errors))
	allFailed := nack && len(ev.Errors) == 0
	for _, e := range ev.Errors {
		if e.GetName() == "" {
			allFailed = true
		}
		failed[e.GetName()] = true
	}
	if allFailed {
		return
	}
	for name, trig := range ev.TriggerTimes {
		if trig.IsZero() || failed[name] {
			continue
		}
		if !ev.SentAt.IsZero() {
			m.queue.Observe(max(ev.SentAt.Sub(trig), 0).Seconds())
		}
		m.programming.Observe(max(ev.ReceivedAt.Sub(trig), 0).Seconds())
	}
}

// nodeLabel is node if the desired state knows it, else "unknown": a
// stream cannot create series for nodes that are not in the cluster.
func (m *ControlPlane) nodeLabel(node string) string {
	if d := m.agentsSource.desiredState(); d != nil && d.Has(node) {
		return node
	}
	return "unknown"
}

// Track makes the scrape-time gauges read agents and desired. Until it is
// called they report no agents.
func (m *ControlPlane) Track(agents Agents, desired Desired) {
	m.agentsSource.set(agents, desired)
}
