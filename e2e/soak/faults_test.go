package soak

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// inject runs fault f to its end (process back, outage over, drift
// written), then awaits convergence.
func (r *run) inject(f Fault) FaultResult {
	res := FaultResult{Fault: f, Started: r.since()}
	r.mu.Lock()
	r.last, r.lastAt = f, res.Started
	r.mu.Unlock()
	node := fmt.Sprintf("node%d", f.Target+1)
	if f.Kind.Drift() {
		// Until repaired (and driftGrace after), failures through node
		// are the drift's.
		r.setDrift(node, time.Now().Add(24*time.Hour))
	}
	extra, err := r.act(f, node)
	if err != nil {
		res.Err = "inject: " + err.Error()
		if f.Kind.Drift() {
			r.setDrift(node, time.Now().Add(driftGrace))
		}
		return res
	}
	took, err := r.awaitConverged(f, extra)
	if f.Kind.Drift() {
		r.setDrift(node, time.Now().Add(driftGrace))
	}
	if (err != nil || took > slowConvergence) && f.Kind.OnNode() {
		// What the node's agent did meanwhile, for the report's reader.
		if l, lerr := r.c.AgentLog(r.ctx, node); lerr == nil {
			var keep []string // the soak's own inspection calls aside
			for _, line := range strings.Split(l, "\n") {
				if !strings.Contains(line, `"inspect.grpc"`) {
					keep = append(keep, line)
				}
			}
			r.t.Logf("%v: %s agent log tail (convergence %v, %v):\n%s", f, node, took.Round(10*time.Millisecond), err, tail(strings.Join(keep, "\n"), 15))
		}
	}
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Converged = took
	return res
}

// slowConvergence: a node fault converging slower than this logs the
// node's agent log tail.
const slowConvergence = 10 * time.Second

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// act performs the fault itself; extra (may be nil) is a condition of
// its own that convergence must also meet.
func (r *run) act(f Fault, node string) (func(context.Context) error, error) {
	var extra func(context.Context) error
	err := r.act1(f, node, &extra)
	return extra, err
}

func (r *run) act1(f Fault, node string, extra *func(context.Context) error) error {
	ctx, c := r.ctx, r.c
	hold := func() {
		select {
		case <-ctx.Done():
		case <-time.After(f.Hold): // the schedule's own wait
		}
	}
	agentPID := func() (int, error) {
		p := c.AgentProc(node)
		if p == nil {
			return 0, fmt.Errorf("no agent running on %s", node)
		}
		return p.PID, nil
	}
	// killAgent SIGKILLs node's agent's process group and reaps it.
	killAgent := func() error {
		pid, err := agentPID()
		if err != nil {
			return err
		}
		if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -KILL -%d", pid)); err != nil {
			return err
		}
		_, err = c.StopAgent(ctx, node, time.Second)
		return err
	}
	switch f.Kind {
	case AgentKill:
		if err := killAgent(); err != nil {
			return err
		}
		return c.StartAgent(ctx, node)
	case AgentStateCorrupt:
		if err := killAgent(); err != nil {
			return err
		}
		// A torn write: the first half of the file, then garbage.
		if _, err := c.VM.RunOK(ctx, TearScript(stateDir(node))); err != nil {
			return fmt.Errorf("corrupt the state file of %s: %w", node, err)
		}
		return c.StartAgent(ctx, node)
	case AgentStateDiskFull:
		if err := killAgent(); err != nil {
			return err
		}
		if err := fillStateDisk(ctx, c, node); err != nil {
			return err
		}
		if err := c.StartAgent(ctx, node); err != nil {
			return err
		}
		// The restarted agent resumes from its file and applies its first
		// Delta (every Apply tries a save): its saves fail, and it goes on.
		if err := cluster.Await(ctx, f.Hold+callTimeout, time.Second, func(ctx context.Context) error {
			n, err := agentSaveFailures(ctx, c, node)
			if err == nil && n == 0 {
				err = errors.New("no failed save of the state file counted yet")
			}
			return err
		}); err != nil {
			return fmt.Errorf("state disk of %s full: %w", node, err)
		}
		hold()
		if _, err := c.VM.RunOK(context.WithoutCancel(ctx), FreeScript(stateDir(node))); err != nil {
			return err
		}
		// Converged also means the file written again.
		*extra = func(ctx context.Context) error {
			l, err := c.AgentLog(ctx, node)
			if err == nil && !strings.Contains(l, LogStateSavedAgain) {
				err = fmt.Errorf("%s: the agent has not saved its state since the disk was freed", node)
			}
			return err
		}
		return nil
	case AgentStop:
		pid, err := agentPID()
		if err != nil {
			return err
		}
		r.setPaused(node, true)
		defer r.setPaused(node, false)
		if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -STOP -%d", pid)); err != nil {
			return err
		}
		hold()
		_, err = c.VM.RunOK(context.WithoutCancel(ctx), fmt.Sprintf("kill -CONT -%d", pid))
		return err
	case ReplicaKill:
		return c.ReplicaProcs[f.Target].Restart(ctx, syscall.SIGKILL)
	case ReplicaStop:
		rp := c.ReplicaProcs[f.Target]
		pid := rp.PID()
		if pid == 0 {
			return fmt.Errorf("replica %d not running", f.Target)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return err
		}
		hold()
		return syscall.Kill(pid, syscall.SIGCONT)
	case APIServerStop:
		c.Env.StopAPIServer()
		hold()
		if err := c.Env.StartAPIServer(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		for _, rp := range c.ReplicaProcs {
			if err := rp.AwaitServing(ctx, 2*time.Minute); err != nil {
				return fmt.Errorf("%w\n%s", err, rp.LogTail(20))
			}
		}
		return nil
	case DriftIPVSFlush:
		_, err := c.RunInNode(ctx, node, "ipvsadm -C")
		return err
	case DriftIPSetFlush:
		_, err := c.RunInNode(ctx, node, "ipset flush KUBE-CLUSTER-IP")
		return err
	case DriftAddressDelete:
		_, err := c.RunInNode(ctx, node, "/usr/sbin/ip addr del "+r.vip+"/32 dev kube-ipvs0")
		return err
	case DriftChainFlush:
		_, err := c.RunInNode(ctx, node, "iptables -t nat -F KUBE-SERVICES")
		return err
	case AgentCutOff:
		// The agent's packets to every replica (all behind guestfwd's
		// address) dropped in its node; the kernel stays as it is.
		rule := "OUTPUT -d " + vm.HostLoopIP + " -m comment --comment soak-cut-off -j DROP"
		if _, err := c.RunInNode(ctx, node, "iptables -I "+rule); err != nil {
			return err
		}
		hold()
		_, err := c.RunInNode(context.WithoutCancel(ctx), node, "iptables -D "+rule)
		return err
	case RollingRestart:
		for _, rp := range c.ReplicaProcs {
			if err := rp.Restart(ctx, syscall.SIGTERM); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// stateDir is node's agent's --state-dir in the guest (Cluster.AgentCommand).
func stateDir(node string) string { return "/run/vsplane/" + node }

// fillStateDisk leaves node's state dir on a full filesystem (in the
// guest's own mount namespace, so the agents started later see it), its
// state file in place. The agent must not be running.
func fillStateDisk(ctx context.Context, c *cluster.Cluster, node string) error {
	if _, err := c.VM.RunOK(ctx, DiskFullScript(stateDir(node), node)); err != nil {
		return fmt.Errorf("fill the state disk of %s: %w", node, err)
	}
	return nil
}

// agentSaveFailures reads node's agent's SaveFailureMetric.
func agentSaveFailures(ctx context.Context, c *cluster.Cluster, node string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out, err := c.RunInNode(ctx, node, "wget -qO- http://127.0.0.1:10249/metrics")
	if err != nil {
		return 0, err
	}
	n, err := ParseSaveFailures(out)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", node, err)
	}
	return n, nil
}

// awaitConverged waits (convergeBound) until every agent is connected with
// nothing unacknowledged and every node's kernel equals its desired state
// (the agent's GetKernelState: IPVS, kube-ipvs0 addresses, ipsets and
// iptables with no difference, no failed resource, no read error), and
// returns how long it took.
func (r *run) awaitConverged(f Fault, extra func(context.Context) error) (time.Duration, error) {
	return AwaitConverged(r.ctx, f, convergeBound, convergePoll, WithExtra(r.converged, extra, callTimeout), r.t.Logf)
}

// convergePoll paces the convergence checks, callTimeout bounds each call
// of one (every check starts processes in the TCG guest: polling faster
// only loads the machine whose convergence it measures).
const (
	convergePoll = time.Second
	callTimeout  = 15 * time.Second
)

func (r *run) converged(ctx context.Context) error {
	ictx, cancel := context.WithTimeout(ctx, callTimeout)
	resp, err := r.c.Inspect(ictx)
	cancel()
	if err != nil {
		return err
	}
	agents := map[string]*vsplanev1.AgentInfo{}
	for _, a := range resp.GetAgents() {
		agents[a.GetNodeName()] = a
	}
	var errs []error
	for _, n := range r.c.Nodes {
		a := agents[n.Name]
		switch {
		case a == nil:
			errs = append(errs, fmt.Errorf("%s: agent not connected", n.Name))
			continue
		case a.GetPendingResources() != 0 || a.GetLastAck() == nil:
			errs = append(errs, fmt.Errorf("%s: %d resources not acknowledged (acked once %v, replica %s, %d NACKs, last %q, nacked %v)",
				n.Name, a.GetPendingResources(), a.GetLastAck() != nil, a.GetReplica(), a.GetNacks(), a.GetLastNackError(), a.GetNacked()))
			continue
		}
		st, err := r.kernelState(ctx, n.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := cmp.Or(st.Complete(), st.Err()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}

// kernelState runs kstate in node.
func (r *run) kernelState(ctx context.Context, node string) (KernelState, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out, err := r.c.RunInNode(ctx, node, "kstate")
	if err != nil {
		return KernelState{}, fmt.Errorf("%s: kstate: %w", node, err)
	}
	st, err := ParseKernelState(out)
	if err != nil {
		return KernelState{}, fmt.Errorf("%s: %w", node, err)
	}
	return st, nil
}
