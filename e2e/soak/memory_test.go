package soak

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
	s, ok := ParseProcessMetrics(metrics)
	if !ok {
		return
	}
	s.At = at
	m.mu.Lock()
	m.samples[name] = append(m.samples[name], s)
	m.mu.Unlock()
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

func (m *memory) check(t *testing.T, series []MemorySeries) {
	for _, msg := range CheckSlopes(series, t.Logf) {
		m.r.violate("memory growth", "%s", msg)
	}
}
