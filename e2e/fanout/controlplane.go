package fanout

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/internal/bearer"

	"github.com/vsplane/vsplane/e2e/freeport"
)

// ControlPlanePackage is built by the benchmark and run as its own process,
// so its CPU time and peak RSS are its own (the agents share the test
// process).
const ControlPlanePackage = "./controlplane/cmd/vsplane-controlplane"

// buildControlPlane builds the control-plane binary into dir.
func buildControlPlane(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "vsplane-controlplane")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ControlPlanePackage)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", ControlPlanePackage, err, out)
	}
	return bin, nil
}

// gitSource records HEAD and the uncommitted changes of the code the
// binaries are built from (best effort: empty without git).
func gitSource(ctx context.Context, root string) Source {
	var src Source
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		src.GitHead = strings.TrimSpace(string(out))
	}
	out, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain", "--", "controlplane", "dataplane", "internal", "proto").Output()
	if err == nil {
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if l != "" {
				src.Uncommitted = append(src.Uncommitted, l)
			}
		}
	}
	return src
}

// cpProc is the control-plane replica process.
type cpProc struct {
	Addr string
	// MetricsAddr serves its /metrics (Go runtime memory, for the heap
	// after each phase).
	MetricsAddr string
	Args        []string
	cmd         *exec.Cmd
	logPath     string
	done        chan struct{}
	err         error
}

// startControlPlane starts bin with args plus --listen/--advertise-address
// and --metrics-address on free loopback ports (freeport.Pick),
// logging to dir/controlplane-<attempt>.log. It does not wait
// (awaitServing).
func startControlPlane(bin, dir string, attempt int, args, env []string) (*cpProc, error) {
	ports, err := freeport.Pick(2)
	if err != nil {
		return nil, err
	}
	addr, metrics := freeport.Addr(ports[0]), freeport.Addr(ports[1])
	p := &cpProc{Addr: addr, MetricsAddr: metrics,
		Args:    append([]string{"--listen", addr, "--advertise-address", addr, "--metrics-address", metrics}, args...),
		logPath: filepath.Join(dir, fmt.Sprintf("controlplane-%d.log", attempt)), done: make(chan struct{})}
	lf, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(bin, p.Args...)
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	if len(env) > 0 {
		p.cmd.Env = append(os.Environ(), env...)
	}
	// Own process group, killed if the test's thread dies: no leaked
	// replica holding ports.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// portLost reports whether the process exited because another process
// took its port between bind-and-release and its own bind.
func (p *cpProc) portLost() bool {
	select {
	case <-p.done:
		return strings.Contains(p.LogTail(5), "address already in use")
	default:
		return false
	}
}

// Pid is the process id.
func (p *cpProc) Pid() int { return p.cmd.Process.Pid }

// Stop ends the process (SIGTERM, SIGKILL after 10s).
func (p *cpProc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// LogTail returns the last n lines of the process log.
func (p *cpProc) LogTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// fetch saves the body of GET path on the replica's metrics address to out.
func (p *cpProc) fetch(ctx context.Context, path, out string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(out, body, 0o644)
}

// heap reads the replica's Go heap from its /metrics: bytes allocated
// (live plus garbage not yet collected) and the next GC's target (twice the
// heap live after the last GC, at the default GOGC).
func (p *cpProc) heap(ctx context.Context) (alloc, nextGC int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddr+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(body), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "go_memstats_heap_alloc_bytes":
			alloc = int64(v)
		case "go_memstats_next_gc_bytes":
			nextGC = int64(v)
		}
	}
	return alloc, nextGC, nil
}

// awaitServing waits until the replica's health service says SERVING (its
// informers synced and its first full computation is committed), following
// the health Watch stream; it fails early if the process exits.
func awaitServing(ctx context.Context, p *cpProc, conn *grpc.ClientConn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		retry := time.NewTicker(100 * time.Millisecond)
		defer retry.Stop()
		for ctx.Err() == nil {
			w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			if err != nil {
				<-retry.C
				continue
			}
			for {
				resp, err := w.Recv()
				if err != nil {
					<-retry.C
					break // reconnect (the server may not have been up yet)
				}
				if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
					errc <- nil
					return
				}
			}
		}
		errc <- ctx.Err()
	}()
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("control plane not serving within %v: %w; log:\n%s", timeout, err, p.LogTail(30))
		}
		return nil
	case <-p.done:
		return fmt.Errorf("control plane exited (%v); log:\n%s", p.err, p.LogTail(40))
	}
}

// dialInspection connects to the replica like an operator: TLS and a
// ServiceAccount token (the API server runs AlwaysAllow, so any
// authenticated token may inspect).
func dialInspection(addr string, creds credentials.TransportCredentials, tokenFile string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithPerRPCCredentials(bearer.File{Path: tokenFile}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
}

// procStat is a process's CPU time and memory from /proc.
type procStat struct {
	CPUSeconds float64
	RSSBytes   int64 // VmRSS
	HWMBytes   int64 // VmHWM: peak RSS
}

// readProcStat reads pid's CPU time, then its memory; what it read before an
// error is kept.
func readProcStat(pid int) (procStat, error) {
	var st procStat
	cpu, err := measure.ReadStat(pid)
	if err != nil {
		return st, err
	}
	st.CPUSeconds = cpu.CPUSeconds()
	mem, err := measure.ReadStatus(pid)
	if err != nil {
		return st, err
	}
	st.RSSBytes, st.HWMBytes = mem.RSSBytes(), mem.HWMBytes()
	return st, nil
}

// childByName returns the pid of this process's child called comm (etcd,
// kube-apiserver: started by kubeenv), or 0.
func childByName(comm string) int {
	pids, _ := measure.PIDs()
	me := os.Getpid()
	for _, pid := range pids {
		st, err := measure.ReadStat(pid)
		if err == nil && st.Comm == comm && st.PPID == me {
			return pid
		}
	}
	return 0
}

// selfCPU is this process's CPU seconds (the agents, writers and clients);
// 0 if getrusage fails.
func selfCPU() float64 {
	d, _ := measure.SelfCPU()
	return d.Seconds()
}
