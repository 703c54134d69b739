// Package vmbench measures the agent's reconciler on the real kernel of the
// QEMU test bed; see vmbench_test.go (build tag vmbench) and e2e/cmd/vmbench.
package vmbench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Quantile is the nearest-rank q-quantile of ds (not modified).
func Quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	idx := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(idx, len(s)-1))]
}

// Result is the JSON output of e2e/cmd/vmbench (one run in one node
// namespace). Durations are milliseconds.
type Result struct {
	Services int `json:"services"`
	// ColdMS is the first Apply of N Services into an empty kernel.
	ColdMS  float64           `json:"cold_ms"`
	ColdOps map[string]uint32 `json:"cold_kernel_operations"`
	// Change* describe the one-endpoint-change Applies.
	Changes        int               `json:"changes"`
	ChangeMedianMS float64           `json:"change_median_ms"`
	ChangeP90MS    float64           `json:"change_p90_ms"`
	ChangeMinMS    float64           `json:"change_min_ms"`
	ChangeMaxMS    float64           `json:"change_max_ms"`
	ChangeOps      map[string]uint32 `json:"change_kernel_operations"`
	// Remove* describe removing one Service among N.
	Removes        int               `json:"removes"`
	RemoveMedianMS float64           `json:"remove_median_ms"`
	RemoveP90MS    float64           `json:"remove_p90_ms"`
	RemoveOps      map[string]uint32 `json:"remove_kernel_operations"`
	// KernelOpenMS is NewLinuxKernel + reconcile.New (probes, module loads).
	KernelOpenMS float64 `json:"kernel_open_ms"`

	Endpoints int `json:"endpoints"`
	// Unbatched: every kernel write went as its own netlink request
	// (vmbench --unbatched), the baseline before batching.
	Unbatched bool `json:"unbatched"`
	// ColdWrites is the kernel writes of the cold start and
	// ColdWritesPerSec their rate.
	ColdWrites       uint64  `json:"cold_writes"`
	ColdWritesPerSec float64 `json:"cold_writes_per_sec"`
	// ChunkOps > 0: the cold start went as ColdDeltas Deltas; Burst* are
	// the per-Service latencies (burst start to its Delta's Ack).
	ChunkOps     int     `json:"chunk_ops"`
	ColdDeltas   int     `json:"cold_deltas"`
	BurstP50MS   float64 `json:"burst_latency_p50_ms"`
	BurstP99MS   float64 `json:"burst_latency_p99_ms"`
	BurstMaxMS   float64 `json:"burst_latency_max_ms"`
	FirstAckedMS float64 `json:"burst_first_ack_ms"`
	// ColdDeltaMS and ColdDeltaWrites describe each cold-start Delta.
	ColdDeltaMS     []float64 `json:"cold_delta_ms"`
	ColdDeltaWrites []uint64  `json:"cold_delta_writes"`
	// FullPasses periodic full reconciles of the unchanged state ran after
	// the changes (vmbench --full-passes): each one's wall time, the
	// process's CPU time (user+system) and the bytes it allocated.
	FullPasses          int       `json:"full_passes"`
	FullPassMS          []float64 `json:"full_pass_ms,omitempty"`
	FullPassCPUMS       []float64 `json:"full_pass_cpu_ms,omitempty"`
	FullPassAllocMB     []float64 `json:"full_pass_alloc_mb,omitempty"`
	FullPassMedianMS    float64   `json:"full_pass_median_ms,omitempty"`
	FullPassCPUMedianMS float64   `json:"full_pass_cpu_median_ms,omitempty"`
	// QuietSeconds of the reconciler's own loop (vmbench --quiet: full
	// passes and drift probes at the agent's defaults) with nothing
	// changing cost QuietCPUMS of the process's CPU and ran
	// QuietFullPasses full passes.
	QuietSeconds    float64 `json:"quiet_seconds,omitempty"`
	QuietCPUMS      float64 `json:"quiet_cpu_ms,omitempty"`
	QuietFullPasses uint64  `json:"quiet_full_passes,omitempty"`
}

// TimelineStep is one step of the agent's "cold start" log line: its own
// share of the time since the process started.
type TimelineStep struct {
	Step string  `json:"step"`
	MS   float64 `json:"ms"`
}

// ColdStartTimeline finds the agent's "cold start" line in its JSON log
// and returns its steps in the order logged, then "total". zap's
// production encoding writes durations as seconds.
func ColdStartTimeline(log string) ([]TimelineStep, error) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `"msg":"cold start"`) {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(line)))
		dec.UseNumber()
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return nil, fmt.Errorf("cold start line %q: not a JSON object", line)
		}
		var out []TimelineStep
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("cold start line %q: %w", line, err)
			}
			key, _ := tok.(string)
			var v any
			if err := dec.Decode(&v); err != nil {
				return nil, fmt.Errorf("cold start line %q: %w", line, err)
			}
			n, ok := v.(json.Number)
			if !ok || key == "ts" {
				continue
			}
			secs, err := n.Float64()
			if err != nil {
				return nil, fmt.Errorf("cold start line %q: %s: %w", line, key, err)
			}
			out = append(out, TimelineStep{Step: key, MS: secs * 1000})
		}
		if i := slices.IndexFunc(out, func(s TimelineStep) bool { return s.Step == "total" }); i >= 0 {
			out = append(append(out[:i:i], out[i+1:]...), out[i])
		}
		return out, nil
	}
	return nil, errors.New(`no "cold start" line in the agent's log`)
}
