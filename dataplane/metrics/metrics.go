// Package metrics holds the node agent's Prometheus metrics and its
// kube-proxy compatible /healthz and /livez. Names follow kube-proxy where it
// has the metric (kubeproxy_ subsystem, so existing dashboards and alerts
// work), vsplane_agent_ otherwise. It does not import the reconciler: the
// agent passes a Stats function.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vsplane/vsplane/dataplane/client"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Stats is what the reconciler reports at scrape time.
type Stats struct {
	// FullReconciles and LastFullReconcile describe the periodic full pass.
	FullReconciles    uint64
	LastFullReconcile time.Time
	// RepairsByKind counts kernel writes made by full reconciles (drift
	// repairs and retries) by operation kind; monotonic.
	RepairsByKind map[string]uint64
	// FailedResources is the number of resources currently failed.
	FailedResources int
	// Draining is the number of real servers at weight 0 kept for their
	// connections; DrainsCompleted and DrainsTimedOut count drains that ended
	// with no connections left or at the maximum drain time (monotonic).
	Draining                        int
	DrainsCompleted, DrainsTimedOut uint64
	// RestoreFailures counts failed iptables-restore runs by IP family
	// ("IPv4", "IPv6"); monotonic.
	RestoreFailures map[string]uint64
	// NoLocalEndpointsInternal/External: Services with that Local policy,
	// endpoints in the cluster and none on this node.
	NoLocalEndpointsInternal, NoLocalEndpointsExternal int
	// StaleFlowsDeleted counts UDP and SCTP conntrack entries deleted as stale,
	// StaleFlowSweepErrors the sweeps that failed; monotonic.
	StaleFlowsDeleted, StaleFlowSweepErrors uint64
	// StateSaveFailures counts failed writes of the agent's state file (a
	// full or read-only disk); monotonic.
	StateSaveFailures uint64
}

// Options configure the agent metrics.
type Options struct {
	// Stats is read at every scrape; nil reports no reconciler metrics.
	Stats func() Stats
	// HealthTimeout is how long a received Delta may stay unapplied before
	// /healthz and /livez fail; kube-proxy uses 2× its sync period. 0 means 60s.
	HealthTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Families are the IP families the agent manages ("IPv4", "IPv6"), each
	// reported in the health body's status and in the per-family
	// counters (as kube-proxy reports each proxier). Default IPv4.
	Families []string
}

var (
	repairsDesc = prometheus.NewDesc("vsplane_agent_drift_repairs_total",
		"Kernel writes made by periodic full reconciles (drift repairs and retries of failed resources), by operation kind.",
		[]string{"kind"}, nil)
	fullDesc = prometheus.NewDesc("vsplane_agent_full_reconciles_total",
		"Periodic full reconciles run.", nil, nil)
	failedDesc = prometheus.NewDesc("vsplane_agent_failed_resources",
		"Resources the agent currently fails to program (NACKed; retried with backoff).", nil, nil)
	drainingDesc = prometheus.NewDesc("vsplane_agent_draining_real_servers",
		"TCP real servers at weight 0 kept while they still have connections (graceful drain).", nil, nil)
	drainsDesc = prometheus.NewDesc("vsplane_agent_drains_total",
		"Drains that ended, by outcome: completed (no connections left) or timed_out (maximum drain time reached).",
		[]string{"outcome"}, nil)
	restoreFailuresDesc = prometheus.NewDesc("kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
		"Cumulative iptables-restore failures, by IP family.", []string{"ip_family"}, nil)
	noLocalDesc = prometheus.NewDesc("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
		"Services with a Local traffic policy and endpoints in the cluster but none on this node, by policy (internal, external).",
		[]string{"traffic_policy"}, nil)
	staleFlowsDesc = prometheus.NewDesc("vsplane_agent_stale_conntrack_entries_deleted_total",
		"UDP and SCTP conntrack entries deleted because their reply source is none of their virtual server's real servers (kube-proxy's conntrack cleanup, for UDP).", nil, nil)
	staleSweepErrorsDesc = prometheus.NewDesc("vsplane_agent_stale_conntrack_sweep_errors_total",
		"Sweeps of stale UDP or SCTP conntrack entries that failed (retried at the next UDP or SCTP change or full reconcile).", nil, nil)
	stateSaveFailuresDesc = prometheus.NewDesc("vsplane_agent_state_save_failures_total",
		"Failed writes of the agent's state file (e.g. a full disk), retried every second. The kernel is programmed and acknowledged as usual; an agent restarted meanwhile resumes from the older file and has the rest resent.", nil, nil)
	lastDesc = prometheus.NewDesc("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"The last time the kernel state was successfully synced (a Delta applied or a full reconcile ran).", nil, nil)
)

// Agent holds one agent's metrics and health state. Safe for concurrent use.
type Agent struct {
	opts Options

	syncDuration prometheus.Histogram
	lastQueued   prometheus.Gauge
	kernelOps    *prometheus.CounterVec
	applies      *prometheus.CounterVec
	healthz      *prometheus.CounterVec
	livez        *prometheus.CounterVec
	heldRemovals prometheus.Gauge
	removalHolds prometheus.Counter

	mu            sync.Mutex
	holding       bool
	lastApplied   time.Time
	oldestPending time.Time // zero when every received Delta was applied
}

// New registers the agent's metrics on reg.
func New(reg prometheus.Registerer, opts Options) (*Agent, error) {
	if reg == nil {
		return nil, errors.New("metrics: a Registerer is required")
	}
	if opts.HealthTimeout < 0 {
		return nil, fmt.Errorf("metrics: negative health timeout %v", opts.HealthTimeout)
	}
	if opts.HealthTimeout == 0 {
		opts.HealthTimeout = time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if len(opts.Families) == 0 {
		opts.Families = []string{"IPv4"}
	}
	m := &Agent{
		opts: opts,
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "sync_proxy_rules_duration_seconds",
			Help:    "Time to apply one Delta to the kernel (the agent's rule sync).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		lastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kubeproxy", Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a change was received from the control plane (a Delta) to be applied.",
		}),
		kernelOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_agent_kernel_operations_total",
			Help: "Kernel operations made while applying Deltas, by kind (full-reconcile writes are in vsplane_agent_drift_repairs_total).",
		}, []string{"kind"}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_agent_deltas_applied_total",
			Help: "Deltas applied, by outcome (ack or nack).",
		}, []string{"status"}),
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Name: "proxy_healthz_total",
			Help: "/healthz responses by HTTP code.",
		}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kubeproxy", Name: "proxy_livez_total",
			Help: "/livez responses by HTTP code.",
		}, []string{"code"}),
		heldRemovals: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vsplane_agent_held_removals",
			Help: "Services a held first Delta would remove (0: nothing held). The agent holds a first Delta after (re)connect that removes more than --max-removal-share of its Services until the control plane confirms it.",
		}),
		removalHolds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_agent_removal_holds_total",
			Help: "Times the agent started holding a first Delta that would remove most of its Services.",
		}),
	}
	for _, c := range []prometheus.Collector{m.syncDuration, m.lastQueued, m.kernelOps, m.applies, m.healthz, m.livez,
		m.heldRemovals, m.removalHolds, statsCollector{m}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: registering: %w", err)
		}
	}
	return m, nil
}

// Wrap returns an Applier that records metrics and health around inner.
func (m *Agent) Wrap(inner client.Applier) client.Applier { return applier{m: m, inner: inner} }

type applier struct {
	m     *Agent
	inner client.Applier
}

func (a applier) Versions() map[string]string { return a.inner.Versions() }

func (a applier) Apply(ctx context.Context, d *vsplanev1.Delta) *vsplanev1.Ack {
	a.m.Queued()
	start := a.m.opts.Now()
	ack := a.inner.Apply(ctx, d)
	a.m.Applied(ack, a.m.opts.Now().Sub(start))
	return ack
}

// Queued records that a Delta was received (kube-proxy's QueuedUpdate).
func (m *Agent) Queued() {
	now := m.opts.Now()
	m.lastQueued.Set(float64(now.UnixNano()) / 1e9)
	m.mu.Lock()
	if m.oldestPending.IsZero() {
		m.oldestPending = now
	}
	m.mu.Unlock()
}

// Applied records a finished Apply (kube-proxy's Updated). The duration is
// the one the Ack reports, else measured. A NACK still counts as a sync: the
// failed resources are reported and retried, and a liveness probe must not
// restart an agent over one bad Service (vsplane_agent_failed_resources
// shows them).
func (m *Agent) Applied(ack *vsplanev1.Ack, measured time.Duration) {
	d := measured
	if ad := ack.GetApplyDuration(); ad != nil {
		d = ad.AsDuration()
	}
	m.syncDuration.Observe(d.Seconds())
	for kind, n := range ack.GetKernelOperations() {
		m.kernelOps.WithLabelValues(kind).Add(float64(n))
	}
	status := "ack"
	if ack == nil || ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		status = "nack"
	}
	m.applies.WithLabelValues(status).Inc()
	m.mu.Lock()
	m.lastApplied = m.opts.Now()
	m.oldestPending = time.Time{}
	m.mu.Unlock()
}

// RemovalHeld records the mass-removal guard's state (nil: nothing held).
func (m *Agent) RemovalHeld(h *vsplanev1.HeldRemoval) {
	m.heldRemovals.Set(float64(h.GetRemovals()))
	m.mu.Lock()
	defer m.mu.Unlock()
	if h != nil && !m.holding {
		m.removalHolds.Inc()
	}
	m.holding = h != nil
}

// statsCollector reads the reconciler's Stats and the last sync at scrape time.
type statsCollector struct{ m *Agent }

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- repairsDesc
	ch <- fullDesc
	ch <- failedDesc
	ch <- drainingDesc
	ch <- drainsDesc
	ch <- restoreFailuresDesc
	ch <- noLocalDesc
	ch <- staleFlowsDesc
	ch <- staleSweepErrorsDesc
	ch <- stateSaveFailuresDesc
	ch <- lastDesc
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	last := c.m.lastApplied
	c.m.mu.Unlock()
	if c.m.opts.Stats != nil {
		s := c.m.opts.Stats()
		for kind, n := range s.RepairsByKind {
			ch <- prometheus.MustNewConstMetric(repairsDesc, prometheus.CounterValue, float64(n), kind)
		}
		ch <- prometheus.MustNewConstMetric(fullDesc, prometheus.CounterValue, float64(s.FullReconciles))
		ch <- prometheus.MustNewConstMetric(failedDesc, prometheus.GaugeValue, float64(s.FailedResources))
		ch <- prometheus.MustNewConstMetric(drainingDesc, prometheus.GaugeValue, float64(s.Draining))
		ch <- prometheus.MustNewConstMetric(drainsDesc, prometheus.CounterValue, float64(s.DrainsCompleted), "completed")
		ch <- prometheus.MustNewConstMetric(drainsDesc, prometheus.CounterValue, float64(s.DrainsTimedOut), "timed_out")
		for _, fam := range c.m.opts.Families {
			ch <- prometheus.MustNewConstMetric(restoreFailuresDesc, prometheus.CounterValue, float64(s.RestoreFailures[fam]), fam)
		}
		ch <- prometheus.MustNewConstMetric(noLocalDesc, prometheus.GaugeValue, float64(s.NoLocalEndpointsInternal), "internal")
		ch <- prometheus.MustNewConstMetric(noLocalDesc, prometheus.GaugeValue, float64(s.NoLocalEndpointsExternal), "external")
		ch <- prometheus.MustNewConstMetric(staleFlowsDesc, prometheus.CounterValue, float64(s.StaleFlowsDeleted))
		ch <- prometheus.MustNewConstMetric(staleSweepErrorsDesc, prometheus.CounterValue, float64(s.StaleFlowSweepErrors))
		ch <- prometheus.MustNewConstMetric(stateSaveFailuresDesc, prometheus.CounterValue, float64(s.StateSaveFailures))
		if s.LastFullReconcile.After(last) {
			last = s.LastFullReconcile
		}
	}
	if !last.IsZero() {
		ch <- prometheus.MustNewConstMetric(lastDesc, prometheus.GaugeValue, float64(last.UnixNano())/1e9)
	}
}
