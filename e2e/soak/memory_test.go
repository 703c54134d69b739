package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// memory samples every agent's and replica's RSS and goroutines from their
// /metrics (process_resident_memory_bytes, go_goroutines,
// process_start_time_seconds) every memInterval.
type memory struct {
	r       *run
	mu      sync.Mutex
	samples map[string][]MemorySample
}

const memInterval = 10 * time.Second

func newMemory(r *run) *memory { return &memory{r: r, samples: map[string][]MemorySample{}} }

func (m *memory) run(ctx context.Context) {
	tick := time.NewTicker(memInterval)
	defer tick.Stop()
	for {
		m.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (m *memory) sample(ctx context.Context) {
	at := m.r.since()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, n := range m.r.c.Nodes {
		if m.r.isPaused(n.Name) {
			continue
		}
		out, err := m.r.c.RunInNode(ctx, n.Name, "wget -qO- http://127.0.0.1:10249/metrics")
		if err == nil {
			m.add("agent "+n.Name, at, out)
		}
	}
	for _, rp := range m.r.c.ReplicaProcs {
		if rp.MetricsAddr == "" || !rp.Running() {
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+rp.MetricsAddr+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			m.add(fmt.Sprintf("replica %d", rp.Index), at, string(b))
		}
	}
}

func (m *memory) add(name string, at time.Duration, metrics string) {
	s, ok := parseProcessMetrics(metrics)
	if !ok {
		return
	}
	s.At = at
	m.mu.Lock()
	m.samples[name] = append(m.samples[name], s)
	m.mu.Unlock()
}

// parseProcessMetrics reads RSS, goroutines and start time from a
// Prometheus text exposition.
func parseProcessMetrics(text string) (MemorySample, bool) {
	var s MemorySample
	found := 0
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "process_resident_memory_bytes":
			s.RSS, found = int64(v), found+1
		case "go_goroutines":
			s.Goroutines, found = int(v), found+1
		case "process_start_time_seconds":
			s.Start, found = v, found+1
		}
	}
	return s, found == 3
}

func (m *memory) series() []MemorySeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []MemorySeries
	for _, n := range m.r.c.Nodes {
		out = append(out, MemorySeries{Name: "agent " + n.Name, Samples: m.samples["agent "+n.Name]})
	}
	for _, rp := range m.r.c.ReplicaProcs {
		name := fmt.Sprintf("replica %d", rp.Index)
		out = append(out, MemorySeries{Name: name, Samples: m.samples[name]})
	}
	for i := range out {
		out[i].Summarize()
	}
	return out
}

// Loose bounds on the second half's slopes, asserted only over a span of
// minSpan or more: the processes restart under the soak's faults, the
// churn keeps a varying number of Services, and the Go heap grows in steps
// (GC), so a short or noisy span says little; what these catch is a steady
// leak, e.g. a goroutine per reconnect or per fault.
const (
	minSpan           = 4 * time.Minute
	maxRSSSlope       = 2 << 20 // bytes per minute
	maxGoroutineSlope = 2.0     // per minute
)

func (m *memory) check(t *testing.T, series []MemorySeries) {
	for _, s := range series {
		if s.Span < minSpan {
			t.Logf("%s: slopes over %v (< %v, not asserted): RSS %+.2f MiB/min, goroutines %+.2f/min",
				s.Name, s.Span.Round(time.Second), minSpan, s.RSSSlope/(1<<20), s.GoroutineSlope)
			continue
		}
		if s.RSSSlope > maxRSSSlope || s.GoroutineSlope > maxGoroutineSlope {
			m.r.violate("memory growth", "%s over the last %v of its run: RSS %+.2f MiB/min (bound %d), goroutines %+.2f/min (bound %v)",
				s.Name, s.Span.Round(time.Second), s.RSSSlope/(1<<20), maxRSSSlope>>20, s.GoroutineSlope, maxGoroutineSlope)
		}
	}
}
