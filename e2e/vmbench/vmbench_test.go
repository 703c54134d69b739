//go:build vmbench

// Package vmbench measures the agent's reconciler on the real kernel of the QEMU
// test bed (the apply-time measurement): the time to apply a one-endpoint change with
// 1,000 and with 10,000 ClusterIP Services present (it should be flat), and
// cold start (empty kernel to N Services). It is a measurement, not a CI test:
// it is built only with the vmbench tag (`make bench-vm`).
//
//	go test -tags vmbench -v -count=1 -timeout 60m -run TestVMBench ./e2e/vmbench
//
// Results go to _out/vmbench/results.json and _out/vmbench/results.md. Under
// TCG the absolute times are inflated; the ratio between the sizes matters.
package vmbench

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm"
)

// Report is results.json.
type Report struct {
	Time string `json:"time"`
	// LoadAvg is the host's /proc/loadavg before and after the runs (the
	// machine is shared; TCG times depend on it).
	LoadAvgBefore string   `json:"host_loadavg_before"`
	LoadAvgAfter  string   `json:"host_loadavg_after"`
	BootSeconds   float64  `json:"vm_boot_seconds"`
	Runs          []Result `json:"runs"`
	// Ratios are the largest size's value over the smallest size's.
	Ratios map[string]float64 `json:"ratios"`
	// Burst is the burst workload (default 2,000 Services x 10 endpoints)
	// three ways: one netlink request per kernel write (IPVS, ipset
	// entries, kube-ipvs0 addresses: the baseline), batched, and batched
	// in bounded Deltas; BurstRatios compare them.
	Burst       []Result           `json:"burst"`
	BurstRatios map[string]float64 `json:"burst_ratios"`
}

// burstSize is VSPLANE_VMBENCH_BURST ("services x endpoints", default 2000x10).
func burstSize(t *testing.T) (services, endpoints int) {
	s := os.Getenv("VSPLANE_VMBENCH_BURST")
	if s == "" {
		return 2000, 10
	}
	if _, err := fmt.Sscanf(s, "%dx%d", &services, &endpoints); err != nil || services < 1 || endpoints < 2 {
		t.Fatalf("VSPLANE_VMBENCH_BURST=%q: want SERVICESxENDPOINTS, e.g. 2000x10", s)
	}
	return services, endpoints
}

// burstChunkOps is the Delta budget of the bounded run: the control
// plane's initial budget before it has measured the agent.
const burstChunkOps = 4096

func sizes(t *testing.T) []int {
	s := os.Getenv("VSPLANE_VMBENCH_SIZES")
	if s == "" {
		return []int{1000, 10000}
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			t.Fatalf("VSPLANE_VMBENCH_SIZES=%q: want comma-separated positive integers", s)
		}
		out = append(out, n)
	}
	return out
}

func TestVMBench(t *testing.T) {
	ns := sizes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), d.Add(-30*time.Second))
	}
	defer cancel()

	rep := Report{Time: time.Now().UTC().Format(time.RFC3339), LoadAvgBefore: measure.LoadAvgLine()}
	v, err := vm.Boot(ctx, vm.Options{
		GoPackages:  []string{"./e2e/cmd/vmbench"},
		MemoryMB:    2048,
		BootTimeout: 6 * time.Minute,
		Log:         zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	if err != nil {
		if errors.Is(err, vm.ErrDepsMissing) {
			t.Fatalf("the VM test bed cannot run here (run bash scripts/vm/deps.sh): %v", err)
		}
		t.Fatal(err)
	}
	defer v.Stop()
	rep.BootSeconds = v.BootTime.Seconds()
	topo, err := vm.NewTopology(ctx, v)
	if err != nil {
		t.Fatal(err)
	}

	// One fresh node namespace per size: each run starts from an empty kernel.
	for _, n := range ns {
		node, err := topo.AddNode(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		out, err := node.RunOK(ctx, fmt.Sprintf("vmbench --services %d --changes 50 --removes 10", n))
		if err != nil {
			t.Fatalf("vmbench --services %d in %s: %v", n, node.Name, err)
		}
		var r Result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("vmbench output: %v\n%s", err, out)
		}
		if r.Services != n || r.ChangeMedianMS <= 0 || r.ColdMS <= 0 {
			t.Fatalf("vmbench output implausible: %s", out)
		}
		t.Logf("N=%d in %s (%v wall): cold %.0f ms, change median %.2f ms p90 %.2f ms ops %v, remove median %.2f ms ops %v",
			n, node.Name, time.Since(start).Round(time.Second), r.ColdMS, r.ChangeMedianMS, r.ChangeP90MS, r.ChangeOps, r.RemoveMedianMS, r.RemoveOps)
		rep.Runs = append(rep.Runs, r)
	}
	bs, be := burstSize(t)
	for _, flags := range []string{"--unbatched", "", fmt.Sprintf("--chunk-ops %d", burstChunkOps)} {
		node, err := topo.AddNode(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cmd := fmt.Sprintf("vmbench --services %d --endpoints %d --changes 20 --removes 0 %s", bs, be, flags)
		if flags == "" {
			// The batched run also times the periodic full pass over the
			// unchanged state: what the agent spends while nothing changes.
			cmd += fmt.Sprintf(" --full-passes %d", fullPasses)
			if p := os.Getenv("VSPLANE_VMBENCH_PASS_PROFILE"); p != "" {
				cmd += " --pass-cpuprofile /tmp/pass.prof"
			}
		}
		out, err := node.RunOK(ctx, cmd)
		if err != nil {
			t.Fatalf("%s in %s: %v", cmd, node.Name, err)
		}
		var r Result
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("vmbench output: %v\n%s", err, out)
		}
		if r.Services != bs || r.Endpoints != be || r.ColdMS <= 0 || r.ColdWrites == 0 {
			t.Fatalf("vmbench output implausible: %s", out)
		}
		if flags == "" {
			if len(r.FullPassMS) != fullPasses || r.FullPassCPUMedianMS <= 0 {
				t.Fatalf("vmbench full passes implausible: %s", out)
			}
			t.Logf("burst %dx%d: full pass over the unchanged state, median %.0f ms wall, %.0f ms CPU; each wall %v CPU %v allocated MB %v",
				bs, be, r.FullPassMedianMS, r.FullPassCPUMedianMS, r.FullPassMS, r.FullPassCPUMS, r.FullPassAllocMB)
			if p := os.Getenv("VSPLANE_VMBENCH_PASS_PROFILE"); p != "" {
				if err := copyOut(ctx, node, "/tmp/pass.prof", p); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Logf("burst %dx%d %q: cold %.0f ms in %d Deltas, %d writes at %.0f/s, per-Service latency p50 %.0f ms p99 %.0f ms, first ack %.0f ms, change median %.2f ms; per Delta ms %v writes %v",
			bs, be, flags, r.ColdMS, r.ColdDeltas, r.ColdWrites, r.ColdWritesPerSec, r.BurstP50MS, r.BurstP99MS, r.FirstAckedMS, r.ChangeMedianMS, r.ColdDeltaMS, r.ColdDeltaWrites)
		rep.Burst = append(rep.Burst, r)
	}
	one, batched, bounded := rep.Burst[0], rep.Burst[1], rep.Burst[2]
	rep.BurstRatios = map[string]float64{
		"cold_unbatched_over_batched":        one.ColdMS / batched.ColdMS,
		"writes_per_sec_batched_over_single": batched.ColdWritesPerSec / one.ColdWritesPerSec,
		"p50_latency_one_delta_over_bounded": batched.BurstP50MS / bounded.BurstP50MS,
		"change_median_batched_over_single":  batched.ChangeMedianMS / one.ChangeMedianMS,
	}
	t.Logf("burst ratios: %v", rep.BurstRatios)
	rep.LoadAvgAfter = measure.LoadAvgLine()
	if len(rep.Runs) >= 2 {
		lo, hi := rep.Runs[0], rep.Runs[len(rep.Runs)-1]
		rep.Ratios = map[string]float64{
			"cold":          hi.ColdMS / lo.ColdMS,
			"change_median": hi.ChangeMedianMS / lo.ChangeMedianMS,
			"change_p90":    hi.ChangeP90MS / lo.ChangeP90MS,
		}
		if lo.RemoveMedianMS > 0 {
			rep.Ratios["remove_median"] = hi.RemoveMedianMS / lo.RemoveMedianMS
		}
		t.Logf("ratios %d/%d: cold %.2f, change median %.2f, change p90 %.2f, remove median %.2f",
			hi.Services, lo.Services, rep.Ratios["cold"], rep.Ratios["change_median"], rep.Ratios["change_p90"], rep.Ratios["remove_median"])
	}
	if err := write(rep); err != nil {
		t.Fatal(err)
	}
}

// fullPasses is how many periodic full reconciles the batched burst run
// times.
const fullPasses = 5

// copyOut copies a file from the guest to the host (base64 over the exec
// channel: a profile is a few hundred KiB).
func copyOut(ctx context.Context, node *vm.Node, guest, host string) error {
	out, err := node.RunOK(ctx, "busybox base64 "+guest)
	if err != nil {
		return fmt.Errorf("read %s from the guest: %w", guest, err)
	}
	b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(out), ""))
	if err != nil {
		return fmt.Errorf("decode %s: %w", guest, err)
	}
	return os.WriteFile(host, b, 0o644)
}

// write stores results.json and results.md in RepoRoot/_out/vmbench.
func write(rep Report) error {
	root, err := measure.RepoRoot(".")
	if err != nil {
		return err
	}
	return measure.WriteReport(filepath.Join(root, "_out", "vmbench"), "results", rep, markdown(rep))
}

func markdown(rep Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# vmbench %s\n\nQEMU TCG, host load average before `%s`, after `%s`; VM boot %.0f s.\n\n",
		rep.Time, rep.LoadAvgBefore, rep.LoadAvgAfter, rep.BootSeconds)
	b.WriteString("| Services | cold start (ms) | one-endpoint change median (ms) | p90 (ms) | kernel ops per change | remove one Service median (ms) |\n")
	b.WriteString("|---:|---:|---:|---:|---|---:|\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "| %d | %.0f | %.2f | %.2f | %s | %.2f |\n",
			r.Services, r.ColdMS, r.ChangeMedianMS, r.ChangeP90MS, ops(r.ChangeOps), r.RemoveMedianMS)
	}
	if rep.Ratios != nil {
		fmt.Fprintf(&b, "\nRatio largest/smallest: cold %.2f, change median %.2f, change p90 %.2f, remove median %.2f\n",
			rep.Ratios["cold"], rep.Ratios["change_median"], rep.Ratios["change_p90"], rep.Ratios["remove_median"])
	}
	if len(rep.Burst) > 0 {
		b.WriteString("\n## Burst (cold start into an empty kernel)\n\n")
		b.WriteString("| Services x endpoints | kernel writes sent | Deltas | converged (ms) | kernel writes | writes/s | per-Service latency p50 / p99 (ms) | first Delta acked (ms) | one-endpoint change median (ms) |\n")
		b.WriteString("|---|---|---:|---:|---:|---:|---|---:|---:|\n")
		for _, r := range rep.Burst {
			mode := "batched"
			if r.Unbatched {
				mode = "one request each (before)"
			}
			fmt.Fprintf(&b, "| %d x %d | %s | %d | %.0f | %d | %.0f | %.0f / %.0f | %.0f | %.2f |\n", r.Services, r.Endpoints, mode,
				r.ColdDeltas, r.ColdMS, r.ColdWrites, r.ColdWritesPerSec, r.BurstP50MS, r.BurstP99MS, r.FirstAckedMS, r.ChangeMedianMS)
		}
		keys := slices.Sorted(maps.Keys(rep.BurstRatios))
		for _, r := range rep.Burst {
			if len(r.FullPassMS) > 0 {
				fmt.Fprintf(&b, "\nPeriodic full pass over the unchanged %d x %d state (%d passes, nothing changing): median %.0f ms wall, %.0f ms CPU (user+system); each: wall %v ms, CPU %v ms, allocated %v MB.\n",
					r.Services, r.Endpoints, len(r.FullPassMS), r.FullPassMedianMS, r.FullPassCPUMedianMS, r.FullPassMS, r.FullPassCPUMS, r.FullPassAllocMB)
			}
		}
		b.WriteString("\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "- %s: %.2f\n", k, rep.BurstRatios[k])
		}
	}
	return b.String()
}

func ops(m map[string]uint32) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
