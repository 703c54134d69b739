package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// E2ETestBinary and GinkgoBinary are the file names scripts/kube/build.sh
// gives upstream's trimmed e2e.test (scripts/kube/apiserver/e2enetwork)
// and the Ginkgo CLI that runs it in parallel, in the kube binaries'
// directory.
const (
	E2ETestBinary = "e2e.test"
	GinkgoBinary  = "ginkgo"
)

// RunOptions configure one run of e2e.test.
type RunOptions struct {
	// BinDir holds e2e.test and ginkgo (kubeenv.FindBinDir).
	BinDir string
	// Kubeconfig is the cluster's admin kubeconfig.
	Kubeconfig string
	// Nodes is the cluster's node count (--num-nodes). Specs that need
	// several nodes check it, not the API: unset (-1, e2e.test's default)
	// they skip themselves ("Requires at least 2 nodes (not -1)"), as the
	// first runs here did.
	Nodes int
	// Focus and Skip are --ginkgo.focus and --ginkgo.skip.
	Focus, Skip string
	// ReportDir gets junit_01.xml and e2e.log (the run's output).
	ReportDir string
	// Procs > 1 runs the specs in that many parallel processes through
	// the Ginkgo CLI ([Serial] specs still run alone, at the end).
	Procs int
	// Timeout bounds the whole suite (--ginkgo.timeout; default 1h).
	Timeout time.Duration
}

// Run runs e2e.test with the options and returns the specs of the report
// that match Focus. A spec failing is not an error here (it is in the
// results); a run that produced no report is.
func Run(ctx context.Context, o RunOptions) ([]SpecResult, error) {
	if o.Timeout == 0 {
		o.Timeout = time.Hour
	}
	if o.Nodes < 1 {
		return nil, fmt.Errorf("conformance: the node count must be set (got %d)", o.Nodes)
	}
	e2eTest := filepath.Join(o.BinDir, E2ETestBinary)
	if _, err := os.Stat(e2eTest); err != nil {
		return nil, fmt.Errorf("conformance: no %s (run bash scripts/kube/build.sh): %w", e2eTest, err)
	}
	focus, err := regexp.Compile(o.Focus)
	if err != nil {
		return nil, fmt.Errorf("conformance: focus: %w", err)
	}
	if err := os.MkdirAll(o.ReportDir, 0o755); err != nil {
		return nil, err
	}
	report := filepath.Join(o.ReportDir, "junit_01.xml")
	_ = os.Remove(report)
	args := e2eArgs(o)
	var cmd *exec.Cmd
	if o.Procs > 1 {
		ginkgo := filepath.Join(o.BinDir, GinkgoBinary)
		gargs := []string{"--procs=" + strconv.Itoa(o.Procs), "--timeout=" + o.Timeout.String(),
			"--no-color", "--focus=" + o.Focus, "--skip=" + o.Skip, "--poll-progress-after=10m", e2eTest, "--"}
		cmd = exec.CommandContext(ctx, ginkgo, append(gargs, args...)...)
	} else {
		args = append(args, "--ginkgo.focus="+o.Focus, "--ginkgo.skip="+o.Skip,
			"--ginkgo.timeout="+o.Timeout.String(), "--ginkgo.no-color", "--ginkgo.poll-progress-after=10m")
		cmd = exec.CommandContext(ctx, e2eTest, args...)
	}
	logFile, err := os.Create(filepath.Join(o.ReportDir, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = o.ReportDir
	// Ginkgo cleans up after an interrupt; give it time before the kill.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 2 * time.Minute
	runErr := cmd.Run()
	specs, suiteFailures, err := ParseJUnit(report, focus)
	if err != nil {
		return nil, fmt.Errorf("conformance: e2e.test (%v) wrote no usable report, see %s: %w",
			runErr, logFile.Name(), err)
	}
	if len(suiteFailures) > 0 {
		return specs, fmt.Errorf("conformance: the suite itself failed (see %s): %v", logFile.Name(), suiteFailures)
	}
	var exitErr *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exitErr) {
		return specs, fmt.Errorf("conformance: running e2e.test: %w", runErr)
	}
	return specs, nil
}

// e2eArgs are e2e.test's own flags: the cluster and its kubectl (the specs
// exec into Pods with it), the "local" provider (hack/local-up-cluster.sh's),
// the report directory, and no waiting for system Pods beyond what the
// test bed already waited for, and the node count.
func e2eArgs(o RunOptions) []string {
	return []string{
		fmt.Sprintf("--num-nodes=%d", o.Nodes),
		"--kubeconfig=" + o.Kubeconfig,
		"--kubectl-path=" + filepath.Join(o.BinDir, "kubectl"),
		"--provider=local",
		"--report-dir=" + o.ReportDir,
		"--minStartupPods=0",
		"--allowed-not-ready-nodes=0",
		"--disable-log-dump",
		"--dump-logs-on-failure=false",
		"--node-os-distro=debian",
	}
}
