package soak

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vsplane/vsplane/e2e/measure"
)

// Report is a soak's result: bench/results/soak-DATE.{json,md} (make soak)
// or _out/soak/ (CI).
type Report struct {
	Date     string        `json:"date"`
	Seed     uint64        `json:"seed"`
	Duration time.Duration `json:"duration_ns"`
	Elapsed  time.Duration `json:"elapsed_ns"`
	// Bed is where it ran: "" the VM test bed (make soak), RealBed the
	// real-node cluster (make soak REAL_NODES=1).
	Bed      string `json:"bed,omitempty"`
	Nodes    int    `json:"nodes"`
	Replicas int    `json:"replicas"`
	Load     string `json:"host_loadavg"`
	// Faults as run, with their convergence times.
	Faults []FaultResult `json:"faults"`
	// Traffic per stable Service loop.
	Traffic []TrafficResult `json:"traffic"`
	// Churn counts API writes to the churned Services by operation.
	Churn map[string]int `json:"churn"`
	// ChurnErrors counts writes that failed (the apiserver down).
	ChurnErrors int                `json:"churn_errors"`
	Memory      []MemorySeries     `json:"memory"`
	Violations  []Violation        `json:"violations"`
	ByKind      map[Kind]KindStats `json:"by_kind"`
	// Plot is the memory plot's file name beside the report (WritePlot).
	Plot string `json:"plot,omitempty"`
}

// FaultResult is one fault as run.
type FaultResult struct {
	Fault
	// Started is the real offset it started at (later than At when the
	// previous fault's convergence ran long).
	Started time.Duration `json:"started_ns"`
	// Converged is the time from the fault's end (process back, outage
	// over, drift written) to every node's kernel equal to its desired
	// state and every agent acked; 0 with Err.
	Converged time.Duration `json:"converged_ns"`
	Err       string        `json:"error,omitempty"`
}

// KindStats aggregates the faults of one kind.
type KindStats struct {
	Count int           `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
	// Failed counts faults that did not converge within the bound.
	Failed int `json:"failed"`
}

// TrafficResult is one request loop's totals.
type TrafficResult struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Sent   int    `json:"sent"`
	Failed int    `json:"failed"`
	// DuringDrift are the failures while a drift fault broke the path's
	// node (expected; not violations).
	DuringDrift int `json:"failed_during_drift"`
	// Wrong are answers that broke the path's own check outside drift
	// (affinity moved; a Local NodePort answered by another node's pod or
	// without the client's address): each is a violation too.
	Wrong int `json:"wrong_answers"`
}

// MemorySeries is one process's memory and goroutines over time.
type MemorySeries struct {
	Name    string         `json:"name"`
	Samples []MemorySample `json:"samples"`
	// RSSSlope and GoroutineSlope are least-squares slopes (per minute)
	// over the second half of the samples since the process last started;
	// Span is that half's length (too short to say much when small).
	RSSSlope       float64       `json:"rss_bytes_per_min"`
	GoroutineSlope float64       `json:"goroutines_per_min"`
	Span           time.Duration `json:"span_ns"`
}

// MemorySample is one reading; Start tells restarts apart.
type MemorySample struct {
	At         time.Duration `json:"at_ns"`
	RSS        int64         `json:"rss_bytes"`
	Goroutines int           `json:"goroutines"`
	Start      float64       `json:"process_start"`
}

// Violation is one broken invariant.
type Violation struct {
	At      time.Duration `json:"at_ns"`
	Seed    uint64        `json:"seed"`
	What    string        `json:"what"`
	Context string        `json:"context"`
}

func (v Violation) String() string {
	return fmt.Sprintf("VIOLATION at +%v (seed %d): %s: %s", v.At.Round(time.Millisecond), v.Seed, v.What, v.Context)
}

// Write writes the report as dir/name.{json,md,png} (dir relative to the
// repository's root unless absolute) and returns dir/name.
func (r *Report) Write(dir, name string) (string, error) {
	if !filepath.IsAbs(dir) {
		root, err := measure.RepoRoot(".")
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, dir)
	}
	r.Plot = name + ".png"
	if err := measure.WriteReport(dir, name, r, r.Markdown()); err != nil {
		return "", err
	}
	if err := r.WritePlot(filepath.Join(dir, r.Plot)); err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

// allKinds are both beds' kinds, in the order reports list them.
func allKinds() []Kind { return append(slices.Clone(Kinds), AgentPodDelete, ReplicaPodDelete) }

// RealBed is Report.Bed of a soak on the real-node cluster.
const RealBed = "real-nodes"

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Slope is the least-squares slope of ys over xs (0 for fewer than two
// distinct xs).
func Slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

// Summarize fills the series' slopes: the second half of the samples of
// the process's last run.
func (m *MemorySeries) Summarize() {
	last := m.Samples
	for i := len(last) - 1; i > 0; i-- {
		if last[i-1].Start != last[i].Start {
			last = last[i:]
			break
		}
	}
	half := last[len(last)/2:]
	if len(half) < 2 {
		return
	}
	var xs, rss, gs []float64
	for _, s := range half {
		xs = append(xs, s.At.Minutes())
		rss = append(rss, float64(s.RSS))
		gs = append(gs, float64(s.Goroutines))
	}
	m.RSSSlope, m.GoroutineSlope = Slope(xs, rss), Slope(xs, gs)
	m.Span = half[len(half)-1].At - half[0].At
}

// Aggregate fills ByKind from Faults.
func (r *Report) Aggregate() {
	r.ByKind = map[Kind]KindStats{}
	for _, k := range allKinds() {
		var ds []time.Duration
		st := KindStats{}
		for _, f := range r.Faults {
			if f.Kind != k {
				continue
			}
			st.Count++
			if f.Err != "" {
				st.Failed++
				continue
			}
			ds = append(ds, f.Converged)
		}
		if st.Count == 0 {
			continue
		}
		st.P50, st.P99, st.Max = Percentile(ds, 50), Percentile(ds, 99), Percentile(ds, 100)
		r.ByKind[k] = st
	}
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	ms := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	bed, replay := "", "make soak"
	if r.Bed == RealBed {
		bed, replay = ", real nodes", "make soak REAL_NODES=1"
	}
	fmt.Fprintf(&b, "# Chaos soak %s%s\n\n", r.Date, bed)
	fmt.Fprintf(&b, "Seed **%d** (replay: `%s SEED=%d DURATION=%v`), %v of faults (%v in all), %d nodes, %d control-plane replicas; host load %s.\n\n",
		r.Seed, replay, r.Seed, r.Duration, r.Duration, r.Elapsed.Round(time.Second), r.Nodes, r.Replicas, r.Load)
	fmt.Fprintf(&b, "Violations: **%d**\n\n", len(r.Violations))
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(&b, "- ... %d more in the JSON report\n", len(r.Violations)-i)
			break
		}
		fmt.Fprintf(&b, "- %s\n", strings.ReplaceAll(v.String(), "\n", " "))
	}
	b.WriteString("\n## Faults by kind\n\nConvergence: from the fault's end (process back, outage over, drift written) to every node's kernel equal to its desired state (the agent's GetKernelState over IPVS, kube-ipvs0, ipsets and iptables: no difference, no failed resource) and every agent connected with nothing unacknowledged.\n\n")
	b.WriteString("| kind | count | p50 | p99 | max | not converged |\n|---|---:|---:|---:|---:|---:|\n")
	for _, k := range allKinds() {
		if st, ok := r.ByKind[k]; ok {
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d |\n", k, st.Count, ms(st.P50), ms(st.P99), ms(st.Max), st.Failed)
		}
	}
	b.WriteString("\n## Traffic to the stable Services\n\n| loop | target | sent | failed | of them during drift of its node | wrong answers |\n|---|---|---:|---:|---:|---:|\n")
	for _, tr := range r.Traffic {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d |\n", tr.Name, tr.Target, tr.Sent, tr.Failed, tr.DuringDrift, tr.Wrong)
	}
	b.WriteString("\n## Churn of other Services\n\n| operation | count |\n|---|---:|\n")
	for _, op := range slices.Sorted(maps.Keys(r.Churn)) {
		fmt.Fprintf(&b, "| %s | %d |\n", op, r.Churn[op])
	}
	fmt.Fprintf(&b, "| (failed writes) | %d |\n", r.ChurnErrors)
	b.WriteString("\n## Memory and goroutines\n\nSlopes over the second half of each process's last run (a restarted process starts a new run).\n\n")
	if len(r.Memory) == 0 {
		b.WriteString("Not sampled in this run.\n")
	}
	if r.Plot != "" {
		fmt.Fprintf(&b, "![RSS and goroutines of every process over the run](%s)\n\n", r.Plot)
	}
	b.WriteString("| process | samples | first RSS | last RSS | RSS slope | goroutines first/last | goroutine slope | over |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range r.Memory {
		if len(m.Samples) == 0 {
			continue
		}
		f, l := m.Samples[0], m.Samples[len(m.Samples)-1]
		fmt.Fprintf(&b, "| %s | %d | %.1f MiB | %.1f MiB | %+.2f MiB/min | %d / %d | %+.2f /min | %v |\n",
			m.Name, len(m.Samples), mib(f.RSS), mib(l.RSS), m.RSSSlope/(1<<20), f.Goroutines, l.Goroutines, m.GoroutineSlope, m.Span.Round(time.Second))
	}
	b.WriteString("\n## Faults as run\n\n| # | scheduled | started | fault | converged |\n|---:|---:|---:|---|---|\n")
	for _, f := range r.Faults {
		conv := ms(f.Converged)
		if f.Err != "" {
			conv = "NOT: " + strings.ReplaceAll(firstLine(f.Err), "|", "/")
		}
		fmt.Fprintf(&b, "| %d | %v | %v | %s | %s |\n", f.Seq, f.At, f.Started.Round(100*time.Millisecond), f.Fault, conv)
	}
	return b.String()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
