package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/vsplane/vsplane/e2e/cluster"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// inject runs fault f to its end (process back, outage over, drift
// written), then awaits convergence.
func (r *run) inject(f Fault) FaultResult {
	res := FaultResult{Fault: f, Started: r.since()}
	node := fmt.Sprintf("node%d", f.Target+1)
	if f.Kind.Drift() {
		// Until repaired (and driftGrace after), failures through node
		// are the drift's.
		r.setDrift(node, time.Now().Add(24*time.Hour))
	}
	if err := r.act(f, node); err != nil {
		res.Err = "inject: " + err.Error()
		if f.Kind.Drift() {
			r.setDrift(node, time.Now().Add(driftGrace))
		}
		return res
	}
	took, err := r.awaitConverged(f)
	if f.Kind.Drift() {
		r.setDrift(node, time.Now().Add(driftGrace))
	}
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Converged = took
	return res
}

// act performs the fault itself.
func (r *run) act(f Fault, node string) error {
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
		path := fmt.Sprintf("/run/vsplane/%s/applied-state.pb", node)
		if _, err := c.VM.RunOK(ctx, fmt.Sprintf(
			`f=%s; test -s $f; s=$(wc -c < $f); head -c $((s/2)) $f > $f.tmp && printf 'soak\377\377\377garbage' >> $f.tmp && mv $f.tmp $f`, path)); err != nil {
			return fmt.Errorf("corrupt %s: %w", path, err)
		}
		return c.StartAgent(ctx, node)
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
		rp := c.ReplicaProcs[f.Target]
		if err := rp.Signal(syscall.SIGKILL); err != nil {
			return err
		}
		if err := rp.Start(); err != nil {
			return err
		}
		if err := rp.AwaitServing(ctx, 2*time.Minute); err != nil {
			return fmt.Errorf("%w\n%s", err, rp.LogTail(20))
		}
		return nil
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
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// awaitConverged waits (convergeBound) until every agent is connected with
// nothing unacknowledged and every node's kernel equals its desired state
// (the agent's GetKernelState: no difference, no failed resource, no read
// error; the stable ClusterIP in KUBE-CLUSTER-IP, which GetKernelState does
// not compare), and returns how long it took.
func (r *run) awaitConverged(f Fault) (time.Duration, error) {
	start := time.Now()
	err := cluster.Await(r.ctx, convergeBound, 250*time.Millisecond, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return r.converged(cctx)
	})
	if err != nil {
		return 0, fmt.Errorf("%v: %w", f, err)
	}
	return time.Since(start), nil
}

func (r *run) converged(ctx context.Context) error {
	resp, err := r.c.Inspect(ctx)
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
		if st.Differences != 0 || len(st.Failed) > 0 || len(st.ReadErrors) > 0 {
			errs = append(errs, fmt.Errorf("%s: kernel against desired: %d differences %v, failed %v, read errors %v",
				n.Name, st.Differences, st.NotInSync, st.Failed, st.ReadErrors))
			continue
		}
		if _, err := r.c.RunInNode(ctx, n.Name, fmt.Sprintf("ipset test KUBE-CLUSTER-IP %s,tcp:80", r.vip)); err != nil {
			errs = append(errs, fmt.Errorf("%s: KUBE-CLUSTER-IP lacks %s,tcp:80: %w", n.Name, r.vip, err))
		}
	}
	return errors.Join(errs...)
}

// kernelState runs kstate in node.
func (r *run) kernelState(ctx context.Context, node string) (KernelState, error) {
	out, err := r.c.RunInNode(ctx, node, "kstate")
	if err != nil {
		return KernelState{}, fmt.Errorf("%s: kstate: %w", node, err)
	}
	var st KernelState
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &st); err != nil {
		return KernelState{}, fmt.Errorf("%s: kstate output %q: %w", node, out, err)
	}
	return st, nil
}
