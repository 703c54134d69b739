package rollout

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
)

var (
	leaderDesc = prometheus.NewDesc("vsplane_controlplane_rollout_leader",
		"1 on the replica that leads the SchedulerRollouts (moves their status on), 0 on the others.", nil, nil)
	phaseDesc = prometheus.NewDesc("vsplane_controlplane_rollout_phase",
		"1 for each SchedulerRollout, labelled with its current phase (Pending until the leader first writes its status).",
		[]string{"rollout", "scheduler", "phase"}, nil)
	stepDesc = prometheus.NewDesc("vsplane_controlplane_rollout_step",
		"Steps of the SchedulerRollout begun so far (0 before the canary).", []string{"rollout"}, nil)
	stepsDesc = prometheus.NewDesc("vsplane_controlplane_rollout_steps",
		"Steps the SchedulerRollout plans (its strategy's steps, with the default and the final 100% step).",
		[]string{"rollout"}, nil)
	nodesDesc = prometheus.NewDesc("vsplane_controlplane_rollout_nodes",
		"Nodes of the SchedulerRollout by state, from its status: selected (all its node selector selects), "+
			"updated (acknowledged the new scheduler), pending (reached, not acknowledged yet), failed (NACKed it).",
		[]string{"rollout", "state"}, nil)
)

// Collector exports every SchedulerRollout's progress as read from its
// status at scrape time (the watch's cache, so every replica exports the
// same series; dashboards take max by rollout), and whether this replica
// leads. list and leading may be nil (no rollouts watched).
type Collector struct {
	list    func() []*v1alpha1.SchedulerRollout
	leading func() bool
}

// NewCollector returns the collector; register it once per replica.
func NewCollector(list func() []*v1alpha1.SchedulerRollout, leading func() bool) *Collector {
	return &Collector{list: list, leading: leading}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{leaderDesc, phaseDesc, stepDesc, stepsDesc, nodesDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	leader := 0.0
	if c.leading != nil && c.leading() {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, leader)
	if c.list == nil {
		return
	}
	for _, ro := range c.list() {
		st := ro.Status
		phase := st.Phase
		if phase == "" {
			phase = v1alpha1.PhasePending
		}
		ch <- prometheus.MustNewConstMetric(phaseDesc, prometheus.GaugeValue, 1, ro.Name, ro.Spec.Scheduler, string(phase))
		ch <- prometheus.MustNewConstMetric(stepDesc, prometheus.GaugeValue, float64(len(st.Steps)), ro.Name)
		ch <- prometheus.MustNewConstMetric(stepsDesc, prometheus.GaugeValue, float64(len(plannedSteps(ro))), ro.Name)
		for state, n := range map[string]int32{
			"selected": st.NodesTotal, "updated": st.NodesUpdated, "pending": st.NodesPending, "failed": st.NodesFailed,
		} {
			ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(n), ro.Name, state)
		}
	}
}
