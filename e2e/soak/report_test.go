package soak

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(101-i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {1, time.Millisecond}} {
		if got := Percentile(ds, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if Percentile(nil, 50) != 0 || Percentile([]time.Duration{7}, 99) != 7 {
		t.Error("empty or single-value percentiles")
	}
}

func TestSlopeAndSummarize(t *testing.T) {
	if s := Slope([]float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}); math.Abs(s-2) > 1e-9 {
		t.Fatalf("slope %v, want 2", s)
	}
	if Slope([]float64{1}, []float64{1}) != 0 || Slope([]float64{1, 1}, []float64{1, 2}) != 0 {
		t.Fatal("degenerate slopes")
	}
	// A restart (new start time) at minute 10: only the last run's second
	// half counts, where RSS grows 1 MiB a minute and goroutines stay flat.
	m := MemorySeries{Name: "agent node1"}
	for i := range 10 {
		m.Samples = append(m.Samples, MemorySample{At: time.Duration(i) * time.Minute, RSS: 100 << 20, Goroutines: 500, Start: 1})
	}
	for i := 10; i < 30; i++ {
		m.Samples = append(m.Samples, MemorySample{At: time.Duration(i) * time.Minute, RSS: int64(i) << 20, Goroutines: 40, Start: 2})
	}
	m.Summarize()
	if math.Abs(m.RSSSlope-(1<<20)) > 1 || m.GoroutineSlope != 0 || m.Span != 9*time.Minute {
		t.Fatalf("slopes %v B/min, %v goroutines/min over %v; want 1 MiB/min, 0, 9m", m.RSSSlope, m.GoroutineSlope, m.Span)
	}
}

func TestReportAggregateAndMarkdown(t *testing.T) {
	r := &Report{Date: "2026-12-05", Seed: 7, Duration: 3 * time.Minute, Faults: []FaultResult{
		{Fault: Fault{Seq: 1, Kind: AgentKill}, Converged: time.Second},
		{Fault: Fault{Seq: 2, Kind: AgentKill}, Converged: 3 * time.Second},
		{Fault: Fault{Seq: 3, Kind: DriftIPVSFlush}, Err: "not within 1m0s"},
	}, Churn: map[string]int{"create": 2}}
	r.Aggregate()
	if st := r.ByKind[AgentKill]; st.Count != 2 || st.P50 != time.Second || st.Max != 3*time.Second || st.Failed != 0 {
		t.Fatalf("agent-kill stats %+v", st)
	}
	if st := r.ByKind[DriftIPVSFlush]; st.Count != 1 || st.Failed != 1 {
		t.Fatalf("drift stats %+v", st)
	}
	md := r.Markdown()
	for _, want := range []string{"Seed **7**", "make soak SEED=7 DURATION=3m0s", "| agent-kill | 2 | 1s | 3s | 3s | 0 |", "NOT: not within 1m0s"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// TestRealBedReport: the real bed's own kinds are aggregated and listed,
// and the replay line names the real bed.
func TestRealBedReport(t *testing.T) {
	r := &Report{Bed: RealBed, Date: "2026-12-07", Seed: 6310, Duration: 150 * time.Second, Faults: []FaultResult{
		{Fault: Fault{Seq: 1, Kind: ReplicaPodDelete}, Converged: 4 * time.Second},
		{Fault: Fault{Seq: 2, Kind: AgentPodDelete}, Converged: 2 * time.Second},
	}}
	r.Aggregate()
	if r.ByKind[ReplicaPodDelete].Count != 1 || r.ByKind[AgentPodDelete].Count != 1 {
		t.Fatalf("by kind %+v", r.ByKind)
	}
	md := r.Markdown()
	for _, want := range []string{"real nodes", "make soak REAL_NODES=1 SEED=6310 DURATION=2m30s", "| replica-pod-delete | 1 | 4s |", "| agent-pod-delete | 1 | 2s |", "Not sampled"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// TestPlot: a restart breaks a process's line (runs), and the plot is a
// PNG the Markdown links to.
func TestPlot(t *testing.T) {
	s := func(min int, start float64) MemorySample {
		return MemorySample{At: time.Duration(min) * time.Minute, RSS: int64(20+min) << 20, Goroutines: 30 + min, Start: start}
	}
	samples := []MemorySample{s(0, 1), s(1, 1), s(2, 5), s(3, 5), s(4, 5)}
	if got := runs(samples); len(got) != 2 || len(got[0]) != 2 || len(got[1]) != 3 {
		t.Fatalf("runs = %v, want the 2 samples before the restart and the 3 after", got)
	}
	if got := runs(nil); len(got) != 0 {
		t.Fatalf("runs(nil) = %v", got)
	}
	r := &Report{Seed: 7, Duration: 5 * time.Minute, Plot: "soak-x.png",
		Memory: []MemorySeries{{Name: "agent node1", Samples: samples}, {Name: "replica 0", Samples: samples[:1]}}}
	path := t.TempDir() + "/soak-x.png"
	if err := r.WritePlot(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("plot: %d bytes, %v", len(b), err)
	}
	if !strings.Contains(r.Markdown(), "](soak-x.png)") {
		t.Fatal("the Markdown does not link the plot")
	}
}
