//go:build conformance

package conformance

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/e2e/measure"
)

// TestConformance runs the selection (Focus minus Skips) on a fresh
// real-node cluster per proxy, kube-proxy first, then vsplane, and writes
// bench/results/conformance.{json,md}. Environment:
// CONFORMANCE_PROXIES (default "kube-proxy,vsplane"; a proxy left out keeps
// its run of the same selection from the report already there, so the two
// can run in different sittings), CONFORMANCE_FOCUS (a
// narrower focus, for a partial run), CONFORMANCE_QUICK (QuickSpecs only,
// written as quick.{json,md}), CONFORMANCE_REPORT_ONLY (re-render the
// last run's JUnit reports in _out/conformance), CONFORMANCE_PROCS (parallel Ginkgo
// processes, default 3), CONFORMANCE_OUT (default bench/results).
func TestConformance(t *testing.T) {
	root, err := measure.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := kubeenv.FindBinDir("")
	if err != nil {
		t.Fatal(err)
	}
	proxies := strings.Split(envOr("CONFORMANCE_PROXIES", strings.Join(allProxies, ",")), ",")
	focus, name := envOr("CONFORMANCE_FOCUS", Focus), "conformance"
	if os.Getenv("CONFORMANCE_QUICK") != "" {
		focus, name = ExactFocus(QuickSpecs), "quick"
	}
	procs, err := strconv.Atoi(envOr("CONFORMANCE_PROCS", "3"))
	if err != nil {
		t.Fatalf("CONFORMANCE_PROCS: %v", err)
	}
	out := envOr("CONFORMANCE_OUT", filepath.Join(root, "bench", "results"))
	// A proxy of the pair that does not run now keeps its run of the same
	// selection from the report already there (committed by an earlier
	// sitting, with its own date).
	prev, prevErr := ReadReport(filepath.Join(out, name+".json"))
	log, _ := zap.NewDevelopment()
	var runs []ProxyRun
	for _, p := range allProxies {
		if slices.Contains(proxies, p) {
			continue
		}
		if run, ok := CarriedRun(prev, focus, p); prevErr == nil && ok {
			t.Logf("%s: carried over from the run of %s in %s.json", p, run.Date, name)
			runs = append(runs, run)
		}
	}
	for _, p := range proxies {
		run := ProxyRun{Proxy: p, Date: time.Now().UTC().Format("2006-01-02")}
		t0 := time.Now()
		reportDir := filepath.Join(root, "_out", "conformance", p)
		var specs []SpecResult
		if os.Getenv("CONFORMANCE_REPORT_ONLY") != "" {
			// Re-render the last run's reports (e.g. after adding an
			// Explanation) without running anything.
			specs, _, err = ParseJUnit(filepath.Join(reportDir, "junit_01.xml"), regexp.MustCompile(focus))
			if last, ok := CarriedRun(prev, focus, p); prevErr == nil && ok {
				run.Date, run.Took = last.Date, last.Took // the run re-rendered keeps its date and time
			}
		} else {
			specs, err = runOn(t, cluster.RealProxy(p), RunOptions{
				BinDir: binDir, Focus: focus, Skip: SkipRegexp(), Procs: procs, Timeout: 3 * time.Hour,
				ReportDir: reportDir,
			}, log.Named(p))
		}
		run.Specs = specs
		if os.Getenv("CONFORMANCE_REPORT_ONLY") == "" {
			run.Took = time.Since(t0)
		}
		if err != nil {
			run.Error = err.Error()
			t.Errorf("%s: %v", p, err)
		}
		t.Logf("%s: %d specs in %v", p, len(specs), run.Took.Round(time.Second))
		runs = append(runs, run)
	}
	slices.SortFunc(runs, func(a, b ProxyRun) int { return slices.Index(allProxies, a.Proxy) - slices.Index(allProxies, b.Proxy) })
	rep := NewReport(time.Now().UTC().Format("2006-01-02"), focus, runs)
	if err := rep.Write(out, name); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s/%s.{json,md}; counts %v", out, name, rep.Counts())
	for _, u := range rep.Unexplained {
		t.Errorf("failure not yet understood (add it to Explanations once it is): %s", u)
	}
	for _, s := range rep.Regressions {
		t.Logf("passes on kube-proxy, not on vsplane: %s", s)
	}
}

// runOn starts a real cluster with proxy, runs the specs on it and stops
// it.
func runOn(t *testing.T, proxy cluster.RealProxy, o RunOptions, log *zap.Logger) ([]SpecResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout+30*time.Minute)
	defer cancel()
	rc, err := cluster.StartReal(ctx, cluster.RealOptions{Proxy: proxy, Log: log})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := rc.Stop(); err != nil {
			t.Logf("stopping the %s cluster: %v", proxy, err)
		}
	}()
	o.Kubeconfig, o.Nodes = rc.Env.Kubeconfig, len(rc.Nodes)
	specs, err := Run(ctx, o)
	// The proxy's own account of the run, for explaining its failures.
	if lerr := rc.SaveProxyLogs(ctx, filepath.Join(o.ReportDir, "proxy-logs")); lerr != nil {
		t.Logf("saving the %s logs: %v", proxy, lerr)
	}
	return specs, err
}

// allProxies are the proxies a report compares, in its column order.
var allProxies = []string{"kube-proxy", "vsplane"}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
