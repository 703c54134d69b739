//go:build realsoak

package realnodes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/nodes"
	"github.com/vsplane/vsplane/e2e/soak"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// inject runs fault f to its end, then awaits convergence.
func (r *realSoak) inject(f soak.Fault) soak.FaultResult {
	res := soak.FaultResult{Fault: f, Started: r.since()}
	r.mu.Lock()
	r.last, r.lastAt = f, res.Started
	r.mu.Unlock()
	node := rc.Nodes[f.Target]
	if f.Kind.Drift() {
		r.driftBegins(node.Name)
	}
	extra, err := r.act(f, node)
	if err != nil {
		if f.Kind.Drift() {
			r.driftEnds(node.Name)
		}
		res.Err = "inject: " + err.Error()
		return res
	}
	took, err := r.awaitConverged(f, extra)
	if f.Kind.Drift() {
		r.driftEnds(node.Name)
	}
	if err != nil {
		res.Err = err.Error()
		r.t.Logf("pods after %v:\n%s", f, rc.PodsSummary(r.ctx))
		return res
	}
	res.Converged = took
	return res
}

// act does fault f, on node's agent or the replica on node (replica i runs
// on node i: hostNetwork replicas with required anti-affinity), until its
// end: a killed process running again in a Ready container, a deleted Pod
// replaced by a Ready one, an outage over, drift written. extra, if not
// nil, is one more condition of convergence (the state faults': the
// restarted agent saw the damage).
func (r *realSoak) act(f soak.Fault, node *nodes.Node) (extra func(context.Context) error, err error) {
	if f.Kind == soak.AgentStateCorrupt || f.Kind == soak.AgentStateDiskFull {
		return r.stateFault(f, node)
	}
	return nil, r.actOn(f, node)
}

// hold waits out f's hold (the schedule's own wait).
func (r *realSoak) hold(f soak.Fault) {
	select {
	case <-r.ctx.Done():
	case <-time.After(f.Hold):
	}
}

// actOn does the faults with no condition of their own (act).
func (r *realSoak) actOn(f soak.Fault, node *nodes.Node) error {
	ctx := r.ctx
	hold := func() { r.hold(f) }
	inNode := func(cmd string) error {
		cctx, cancel := context.WithTimeout(ctx, soakCallTimeout)
		defer cancel()
		res, err := rc.VM.RunIn(cctx, node.Name, cmd)
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			return fmt.Errorf("on %s: %s: %w (%s)", node.Name, cmd, err, res.Stderr)
		}
		return nil
	}
	app, comm := "vsplane-agent", "vsplane-agent"
	if f.Kind.OnReplica() || f.Kind == soak.RollingRestart {
		app, comm = "vsplane-controlplane", "vsplane-control" // comm: 15 bytes
	}
	switch f.Kind {
	case soak.AgentKill, soak.ReplicaKill, soak.AgentStop, soak.ReplicaStop:
		pod, err := podOnNode(ctx, app, node.Name)
		if err != nil {
			return err
		}
		pid, err := containerPID(ctx, pod, comm)
		if err != nil {
			return err
		}
		if f.Kind == soak.AgentKill || f.Kind == soak.ReplicaKill {
			if _, err := rc.VM.RunOK(ctx, fmt.Sprintf("kill -KILL %d", pid)); err != nil {
				return err
			}
			return awaitPodReady(ctx, app, node.Name, func(p *corev1.Pod) bool { return p.UID == pod.UID && restarts(p) > restarts(pod) })
		}
		if _, err := rc.VM.RunOK(ctx, fmt.Sprintf("kill -STOP %d", pid)); err != nil {
			return err
		}
		hold()
		_, err = rc.VM.RunOK(context.WithoutCancel(ctx), fmt.Sprintf("kill -CONT %d", pid))
		return err
	case soak.AgentPodDelete, soak.ReplicaPodDelete:
		pod, err := podOnNode(ctx, app, node.Name)
		if err != nil {
			return err
		}
		if err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		return awaitPodReady(ctx, app, node.Name, func(p *corev1.Pod) bool { return p.UID != pod.UID })
	case soak.RollingRestart:
		if _, err := rc.Kubectl(ctx, nil, "-n", cluster.SystemNamespace, "rollout", "restart", "deployment/vsplane-controlplane"); err != nil {
			return err
		}
		_, err := rc.Kubectl(ctx, nil, "-n", cluster.SystemNamespace, "rollout", "status", "deployment/vsplane-controlplane", "--timeout=8m")
		return err
	case soak.AgentCutOff:
		// The agent's node drops what it sends to the replicas' port (the
		// node's own replica's links to its peer too: they share the port).
		rule := fmt.Sprintf("OUTPUT -p tcp --dport %d -m comment --comment %s -j DROP", cluster.ControlPlanePort, cutOffComment)
		if err := inNode("iptables -w -I " + rule); err != nil {
			return err
		}
		hold()
		return inNode("iptables -w -D " + rule)
	case soak.APIServerStop:
		rc.Env.StopAPIServer()
		hold()
		return rc.Env.StartAPIServer(context.WithoutCancel(ctx))
	case soak.DriftIPVSFlush:
		return inNode("ipvsadm -C")
	case soak.DriftIPSetFlush:
		return inNode("ipset flush KUBE-CLUSTER-IP")
	case soak.DriftAddressDelete:
		return inNode(fmt.Sprintf("ip addr del %s/32 dev kube-ipvs0", r.vip))
	case soak.DriftChainFlush:
		return inNode("iptables -w -t nat -F KUBE-SERVICES")
	}
	return fmt.Errorf("fault kind %s is not one of the real bed's", f.Kind)
}

// agentStateDir is the agent's --state-dir, the DaemonSet's hostPath: on
// a real node, in the node's mount namespace (nodes.Node.Run).
const agentStateDir = "/run/vsplane"

// stateFault damages node's agent's state file as a crash in mid-write or
// a full disk would, with the agent stopped (SIGSTOP: nothing written
// between the damage and the kill), then SIGKILLs it; the kubelet starts
// it again on the same hostPath. A corrupt file must be set aside (the
// restarted agent logs it), a full disk must leave the agent working with
// its saves failing, and saving again once the space is freed.
func (r *realSoak) stateFault(f soak.Fault, node *nodes.Node) (func(context.Context) error, error) {
	ctx := r.ctx
	pod, err := podOnNode(ctx, "vsplane-agent", node.Name)
	if err != nil {
		return nil, err
	}
	pid, err := containerPID(ctx, pod, "vsplane-agent")
	if err != nil {
		return nil, err
	}
	if _, err := rc.VM.RunOK(ctx, fmt.Sprintf("kill -STOP %d", pid)); err != nil {
		return nil, err
	}
	damage, what := soak.TearScript(agentStateDir), "tear the state file"
	if f.Kind == soak.AgentStateDiskFull {
		damage, what = soak.DiskFullScript(agentStateDir, node.Name), "fill the state disk"
	}
	_, err = node.RunOK(ctx, damage)
	// Killed even if the damage failed: a stopped agent left behind would
	// fail every later check.
	if _, kerr := rc.VM.RunOK(context.WithoutCancel(ctx), fmt.Sprintf("kill -KILL %d", pid)); kerr != nil {
		return nil, errors.Join(err, kerr)
	}
	if err != nil {
		return nil, fmt.Errorf("%s of %s: %w", what, node.Name, err)
	}
	if err := awaitPodReady(ctx, "vsplane-agent", node.Name, func(p *corev1.Pod) bool { return p.UID == pod.UID && restarts(p) > restarts(pod) }); err != nil {
		return nil, err
	}
	if f.Kind == soak.AgentStateCorrupt {
		return agentLogged(pod.Name, soak.LogUnreadableState), nil
	}
	// Every Apply tries a save: the restarted agent's first ones fail.
	if err := cluster.Await(ctx, f.Hold+soakCallTimeout, time.Second, func(ctx context.Context) error {
		res, err := rc.VM.RunIn(ctx, node.Name, fmt.Sprintf("wget -qO- http://127.0.0.1:%d/metrics", metricsPorts["agent"]))
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			return err
		}
		n, err := soak.ParseSaveFailures(res.Stdout)
		if err == nil && n == 0 {
			err = errors.New("no failed save of the state file counted yet")
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("state disk of %s full: %w", node.Name, err)
	}
	r.hold(f)
	if _, err := node.RunOK(context.WithoutCancel(ctx), soak.FreeScript(agentStateDir)); err != nil {
		return nil, err
	}
	return agentLogged(pod.Name, soak.LogStateSavedAgain), nil
}

// agentLogged is a condition: the agent Pod's running container logged
// line.
func agentLogged(pod, line string) func(context.Context) error {
	return func(ctx context.Context) error {
		log, err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
		if err == nil && !strings.Contains(string(log), line) {
			err = fmt.Errorf("agent %s has not logged %q", pod, line)
		}
		return err
	}
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if !s.Ready {
			return false
		}
	}
	return true
}

// podOnNode is the running Pod labelled app=app on node (vsplane's
// namespace).
func podOnNode(ctx context.Context, app, node string) (*corev1.Pod, error) {
	pods, err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app,
		FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running %s Pod on %s", app, node)
}

// awaitPodReady waits (4 minutes at most) until a Pod app=app on node that
// meets want is Ready.
func awaitPodReady(ctx context.Context, app, node string, want func(*corev1.Pod) bool) error {
	return cluster.Await(ctx, 4*time.Minute, 500*time.Millisecond, func(ctx context.Context) error {
		pods, err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app,
			FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; want(p) && podReady(p) {
				return nil
			}
		}
		return fmt.Errorf("no Ready %s Pod on %s as awaited yet", app, node)
	})
}

// containerPID finds the process named comm in pod's containers: the one
// whose cgroup path holds the Pod's UID (the kubelet's cgroupfs layout).
func containerPID(ctx context.Context, pod *corev1.Pod, comm string) (int, error) {
	uid := string(pod.UID)
	out, err := rc.VM.RunOK(ctx, fmt.Sprintf(`for d in /proc/[0-9]*; do
  [ "$(cat $d/comm 2>/dev/null)" = %q ] || continue
  grep -qs -e 'pod%s' -e 'pod%s' $d/cgroup && echo ${d#/proc/}
done; true`, comm, uid, strings.ReplaceAll(uid, "-", "_")))
	if err != nil {
		return 0, err
	}
	pids := strings.Fields(out)
	if len(pids) != 1 {
		return 0, fmt.Errorf("%d processes %s in Pod %s: %q", len(pids), comm, pod.Name, pids)
	}
	return strconv.Atoi(pids[0])
}

// awaitConverged waits until every agent is connected with nothing
// unacknowledged, every node's kernel equals its desired state and extra,
// if any, holds.
func (r *realSoak) awaitConverged(f soak.Fault, extra func(context.Context) error) (time.Duration, error) {
	return soak.AwaitConverged(r.ctx, f, soakConvergeBound, time.Second, soak.WithExtra(r.converged, extra, soakCallTimeout), r.t.Logf)
}

func (r *realSoak) converged(ctx context.Context) error {
	agents, err := r.listAgents(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range rc.Nodes {
		a := agents[n.Name]
		switch {
		case a == nil:
			errs = append(errs, fmt.Errorf("%s: agent not connected", n.Name))
			continue
		case a.GetPendingResources() != 0 || a.GetLastAck() == nil:
			errs = append(errs, fmt.Errorf("%s: %d resources not acknowledged (replica %s, %d NACKs, last %q)",
				n.Name, a.GetPendingResources(), a.GetReplica(), a.GetNacks(), a.GetLastNackError()))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, soakCallTimeout)
		res, err := rc.VM.RunIn(cctx, n.Name, "kstate")
		cancel()
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: kstate: %w (%s)", n.Name, err, res.Stderr))
			continue
		}
		st, err := soak.ParseKernelState(res.Stdout)
		if err == nil {
			err = cmp.Or(st.Complete(), st.Err())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}

// listAgents asks the replicas in turn (one may be the fault's) for the
// fleet's agents, by node.
func (r *realSoak) listAgents(ctx context.Context) (map[string]*vsplanev1.AgentInfo, error) {
	var errs []error
	for _, n := range rc.Nodes {
		cli, err := rc.Inspect(ctx, n.IP())
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, soakCallTimeout)
		resp, err := cli.ListAgents(cctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("ListAgents on %s: %w", n.Name, err))
			continue
		}
		out := map[string]*vsplanev1.AgentInfo{}
		for _, a := range resp.GetAgents() {
			out[a.GetNodeName()] = a
		}
		return out, nil
	}
	return nil, errors.Join(errs...)
}
