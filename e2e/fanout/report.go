package fanout

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/e2e/measure"
)

// Report is what Run measured; it is written as JSON (and a Markdown
// summary) to bench/results/<Options.Out>.{json,md}. Durations are seconds
// unless the name says ms; bytes are what the agents' sockets read unless
// the name says payload.
type Report struct {
	Time string `json:"time"`
	Size Size   `json:"size"`
	Host Host   `json:"host"`
	// Source is the code measured: HEAD and the uncommitted changes of the
	// working tree in the packages the binaries are built from.
	Source Source `json:"source"`
	// Transport says how agents reach the control plane.
	Transport string `json:"transport"`
	// BytesMethod says how bytes are counted.
	BytesMethod  string            `json:"bytes_method"`
	Setup        Setup             `json:"setup"`
	ControlPlane ControlPlaneStats `json:"control_plane"`
	ColdStart    ColdStart         `json:"cold_start"`
	// Idle is the baseline: every agent connected, nothing changing
	// (Options.IdleWindow), measured after the cold start.
	Idle         PhaseCost    `json:"idle"`
	SingleChange SingleChange `json:"single_change"`
	Burst        Burst        `json:"burst"`
	Reconnect    Reconnect    `json:"reconnect_storm"`
	// RestartStorm is measured just before the reconnect storm: the same
	// cut with new clients (restarted agent processes).
	RestartStorm Reconnect `json:"restart_storm"`
	// HelloBytesRatio: the reconnect storm's bytes from the agents over the
	// restart storm's.
	HelloBytesRatio float64 `json:"reconnect_to_restart_bytes_from_agents"`
	Goals           []Goal  `json:"goals"`
	// StreamFailuresBeforeStorm: agent streams that ended or failed to open
	// from the cold start until the reconnect storm (retried).
	StreamFailuresBeforeStorm int64 `json:"stream_failures_before_storm"`
	// Problems are correctness failures (a test fails on any).
	Problems []string `json:"problems"`
	Notes    []string `json:"notes"`
}

// Source identifies the code a run measured.
type Source struct {
	GitHead string `json:"git_head"`
	// Uncommitted are `git status --porcelain` lines under controlplane/,
	// dataplane/, internal/ and proto/ when the run started.
	Uncommitted []string `json:"uncommitted"`
}

// Size is a benchmark size: Nodes (agents), Services, and Endpoints per
// Service (one EndpointSlice each).
type Size struct {
	Nodes     int `json:"nodes"`
	Services  int `json:"services"`
	Endpoints int `json:"endpoints_per_service"`
}

func (s Size) String() string {
	return fmt.Sprintf("%d nodes x %d Services x %d endpoints", s.Nodes, s.Services, s.Endpoints)
}

// Host describes the machine; the load average shows how shared it was.
type Host struct {
	CPUs          int    `json:"cpus"`
	LoadAvgBefore string `json:"loadavg_before"`
	LoadAvgAfter  string `json:"loadavg_after"`
	GoVersion     string `json:"go_version"`
	// TestProcessPeakRSSBytes is this process's VmHWM: the agents' kernels
	// and reconcilers, the harness.
	TestProcessPeakRSSBytes int64 `json:"test_process_peak_rss_bytes"`
}

// Setup is the cluster's creation.
type Setup struct {
	Objects          int     `json:"objects"`
	CreateSeconds    float64 `json:"create_seconds"`
	ObjectsPerSecond float64 `json:"objects_per_second"`
	Writers          int     `json:"writers"`
}

// ControlPlaneStats is the replica process over the whole run.
type ControlPlaneStats struct {
	Args []string `json:"args"`
	// Env is the extra environment it ran with (Options.ControlPlaneEnv).
	Env []string `json:"env,omitempty"`
	// ReadySeconds: process start until its health said SERVING (informers
	// synced, first full computation of every node committed).
	ReadySeconds       float64 `json:"ready_seconds"`
	ReadyCPUSeconds    float64 `json:"ready_cpu_seconds"`
	CPUSecondsTotal    float64 `json:"cpu_seconds_total"`
	PeakRSSBytes       int64   `json:"peak_rss_bytes"`
	RSSBytesAtEnd      int64   `json:"rss_bytes_at_end"`
	RSSBytesWhenReady  int64   `json:"rss_bytes_when_ready"`
	PeakRSSWhenReady   int64   `json:"peak_rss_bytes_when_ready"`
	UnexpectedExitNote string  `json:"unexpected_exit,omitempty"`
}

// PhaseCost is what one phase cost, from its start to the moment the last
// awaited Ack was taken.
type PhaseCost struct {
	Seconds                float64 `json:"seconds"`
	WireBytesToAgents      int64   `json:"wire_bytes_to_agents"`
	WireBytesFromAgents    int64   `json:"wire_bytes_from_agents"`
	PayloadBytes           int64   `json:"payload_bytes"`
	Deltas                 int64   `json:"deltas"`
	Resources              int64   `json:"resources"`
	Removed                int64   `json:"removed"`
	NACKs                  int64   `json:"nacks"`
	ControlPlaneCPUSeconds float64 `json:"control_plane_cpu_seconds"`
	// TestProcessCPUSeconds is the agents, writers and clients (one
	// process); APIServer and Etcd are kubeenv's processes.
	TestProcessCPUSeconds float64 `json:"test_process_cpu_seconds"`
	APIServerCPUSeconds   float64 `json:"apiserver_cpu_seconds"`
	EtcdCPUSeconds        float64 `json:"etcd_cpu_seconds"`
	// TokenReviews the API server answered (apiserver_request_total).
	TokenReviews int64 `json:"token_reviews"`
	// The control plane's RSS at the end of the phase, and its peak so far.
	ControlPlaneRSSBytes     int64 `json:"control_plane_rss_bytes_at_end"`
	ControlPlanePeakRSSBytes int64 `json:"control_plane_peak_rss_bytes_so_far"`
	// The control plane's Go heap at the end of the phase (its /metrics):
	// allocated, and the next GC's target (about twice the heap live after
	// the last GC).
	ControlPlaneHeapAllocBytes int64 `json:"control_plane_heap_alloc_bytes_at_end"`
	ControlPlaneNextGCBytes    int64 `json:"control_plane_next_gc_bytes_at_end"`
}

// ColdStart: every agent connects at once to a ready replica holding the
// whole cluster, and receives and acknowledges its full state.
type ColdStart struct {
	PhaseCost
	// AllFirstDeltaSeconds: until every agent acknowledged its first Delta
	// (authentication, registration, first bounded Delta).
	AllFirstDeltaSeconds float64 `json:"all_first_delta_seconds"`
	// FirstDeltaReceived*: start until an agent's first Delta was handed to
	// its Apply (before it is applied: what the control plane and the
	// authentication took, plus scheduling in this busy process).
	FirstDeltaReceivedP50Seconds float64 `json:"first_delta_received_p50_seconds"`
	FirstDeltaReceivedMaxSeconds float64 `json:"first_delta_received_max_seconds"`
	// AgentSync*: per agent, start until it held its full state.
	AgentSyncP50Seconds  float64 `json:"agent_sync_p50_seconds"`
	AgentSyncP99Seconds  float64 `json:"agent_sync_p99_seconds"`
	WireBytesPerAgent    int64   `json:"wire_bytes_per_agent"`
	PayloadBytesPerAgent int64   `json:"payload_bytes_per_agent"`
	DeltasPerAgent       float64 `json:"deltas_per_agent"`
	// StreamFailures: agent streams that ended, or failed to open, during
	// the phase; the client retried them (see the test log for why).
	StreamFailures int64 `json:"stream_failures"`
	// AgentHeap*: this process's live heap after the cold start (after a
	// GC), over the agents and over agent x Service: what an agent's
	// reconciler and in-memory kernel hold (plus the harness, small).
	AgentHeapBytes           int64 `json:"test_process_live_heap_bytes"`
	AgentHeapPerAgent        int64 `json:"live_heap_bytes_per_agent"`
	AgentHeapPerAgentService int64 `json:"live_heap_bytes_per_agent_service"`
}

// SingleChange: one endpoint of one Service's slice replaced, one change at
// a time; latency is the write's response until an agent's Ack of the
// Service with the new endpoint, over every agent and change.
type SingleChange struct {
	Changes      int     `json:"changes"`
	Samples      int     `json:"samples"`
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	LatencyMaxMS float64 `json:"latency_max_ms"`
	// Received*: the write's response until the Delta was handed to the
	// agent's Apply (the part before the agent's own work).
	ReceivedP50MS float64 `json:"received_p50_ms"`
	ReceivedP99MS float64 `json:"received_p99_ms"`
	// FromSent*: from when the writer sent the request (an upper bound:
	// the agents may Ack before the writer has its response).
	FromSentP50MS float64       `json:"from_request_sent_p50_ms"`
	FromSentP99MS float64       `json:"from_request_sent_p99_ms"`
	PerChange     []ChangeStats `json:"per_change"`
	// Per change, averaged.
	WireBytesPerChange    float64 `json:"wire_bytes_per_change"`
	PayloadBytesPerChange float64 `json:"payload_bytes_per_change"`
	DeltasPerChange       float64 `json:"deltas_per_change"`
	CPUSecondsPerChange   float64 `json:"control_plane_cpu_seconds_per_change"`
	// Net of the idle baseline's CPU over the same time.
	CPUSecondsPerChangeNetOfIdle float64   `json:"control_plane_cpu_seconds_per_change_net_of_idle"`
	Total                        PhaseCost `json:"total"`
}

// ChangeStats is one single change over all agents.
type ChangeStats struct {
	Service      string  `json:"service"`
	P50MS        float64 `json:"p50_ms"`
	P99MS        float64 `json:"p99_ms"`
	MaxMS        float64 `json:"max_ms"`
	WireBytes    int64   `json:"wire_bytes"`
	PayloadBytes int64   `json:"payload_bytes"`
	Deltas       int64   `json:"deltas"`
}

// Burst: Slices slices changed at once by Writers writers; latency per
// (agent, Service) from that Service's write response to the agent's Ack.
type Burst struct {
	PhaseCost
	Slices       int     `json:"slices"`
	Writers      int     `json:"writers"`
	WriteSeconds float64 `json:"write_seconds"`
	Samples      int     `json:"samples"`
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	LatencyMaxMS float64 `json:"latency_max_ms"`
	// Received*: as SingleChange's.
	ReceivedP50MS float64 `json:"received_p50_ms"`
	ReceivedP99MS float64 `json:"received_p99_ms"`
	FromSentP50MS float64 `json:"from_request_sent_p50_ms"`
	FromSentP99MS float64 `json:"from_request_sent_p99_ms"`
	// AcksBeforeResponse: Acks taken before the writer had the API
	// server's response (the watch event overtook it); counted with a
	// negative latency.
	AcksBeforeResponse int `json:"acks_before_write_response"`
	// ConvergeSeconds: first write sent until the last Ack.
	ConvergeSeconds float64 `json:"converge_seconds"`
}

// Reconnect: every agent's stream cut (client stopped, reconciler and
// kernel kept) and reopened at once; nothing changed meanwhile. With
// FreshClients the clients are new (an agent restart with its saved state),
// otherwise the same (a lost replica); either Hello carries the system
// version held (a restarted agent's listed every version before 2026-12-07).
type Reconnect struct {
	PhaseCost
	FreshClients bool `json:"fresh_clients"`
	// Ratios of this phase's bytes to the cold start's (to the agents; both
	// ways).
	WireRatio     float64 `json:"wire_ratio_to_cold_start"`
	BothWaysRatio float64 `json:"both_ways_ratio_to_cold_start"`
	PayloadRatio  float64 `json:"payload_ratio_to_cold_start"`
	// StreamFailures: reopened streams that failed (or ended) and were
	// retried by the client before the agent was back in sync.
	StreamFailures int64 `json:"stream_failures"`
}

// Goal is a headline against its target.
type Goal struct {
	Name string `json:"name"`
	// Value and Limit in Unit; Ratio = Value / Limit (< 1 meets it).
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Unit  string  `json:"unit"`
	Ratio float64 `json:"ratio"`
	Met   bool    `json:"met"`
}

func goal(name string, value, limit float64, unit string) Goal {
	return Goal{Name: name, Value: value, Limit: limit, Unit: unit, Ratio: value / limit, Met: value < limit}
}

// quantile is the nearest-rank q-quantile of xs (sorted in place).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

func secs(ns int64) float64 { return float64(ns) / 1e9 }

// write writes rep to dir/name.json and dir/name.md.
func (rep *Report) write(dir, name string) error {
	return measure.WriteReport(dir, name, rep, rep.Markdown())
}

// Headlines are the goal lines, one per goal, for logs.
func (rep *Report) Headlines() []string {
	var out []string
	for _, g := range rep.Goals {
		verdict := "meets"
		if !g.Met {
			verdict = "MISSES"
		}
		out = append(out, fmt.Sprintf("%s: %.4g %s (goal < %.4g %s, ratio %.3f: %s)", g.Name, g.Value, g.Unit, g.Limit, g.Unit, g.Ratio, verdict))
	}
	out = append(out, fmt.Sprintf("reconnect storm bytes from the agents: %s against the restart storm's %s in the same run, ratio %.4f",
		human(rep.Reconnect.WireBytesFromAgents), human(rep.RestartStorm.WireBytesFromAgents), rep.HelloBytesRatio))
	return out
}

// Markdown is a short summary.
func (rep *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Fan-out benchmark: %s\n\n", rep.Size)
	fmt.Fprintf(&b, "%s, %d CPUs, load average %s before, %s after (shared machine: times may be inflated). %s.\n\n",
		rep.Time, rep.Host.CPUs, rep.Host.LoadAvgBefore, rep.Host.LoadAvgAfter, rep.Transport)
	fmt.Fprintf(&b, "Code: %s with %d uncommitted changes under controlplane/, dataplane/, internal/, proto/ (listed in the JSON).\n\n",
		rep.Source.GitHead, len(rep.Source.Uncommitted))
	if len(rep.ControlPlane.Env) > 0 {
		fmt.Fprintf(&b, "Control plane run with %s.\n\n", strings.Join(rep.ControlPlane.Env, " "))
	}
	b.WriteString("| goal | measured | target | ratio | |\n|---|---:|---:|---:|---|\n")
	for _, g := range rep.Goals {
		mark := "met"
		if !g.Met {
			mark = "**missed**"
		}
		fmt.Fprintf(&b, "| %s | %.4g %s | < %.4g %s | %.3f | %s |\n", g.Name, g.Value, g.Unit, g.Limit, g.Unit, g.Ratio, mark)
	}
	cs, sc, bu, rc, rs, cp := rep.ColdStart, rep.SingleChange, rep.Burst, rep.Reconnect, rep.RestartStorm, rep.ControlPlane
	b.WriteString("\n| phase | time | to agents (wire) | payload | Deltas | control-plane CPU |\n|---|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| control plane ready (initial sync) | %.2f s | | | | %.2f s |\n", cp.ReadySeconds, cp.ReadyCPUSeconds)
	fmt.Fprintf(&b, "| cold start (all agents in sync) | %.2f s | %s | %s | %d | %.2f s |\n", cs.Seconds, human(cs.WireBytesToAgents), human(cs.PayloadBytes), cs.Deltas, cs.ControlPlaneCPUSeconds)
	fmt.Fprintf(&b, "| single change (per change, mean) | p50 %.1f ms, p99 %.1f ms | %s | %s | %.1f | %.3f s |\n", sc.LatencyP50MS, sc.LatencyP99MS, human(int64(sc.WireBytesPerChange)), human(int64(sc.PayloadBytesPerChange)), sc.DeltasPerChange, sc.CPUSecondsPerChange)
	fmt.Fprintf(&b, "| %d-slice burst | p50 %.1f ms, p99 %.1f ms, all in %.2f s | %s | %s | %d | %.2f s |\n", bu.Slices, bu.LatencyP50MS, bu.LatencyP99MS, bu.ConvergeSeconds, human(bu.WireBytesToAgents), human(bu.PayloadBytes), bu.Deltas, bu.ControlPlaneCPUSeconds)
	fmt.Fprintf(&b, "| restart storm, new clients (all back in sync) | %.2f s | %s | %s | %d | %.2f s |\n", rs.Seconds, human(rs.WireBytesToAgents), human(rs.PayloadBytes), rs.Deltas, rs.ControlPlaneCPUSeconds)
	fmt.Fprintf(&b, "| reconnect storm, same clients (all back in sync) | %.2f s | %s | %s | %d | %.2f s |\n", rc.Seconds, human(rc.WireBytesToAgents), human(rc.PayloadBytes), rc.Deltas, rc.ControlPlaneCPUSeconds)
	fmt.Fprintf(&b, "\nControl plane (own process): %.1f CPU s over the run, peak RSS %s (%s when ready); idle with every agent connected %.1f%% of a core; per single change %.3f CPU s net of idle.\n",
		cp.CPUSecondsTotal, human(cp.PeakRSSBytes), human(cp.PeakRSSWhenReady), 100*rep.Idle.ControlPlaneCPUSeconds/max(rep.Idle.Seconds, 1e-9), sc.CPUSecondsPerChangeNetOfIdle)
	fmt.Fprintf(&b, "Its RSS / Go heap allocated / next-GC target at the end of: cold start %s / %s / %s; single changes %s / %s / %s; burst %s / %s / %s; restart storm %s / %s / %s; reconnect storm %s / %s / %s.\n",
		human(cs.ControlPlaneRSSBytes), human(cs.ControlPlaneHeapAllocBytes), human(cs.ControlPlaneNextGCBytes),
		human(sc.Total.ControlPlaneRSSBytes), human(sc.Total.ControlPlaneHeapAllocBytes), human(sc.Total.ControlPlaneNextGCBytes),
		human(bu.ControlPlaneRSSBytes), human(bu.ControlPlaneHeapAllocBytes), human(bu.ControlPlaneNextGCBytes),
		human(rs.ControlPlaneRSSBytes), human(rs.ControlPlaneHeapAllocBytes), human(rs.ControlPlaneNextGCBytes),
		human(rc.ControlPlaneRSSBytes), human(rc.ControlPlaneHeapAllocBytes), human(rc.ControlPlaneNextGCBytes))
	fmt.Fprintf(&b, "\nCold start: every agent's first Delta received within %.2f s (p50 %.2f s) and acknowledged within %.2f s; per-agent full sync p50 %.2f s, p99 %.2f s; %d TokenReviews. Agents' live heap %s per agent (%d B per agent x Service).\n",
		cs.FirstDeltaReceivedMaxSeconds, cs.FirstDeltaReceivedP50Seconds, cs.AllFirstDeltaSeconds, cs.AgentSyncP50Seconds, cs.AgentSyncP99Seconds, cs.TokenReviews, human(cs.AgentHeapPerAgent), cs.AgentHeapPerAgentService)
	fmt.Fprintf(&b, "\nFrom the write request sent instead of its response: single change p50 %.1f ms, p99 %.1f ms; burst p50 %.1f ms, p99 %.1f ms.\n",
		sc.FromSentP50MS, sc.FromSentP99MS, bu.FromSentP50MS, bu.FromSentP99MS)
	fmt.Fprintf(&b, "\nUntil the Delta reached the agent's Apply (before its own work): single change p50 %.1f ms, p99 %.1f ms; burst p50 %.1f ms, p99 %.1f ms (%d of %d burst Acks came before the writer had its response).\n",
		sc.ReceivedP50MS, sc.ReceivedP99MS, bu.ReceivedP50MS, bu.ReceivedP99MS, bu.AcksBeforeResponse, bu.Samples)
	fmt.Fprintf(&b, "\nFrom the agents (Hellos, Acks, TLS): restart storm %s (new clients), reconnect storm %s (the same clients) = %.4f of the restart storm's, every Hello with the system version held; to them %s and %s.\n",
		human(rs.WireBytesFromAgents), human(rc.WireBytesFromAgents), rep.HelloBytesRatio, human(rs.WireBytesToAgents), human(rc.WireBytesToAgents))
	fmt.Fprintf(&b, "\nAgent streams that ended or failed to open and were retried: %d during the cold start, %d from then until the storms, %d in the restart storm, %d in the reconnect storm.\n",
		cs.StreamFailures, rep.StreamFailuresBeforeStorm, rs.StreamFailures, rc.StreamFailures)
	fmt.Fprintf(&b, "\nBytes: %s\n", rep.BytesMethod)
	if len(rep.Problems) > 0 {
		b.WriteString("\n## Problems\n\n")
		for _, p := range rep.Problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	if len(rep.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range rep.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
