//go:build vmbench

package vmbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm"
)

// FullPassReport is fullpass.json: the periodic full pass over an unchanged
// state, for one or more builds of e2e/cmd/vmbench, alternated in one VM.
type FullPassReport struct {
	Time          string `json:"time"`
	LoadAvgBefore string `json:"host_loadavg_before"`
	LoadAvgAfter  string `json:"host_loadavg_after"`
	Services      int    `json:"services"`
	Endpoints     int    `json:"endpoints"`
	// Runs are in the order run: round by round, each build once a round.
	Runs []FullPassRun `json:"runs"`
}

// FullPassRun is one build's run in a fresh node namespace.
type FullPassRun struct {
	Build string `json:"build"`
	Round int    `json:"round"`
	Result
}

// TestVMBenchFullPass times the agent's periodic full reconcile while
// nothing changes (#27 item 3: quiet-time CPU) at VSPLANE_VMBENCH_FULLPASS_SIZE
// ("services x endpoints", default 2000x10: the side-by-side benchmark's 1k
// Services with 2 ports each). VSPLANE_VMBENCH_FULLPASS_BASELINE names a
// static vmbench binary built from another commit (vm.BuildStatic of
// ./e2e/cmd/vmbench there): the two builds then run alternately,
// VSPLANE_VMBENCH_FULLPASS_ROUNDS times (default 3), each in a fresh node
// namespace, the previous node's IPVS table flushed first (Linux 6.1's
// /proc/net/ip_vs dump skips servers while another namespace holds some, and
// a node of a real cluster has one namespace). VSPLANE_VMBENCH_PASS_PROFILE=P
// writes each build's CPU profiles of its passes and of the quiet window (last
// round) to P.BUILD and P.quiet.BUILD.
// After the timed passes each run lets the reconciler's own loop run for
// VSPLANE_VMBENCH_FULLPASS_QUIET (default 1m; full passes every 30 s and the
// drift probe every 5 s, the agent's defaults) and reports its CPU. Results:
// _out/vmbench/fullpass.{json,md}.
func TestVMBenchFullPass(t *testing.T) {
	services, endpoints := 2000, 10
	if s := os.Getenv("VSPLANE_VMBENCH_FULLPASS_SIZE"); s != "" {
		if _, err := fmt.Sscanf(s, "%dx%d", &services, &endpoints); err != nil || services < 1 || endpoints < 2 {
			t.Fatalf("VSPLANE_VMBENCH_FULLPASS_SIZE=%q: want SERVICESxENDPOINTS, e.g. 2000x10", s)
		}
	}
	rounds := 3
	if s := os.Getenv("VSPLANE_VMBENCH_FULLPASS_ROUNDS"); s != "" {
		if _, err := fmt.Sscanf(s, "%d", &rounds); err != nil || rounds < 1 {
			t.Fatalf("VSPLANE_VMBENCH_FULLPASS_ROUNDS=%q: want a positive count", s)
		}
	}
	quiet := time.Minute
	if s := os.Getenv("VSPLANE_VMBENCH_FULLPASS_QUIET"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			t.Fatalf("VSPLANE_VMBENCH_FULLPASS_QUIET=%q: want a duration >= 0, e.g. 2m", s)
		}
		quiet = d
	}
	builds := []string{"vmbench"}
	opts := vm.Options{GoPackages: []string{"./e2e/cmd/vmbench"}, MemoryMB: 2048, BootTimeout: 6 * time.Minute,
		Log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))}
	if base := os.Getenv("VSPLANE_VMBENCH_FULLPASS_BASELINE"); base != "" {
		// The guest's /usr/local/bin keeps the file name: give it its own.
		dir := t.TempDir()
		b, err := os.ReadFile(base)
		if err != nil {
			t.Fatalf("VSPLANE_VMBENCH_FULLPASS_BASELINE: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "vmbench-baseline"), b, 0o755); err != nil {
			t.Fatal(err)
		}
		opts.Binaries = append(opts.Binaries, filepath.Join(dir, "vmbench-baseline"))
		builds = []string{"vmbench-baseline", "vmbench"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), d.Add(-30*time.Second))
	}
	defer cancel()

	rep := FullPassReport{Time: time.Now().UTC().Format(time.RFC3339), LoadAvgBefore: measure.LoadAvgLine(),
		Services: services, Endpoints: endpoints}
	v, err := vm.Boot(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Stop()
	topo, err := vm.NewTopology(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	var prev *vm.Node
	for round := range rounds {
		for _, build := range builds {
			if prev != nil {
				if _, err := prev.RunOK(ctx, "ipvsadm -C"); err != nil {
					t.Fatalf("flush %s: %v", prev.Name, err)
				}
			}
			node, err := topo.AddNode(ctx)
			if err != nil {
				t.Fatal(err)
			}
			prev = node
			cmd := fmt.Sprintf("%s --services %d --endpoints %d --changes 1 --removes 0 --full-passes %d --quiet %s", build, services, endpoints, fullPasses, quiet)
			profile := os.Getenv("VSPLANE_VMBENCH_PASS_PROFILE")
			if profile != "" {
				cmd += " --pass-cpuprofile /tmp/pass.prof --quiet-cpuprofile /tmp/quiet.prof"
			}
			out, err := node.RunOK(ctx, cmd)
			if err != nil {
				t.Fatalf("%s in %s: %v", cmd, node.Name, err)
			}
			var r Result
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("%s output: %v\n%s", build, err, out)
			}
			if r.Services != services || len(r.FullPassMS) != fullPasses || r.FullPassCPUMedianMS <= 0 {
				t.Fatalf("%s output implausible: %s", build, out)
			}
			if quiet > 0 && r.QuietCPUMS <= 0 {
				t.Fatalf("%s output implausible: %s", build, out)
			}
			t.Logf("round %d %s: full pass median %.0f ms wall, %.0f ms CPU; CPU %v, allocated MB %v; quiet %.0f s: %.0f ms CPU, %d full passes",
				round, build, r.FullPassMedianMS, r.FullPassCPUMedianMS, r.FullPassCPUMS, r.FullPassAllocMB, r.QuietSeconds, r.QuietCPUMS, r.QuietFullPasses)
			if profile != "" {
				// The profile of each build's last round.
				if err := copyOut(ctx, node, "/tmp/pass.prof", fmt.Sprintf("%s.%s", profile, build)); err != nil {
					t.Fatal(err)
				}
				if quiet > 0 {
					if err := copyOut(ctx, node, "/tmp/quiet.prof", fmt.Sprintf("%s.quiet.%s", profile, build)); err != nil {
						t.Fatal(err)
					}
				}
			}
			rep.Runs = append(rep.Runs, FullPassRun{Build: build, Round: round, Result: r})
		}
	}
	rep.LoadAvgAfter = measure.LoadAvgLine()
	root, err := measure.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := measure.WriteReport(filepath.Join(root, "_out", "vmbench"), "fullpass", rep, fullPassMarkdown(rep)); err != nil {
		t.Fatal(err)
	}
}

func fullPassMarkdown(rep FullPassReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Periodic full pass, nothing changing (%s)\n\n%d ClusterIP Services x %d endpoints (one TCP port each), QEMU TCG, each run in a fresh node namespace (the previous one's IPVS table flushed); host load average before `%s`, after `%s`. CPU is the process's user+system time over the pass.\n\n",
		rep.Time, rep.Services, rep.Endpoints, rep.LoadAvgBefore, rep.LoadAvgAfter)
	b.WriteString("| round | build | wall median (ms) | CPU median (ms) | CPU each (ms) | allocated each (MB) | quiet: s, CPU ms, full passes |\n|---:|---|---:|---:|---|---|---|\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "| %d | %s | %.0f | %.0f | %v | %v | %.0f, %.0f, %d |\n", r.Round, r.Build, r.FullPassMedianMS, r.FullPassCPUMedianMS, r.FullPassCPUMS, r.FullPassAllocMB,
			r.QuietSeconds, r.QuietCPUMS, r.QuietFullPasses)
	}
	return b.String()
}
