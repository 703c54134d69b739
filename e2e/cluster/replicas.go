package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/vsplane/vsplane/e2e/vm"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"

	"github.com/vsplane/vsplane/e2e/freeport"
)

// ControlPlanePackage is the control plane's Go package, built for the host
// when Options.Replicas > 0.
const ControlPlanePackage = "./controlplane/cmd/vsplane-controlplane"

// ReplicaProc is one control-plane replica running as its own host process
// (Options.Replicas), on 127.0.0.1:Port, which the guest reaches through
// guestfwd at vm.HostLoopIP:Port.
type ReplicaProc struct {
	Index int
	Port  int
	// Addr is 127.0.0.1:Port (also its advertised address among peers).
	Addr string
	// MetricsAddr is its /metrics address on loopback (Options.ReplicaMetrics;
	// "" otherwise).
	MetricsAddr string

	c *Cluster

	mu     sync.Mutex
	bin    string // the executable Start runs
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

// startReplicaProcs builds the control plane (unless Options.ReplicaBinary
// names one), picks a port per replica and starts them all.
func (c *Cluster) startReplicaProcs(ctx context.Context, n int) error {
	dir, err := os.MkdirTemp("", "vsplane-replicas-")
	if err != nil {
		return err
	}
	c.replicaDir = dir
	c.replicaBin = c.opts.ReplicaBinary
	if c.replicaBin == "" {
		bins, err := vm.BuildStatic(ctx, dir, ControlPlanePackage)
		if err != nil {
			return fmt.Errorf("build control plane: %w", err)
		}
		c.replicaBin = bins[0]
	}
	// Each replica binds its own port; the guestfwd rule names it before
	// the VM boots, so it is picked now.
	ports, err := freeport.Pick(2 * n)
	if err != nil {
		return err
	}
	for i := range n {
		port := ports[2*i]
		r := &ReplicaProc{Index: i, Port: port, Addr: freeport.Addr(port), c: c, bin: c.replicaBin}
		if c.opts.ReplicaMetrics {
			r.MetricsAddr = freeport.Addr(ports[2*i+1])
		}
		c.ReplicaProcs = append(c.ReplicaProcs, r)
	}
	for _, r := range c.ReplicaProcs {
		if err := r.Start(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) replicaArgs(r *ReplicaProc) []string {
	peers := make([]string, 0, len(c.ReplicaProcs))
	for _, p := range c.ReplicaProcs {
		peers = append(peers, p.Addr)
	}
	var cidrs []string
	for _, p := range c.opts.translateConfig().ClusterCIDRs {
		cidrs = append(cidrs, p.String())
	}
	args := []string{
		"--kubeconfig", c.Env.Kubeconfig,
		"--listen", r.Addr,
		"--advertise-address", r.Addr,
		"--peers", strings.Join(peers, ","),
		"--metrics-address", r.MetricsAddr,
		"--min-sync-interval", "50ms",
		"--tls-cert-file", r.c.Sec.Files.Cert, "--tls-key-file", r.c.Sec.Files.Key, "--tls-ca-file", r.c.Sec.Files.CA,
		"--peer-token-file", r.c.Sec.TokenFile,
		"--cluster-cidr", strings.Join(cidrs, ","),
	}
	return append(args, c.opts.ReplicaArgs...)
}

// Start starts the replica's process (again), logging to
// <dir>/replica-<i>-<n>.log. It does not wait for it to serve (AwaitServing).
func (r *ReplicaProc) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		select {
		case <-r.done:
		default:
			return fmt.Errorf("replica %d already running", r.Index)
		}
	}
	r.starts++
	logPath := filepath.Join(r.c.replicaDir, fmt.Sprintf("replica-%d-%d.log", r.Index, r.starts))
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, r.c.replicaArgs(r)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("start replica %d: %w", r.Index, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(done)
	}()
	r.cmd, r.done = cmd, done
	return nil
}

// SetBinary sets the host executable the replica's next Start runs: a
// rolling upgrade (or rollback) is Signal(SIGTERM), SetBinary, Start and
// AwaitServing, one replica at a time.
func (r *ReplicaProc) SetBinary(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bin = path
}

// Signal sends sig to the replica and, for SIGKILL and SIGTERM, waits (at
// most 30s) until it exited.
func (r *ReplicaProc) Signal(sig syscall.Signal) error {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("replica %d never started", r.Index)
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("replica %d did not exit within 30s of %v", r.Index, sig)
	}
}

// Restart ends the replica with sig (Signal), starts it again (with the
// binary SetBinary last set) and waits (2 minutes at most) until it serves.
func (r *ReplicaProc) Restart(ctx context.Context, sig syscall.Signal) error {
	if err := r.Signal(sig); err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	if err := r.AwaitServing(ctx, 2*time.Minute); err != nil {
		return fmt.Errorf("%w\n%s", err, r.LogTail(20))
	}
	return nil
}

// PID is the process id of the replica's current process (0 if never
// started), for signals Signal does not wait out (SIGSTOP, SIGCONT) and
// for /proc.
func (r *ReplicaProc) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// Running reports whether the process is alive.
func (r *ReplicaProc) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// Health returns the replica's gRPC health status.
func (r *ReplicaProc) Health(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := r.c.DialControlPlane(r.Addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return 0, err
	}
	return resp.GetStatus(), nil
}

// AwaitServing waits until the replica reports SERVING (synced, first full
// computation committed).
func (r *ReplicaProc) AwaitServing(ctx context.Context, timeout time.Duration) error {
	return Await(ctx, timeout, 200*time.Millisecond, func(ctx context.Context) error {
		st, err := r.Health(ctx)
		if err != nil {
			return err
		}
		if st != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("replica %d: %v", r.Index, st)
		}
		return nil
	})
}

// LogTail returns the last n lines of the replica's current log.
func (r *ReplicaProc) LogTail(n int) string {
	r.mu.Lock()
	path := filepath.Join(r.c.replicaDir, fmt.Sprintf("replica-%d-%d.log", r.Index, r.starts))
	r.mu.Unlock()
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Inspect asks any running replica (fleet-wide view) for every agent.
func (c *Cluster) Inspect(ctx context.Context) (*vsplanev1.ListAgentsResponse, error) {
	var errs []error
	for _, r := range c.ReplicaProcs {
		if !r.Running() {
			continue
		}
		conn, err := c.DialControlPlane(r.Addr)
		if err != nil {
			return nil, err
		}
		resp, err := vsplanev1.NewInspectServiceClient(conn).ListAgents(ctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
		conn.Close()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("replica %d: %w", r.Index, err))
	}
	if len(errs) == 0 {
		return nil, errors.New("no replica running")
	}
	return nil, errors.Join(errs...)
}

// ReplicaOf returns the replica node's agent is connected to (-1 if none).
func (c *Cluster) ReplicaOf(ctx context.Context, node string) (int, error) {
	resp, err := c.Inspect(ctx)
	if err != nil {
		return -1, err
	}
	for _, a := range resp.GetAgents() {
		if a.GetNodeName() != node {
			continue
		}
		for _, r := range c.ReplicaProcs {
			if r.Addr == a.GetReplica() {
				return r.Index, nil
			}
		}
	}
	return -1, nil
}

// agentTargets is the agents' --controlplane value.
func (c *Cluster) agentTargets() string {
	if len(c.ReplicaProcs) == 0 {
		return vm.HostLoopIP + ":" + strconv.Itoa(c.CPPort)
	}
	var out []string
	for _, r := range c.ReplicaProcs {
		out = append(out, vm.HostLoopIP+":"+strconv.Itoa(r.Port))
	}
	return strings.Join(out, ",")
}

// AgentKernelWrites is how many kernel writes node's agent has made since it
// started: vsplane_agent_kernel_operations_total (Deltas) plus
// vsplane_agent_drift_repairs_total (full reconciles), read from its
// /metrics inside the node.
func (c *Cluster) AgentKernelWrites(ctx context.Context, node string) (int, error) {
	out, err := c.RunInNode(ctx, node, "wget -qO- http://127.0.0.1:10249/metrics")
	if err != nil {
		return 0, err
	}
	total := 0
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "vsplane_agent_kernel_operations_total{") && !strings.HasPrefix(l, "vsplane_agent_drift_repairs_total{") {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", l, err)
		}
		total += int(v)
	}
	return total, nil
}
