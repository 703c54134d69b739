package apicost

import (
	"fmt"
	"strings"

	"github.com/vsplane/vsplane/e2e/measure"
)

// Report is what Run measured, written as apicost.json (and a Markdown
// table, apicost.md). Counters are the API server's own (see Metrics);
// bytes are encoded object sizes as the API server counts them (before
// TLS and HTTP/2 framing).
type Report struct {
	Time           string `json:"time"`
	Size           Size   `json:"size"`
	SliceUpdates   int    `json:"slice_updates"`
	ServiceUpdates int    `json:"service_updates"`
	Host           Host   `json:"host"`
	// Metrics names the API server metrics read.
	Metrics   []string          `json:"metrics"`
	Setup     Setup             `json:"setup"`
	Scenarios []*ScenarioResult `json:"scenarios"`
	// Ratios compare the kube-proxy-like scenario with the control plane's.
	Ratios Ratios `json:"ratios"`
	// Headline is the one-line result.
	Headline string   `json:"headline"`
	Problems []string `json:"problems"`
	Notes    []string `json:"notes"`
}

// Host describes the machine; the load average shows how shared it was.
type Host struct {
	CPUs          int    `json:"cpus"`
	LoadAvgBefore string `json:"loadavg_before"`
	LoadAvgAfter  string `json:"loadavg_after"`
	GoVersion     string `json:"go_version"`
	// KubeBinDir names the kube-apiserver/etcd build (version-version).
	KubeBinDir string `json:"kube_binaries"`
}

// Setup is the cluster's creation.
type Setup struct {
	Objects int     `json:"objects"`
	Seconds float64 `json:"seconds"`
	Writers int     `json:"writers"`
}

// ScenarioResult is one scenario: its start (from no watcher to every
// watcher synced) and its churn (from the first write until every watcher
// held the last version of every changed object).
type ScenarioResult struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Watchers    int    `json:"watchers"`
	ContentType string `json:"content_type,omitempty"`
	// Connections the scenario's clients dialed.
	Connections int64 `json:"connections"`
	// Initial is the start's metric deltas; Churn the churn's; ChurnNet is
	// Churn minus the baseline scenario's churn (the API server's own
	// watchers), i.e. what the scenario's watchers cost.
	Initial  Delta `json:"initial_sync"`
	Churn    Delta `json:"churn"`
	ChurnNet Delta `json:"churn_net"`
	// Converged: every watcher ended with every change.
	Converged         bool    `json:"converged"`
	SyncSeconds       float64 `json:"sync_seconds"`
	ChurnWriteSeconds float64 `json:"churn_write_seconds"`
	ConvergeSeconds   float64 `json:"converge_seconds"`
	// APIServer is kube-apiserver's process: CPU seconds (user+system)
	// spent in each phase and its resident memory. The whole process,
	// including its own controllers; the machine is shared, so these are
	// indications.
	APIServer APIServerStats `json:"kube_apiserver"`
}

// APIServerStats: see ScenarioResult.APIServer.
type APIServerStats struct {
	SyncCPUSeconds  float64 `json:"sync_cpu_seconds"`
	ChurnCPUSeconds float64 `json:"churn_cpu_seconds"`
	RSSBytesBefore  int64   `json:"rss_bytes_before"`
	RSSBytesSynced  int64   `json:"rss_bytes_synced"`
}

// Ratios are kube-proxy-like / control plane, over the watched resources.
type Ratios struct {
	// ChurnWatchEvents: watch events sent for the churn (net of the API
	// server's own watchers); independent of the encoding.
	ChurnWatchEvents float64 `json:"churn_watch_events"`
	// ChurnWatchBytes: bytes of those events, both protobuf;
	// ChurnWatchBytesVsJSON against the control plane's JSON client.
	ChurnWatchBytes       float64 `json:"churn_watch_bytes"`
	ChurnWatchBytesVsJSON float64 `json:"churn_watch_bytes_vs_json"`
	// InitialEvents and InitialBytes: the start (watch events + LIST
	// bytes), both protobuf.
	InitialWatchEvents float64 `json:"initial_watch_events"`
	InitialBytes       float64 `json:"initial_bytes"`
}

// Scenario returns the named scenario's result, nil if it did not run.
func (r *Report) Scenario(name string) *ScenarioResult {
	for _, s := range r.Scenarios {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// finish computes the net churn, the ratios and the headline.
func (r *Report) finish() {
	base := r.Scenario(ScenarioBaseline)
	for _, s := range r.Scenarios {
		if base != nil {
			s.ChurnNet = s.Churn.sub(base.Churn)
		}
	}
	kp, cp, cpPB := r.Scenario(ScenarioKubeProxy), r.Scenario(ScenarioControlPlane), r.Scenario(ScenarioControlPlanePB)
	if kp == nil || cp == nil || cpPB == nil || !kp.Converged || !cp.Converged || !cpPB.Converged {
		r.Headline = "incomplete: a scenario did not converge (see problems)"
		return
	}
	r.Ratios = Ratios{
		ChurnWatchEvents:      ratio(kp.ChurnNet.Total.WatchEvents, cpPB.ChurnNet.Total.WatchEvents),
		ChurnWatchBytes:       ratio(kp.ChurnNet.Total.WatchBytes, cpPB.ChurnNet.Total.WatchBytes),
		ChurnWatchBytesVsJSON: ratio(kp.ChurnNet.Total.WatchBytes, cp.ChurnNet.Total.WatchBytes),
		InitialWatchEvents:    ratio(kp.Initial.Total.WatchEvents, cpPB.Initial.Total.WatchEvents),
		InitialBytes: ratio(kp.Initial.Total.WatchBytes+kp.Initial.Total.ListBytes,
			cpPB.Initial.Total.WatchBytes+cpPB.Initial.Total.ListBytes),
	}
	r.Notes = append(r.Notes, r.listNote())
	r.Headline = fmt.Sprintf("churn of %d slice + %d Service updates: %d kube-proxy-like watchers cost the API server %.0fx the watch events and %.0fx the bytes (protobuf both; %.0fx against the control plane's JSON client) of one vsplane control-plane watch; start: %.0fx the bytes",
		r.SliceUpdates, r.ServiceUpdates, kp.Watchers, r.Ratios.ChurnWatchEvents, r.Ratios.ChurnWatchBytes, r.Ratios.ChurnWatchBytesVsJSON, r.Ratios.InitialBytes)
}

// listNote says whether the watchers' start used LIST requests: client-go
// 1.35+ informers stream the initial state as watch events (WatchListClient).
func (r *Report) listNote() string {
	var lists, self float64
	for _, s := range r.Scenarios {
		lists += s.Initial.Total.ListRequests
		self += s.Initial.Total.SelfListRequests
	}
	if lists == self {
		return fmt.Sprintf("No scenario's watcher sent a LIST: client-go 1.35+ informers (WatchListClient, on by default) get the initial state as a streamed watch (sendInitialEvents), so the start's cost shows as watch events and bytes; the %.0f LIST(s) seen are the API server's own (its ClusterIP repair loop lists every Service every few minutes).", self)
	}
	return fmt.Sprintf("%.0f LIST requests during the starts, %.0f of them the API server's own; the rest are watchers that fell back from the streamed watch-list to LIST.", lists, self)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// summary is the report as lines for the test log.
func (r *Report) summary() []string {
	out := []string{fmt.Sprintf("size %s, %d slice + %d Service updates, loadavg %s -> %s",
		r.Size, r.SliceUpdates, r.ServiceUpdates, r.Host.LoadAvgBefore, r.Host.LoadAvgAfter)}
	for _, s := range r.Scenarios {
		out = append(out, fmt.Sprintf("%-30s watchers %5d conns %5d | start: %9.0f events %s (+%.0f LIST (%.0f self), %s) in %.1fs | churn: %9.0f events %s (net %9.0f events %s), converged %v in %.1fs",
			s.Name, s.Watchers, s.Connections, s.Initial.Total.WatchEvents, mib(s.Initial.Total.WatchBytes),
			s.Initial.Total.ListRequests, s.Initial.Total.SelfListRequests, mib(s.Initial.Total.ListBytes), s.SyncSeconds,
			s.Churn.Total.WatchEvents, mib(s.Churn.Total.WatchBytes), s.ChurnNet.Total.WatchEvents, mib(s.ChurnNet.Total.WatchBytes),
			s.Converged, s.ConvergeSeconds))
	}
	out = append(out, "HEADLINE: "+r.Headline)
	for _, p := range r.Problems {
		out = append(out, "PROBLEM: "+p)
	}
	return out
}

func mib(b float64) string { return fmt.Sprintf("%.2f MiB", b/(1<<20)) }

// write stores apicost.json and apicost.md in dir.
func (r *Report) write(dir string) error {
	return measure.WriteReport(dir, "apicost", r, r.markdown())
}

func (r *Report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# API-server cost: kube-proxy-like watchers vs one vsplane control plane\n\n")
	fmt.Fprintf(&b, "%s; churn: %d EndpointSlice updates (one endpoint replaced each) + %d Service updates. "+
		"kube-apiserver %s on 127.0.0.1, %d CPUs, loadavg %s before, %s after. Generated by `e2e/apicost` (%s).\n\n",
		r.Size, r.SliceUpdates, r.ServiceUpdates, r.Host.KubeBinDir, r.Host.CPUs, r.Host.LoadAvgBefore, r.Host.LoadAvgAfter, r.Time)
	fmt.Fprintf(&b, "**%s**\n\n", r.Headline)
	b.WriteString("| scenario | watchers | conns | start: watch events | start: watch bytes | start: LISTs, self, bytes | churn: watch events, net | churn: watch bytes, net | apiserver CPU s start / churn |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Scenarios {
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %s | %.0f, %.0f, %s | %.0f, %.0f | %s, %s | %.1f / %.1f |\n",
			s.Name, s.Watchers, s.Connections, s.Initial.Total.WatchEvents, mib(s.Initial.Total.WatchBytes),
			s.Initial.Total.ListRequests, s.Initial.Total.SelfListRequests, mib(s.Initial.Total.ListBytes),
			s.Churn.Total.WatchEvents, s.ChurnNet.Total.WatchEvents, mib(s.Churn.Total.WatchBytes), mib(s.ChurnNet.Total.WatchBytes),
			s.APIServer.SyncCPUSeconds, s.APIServer.ChurnCPUSeconds)
	}
	b.WriteString("\nNet = minus the baseline (the API server's own watchers of Services and EndpointSlices). " +
		"Counters are summed over services, endpointslices, nodes, namespaces, servicecidrs and schedulerrollouts; " +
		"per resource in apicost.json. Metrics: " + strings.Join(r.Metrics, ", ") + ".\n")
	if len(r.Notes) > 0 {
		b.WriteString("\nNotes:\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	if len(r.Problems) > 0 {
		b.WriteString("\nProblems:\n\n")
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "- %s\n", p)
		}
	}
	return b.String()
}
