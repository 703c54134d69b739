package skew

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/soak"
	"github.com/vsplane/vsplane/e2e/vm"
)

// oldCommit is exactly one protocol change behind this checkout: the parent
// of 70bef4a, the newest commit that changed proto/ (NodeSettings
// node_pod_cidrs). TestVersionSkew fails once another commit changes
// proto/ (but for the agent-local agent_inspect.proto: ProtocolChanges),
// until oldCommit moves forward to that commit's parent.
const oldCommit = "d58f1d7d26ff299acabee992addde0ad3d3795b1"

// Bounds of the test's steps (TCG guest on a shared 2-core machine).
const (
	budget       = 25 * time.Minute
	settleBound  = 2 * time.Minute
	callTimeout  = 15 * time.Second
	loopInterval = "100ms"
	// loopBound bounds each request loop (its stop file ends it first):
	// 6000 requests at loopInterval is 10 minutes.
	loopBound = 6000
)

// TestVersionSkew walks a rolling upgrade and a rollback with the agent and
// the control plane one protocol change apart (oldCommit against this
// checkout), in the VM test bed: two nodes, two control-plane replica
// processes, a ClusterIP Service with endpoints on both nodes. At every
// step both nodes serve it through IPVS, every agent acknowledges all its
// resources, every agent's GetKernelState shows no difference, and request
// loops running through the step see no failed request.
func TestVersionSkew(t *testing.T) {
	root, err := measure.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	requireOneProtocolChange(t, ctx, root)

	start := time.Now()
	old, err := Build(ctx, root, oldCommit)
	if err != nil {
		t.Fatal(err)
	}
	newBins, err := vm.BuildStatic(ctx, t.TempDir(), cluster.ControlPlanePackage)
	if err != nil {
		t.Fatal(err)
	}
	newControlPlane := newBins[0]
	t.Logf("binaries of %s and of this checkout built in %v", oldCommit[:7], time.Since(start).Round(time.Millisecond))

	c := cluster.StartForTest(t, ctx, cluster.Options{
		Nodes:         2,
		Replicas:      2,
		ReplicaBinary: old.ControlPlane, // (a) the control plane is old
		Pods:          [][]string{{"pod-a"}, {"pod-b", "pod-c"}},
		Binaries:      []string{old.Agent},
		// (a) node1's agent is this checkout's, node2's the old one.
		AgentExecs: map[string]string{"node2": old.AgentExec()},
		GoPackages: []string{soak.KStatePackage},
	})
	// client1 reaches the service range through node1 (cluster.Start's
	// client), client2 through node2.
	client1 := c.Client
	client2, err := c.Topo.AddClient(ctx, "client2", c.Nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	s := &skewRun{t: t, ctx: ctx, c: c, start: time.Now()}
	t.Logf("cluster up in %v", time.Since(start).Round(time.Millisecond))

	// (a) Old control plane, node1's agent new, node2's old.
	ports := []cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	backends := s.backends("pod-a", "pod-b")
	vip, err := c.CreateService(ctx, "default", "web", ports, backends)
	if err != nil {
		t.Fatal(err)
	}
	s.vip = vip
	s.awaitServedEverywhere(backends)
	s.phase("(a) old control plane, agents new (node1) and old (node2)")

	// (b) Rolling upgrade of the replicas, one at a time, under traffic
	// through node2 (the old agent's node); then an endpoint change.
	s.trafficDuring("(b) upgrade replicas", []*vm.Netns{client2}, func() error { return s.rollReplicas(newControlPlane) })
	backends = s.backends("pod-a", "pod-c")
	if err := c.SetEndpoints(ctx, "default", "web", ports, backends); err != nil {
		t.Fatal(err)
	}
	s.awaitServedEverywhere(backends)
	s.phase("(b) control plane upgraded, endpoint change served")

	// (c) node2's agent upgraded over the old agent's state file.
	s.trafficDuring("(c) upgrade node2's agent", []*vm.Netns{client2}, func() error { return s.replaceAgent("node2", "vsplane-agent") })
	s.awaitServedEverywhere(backends)
	s.phase("(c) node2's agent upgraded")

	// (d) Rollback: node1's agent downgraded over the new agent's state file.
	s.trafficDuring("(d) downgrade node1's agent", []*vm.Netns{client1}, func() error { return s.replaceAgent("node1", old.AgentExec()) })
	s.awaitServedEverywhere(backends)
	s.phase("(d) node1's agent downgraded")

	// (e) Rollback of the control plane, under traffic through both
	// nodes (node1's agent old, node2's new); then an endpoint change.
	s.trafficDuring("(e) roll back replicas", []*vm.Netns{client1, client2}, func() error { return s.rollReplicas(old.ControlPlane) })
	backends = s.backends("pod-b", "pod-c")
	if err := c.SetEndpoints(ctx, "default", "web", ports, backends); err != nil {
		t.Fatal(err)
	}
	s.awaitServedEverywhere(backends)
	s.phase("(e) control plane rolled back, endpoint change served")
}

// requireOneProtocolChange fails t unless exactly one commit between
// oldCommit and HEAD changes proto/: the test is then "one protocol change
// apart", and the next change to proto/ fails it until oldCommit moves.
func requireOneProtocolChange(t *testing.T, ctx context.Context, root string) {
	t.Helper()
	changes, err := ProtocolChanges(ctx, root, oldCommit)
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 {
		t.Fatalf("the version-skew test needs exactly one commit changing proto/ between oldCommit (%s) and HEAD, found %d:\n%s\n"+
			"Move oldCommit in e2e/skew/skew_test.go to the parent of the newest of them (git log -1 --format=%%P <newest>): the skew vsplane supports is one protocol change.",
			oldCommit, len(changes), strings.Join(changes, "\n"))
	}
	t.Logf("one protocol change apart: %s", changes[0])
}

// skewRun is the test's cluster, Service and phase clock.
type skewRun struct {
	t     *testing.T
	ctx   context.Context
	c     *cluster.Cluster
	vip   string
	start time.Time
	loops int // request loops started so far (their names are unique)
}

func (s *skewRun) phase(what string) {
	s.t.Logf("%-60s done at %v", what, time.Since(s.start).Round(time.Millisecond))
}

func (s *skewRun) backends(pods ...string) []cluster.Backend {
	s.t.Helper()
	b, err := s.c.Backends(pods...)
	if err != nil {
		s.t.Fatal(err)
	}
	return b
}

// awaitServedEverywhere waits until both nodes serve the Service with
// exactly backends, every agent has acknowledged everything, and every
// agent's GetKernelState shows the kernel equal to its desired state.
func (s *skewRun) awaitServedEverywhere(backends []cluster.Backend) {
	s.t.Helper()
	var want []string
	for _, b := range backends {
		want = append(want, fmt.Sprintf("%s:%d", b.IP, cluster.ServePort))
	}
	for _, n := range s.c.Nodes {
		if err := s.c.AwaitServing(s.ctx, n.Name, s.vip, 80, 1, want, settleBound); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := s.settled(); err != nil {
		s.t.Fatal(err)
	}
}

// settled waits until every agent has acknowledged all its resources and
// its kernel equals its desired state (GetKernelState through kstate).
func (s *skewRun) settled() error {
	if err := s.c.AwaitAcked(s.ctx, settleBound); err != nil {
		return err
	}
	return cluster.Await(s.ctx, settleBound, time.Second, func(ctx context.Context) error {
		var errs []error
		for _, n := range s.c.Nodes {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			out, err := s.c.RunInNode(cctx, n.Name, "kstate")
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: kstate: %w", n.Name, err))
				continue
			}
			st, err := soak.ParseKernelState(out)
			if err == nil {
				err = st.Err()
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			}
		}
		return errors.Join(errs...)
	})
}

// rollReplicas restarts the replicas one at a time with bin (SIGTERM, as
// a Deployment's rolling update does), each serving and every agent
// reconnected and settled before the next goes.
func (s *skewRun) rollReplicas(bin string) error {
	for _, r := range s.c.ReplicaProcs {
		r.SetBinary(bin)
		if err := r.Restart(s.ctx, syscall.SIGTERM); err != nil {
			return fmt.Errorf("replica %d: %w", r.Index, err)
		}
		if err := s.settled(); err != nil {
			return fmt.Errorf("after replica %d restarted with %s: %w", r.Index, bin, err)
		}
	}
	return nil
}

// replaceAgent stops node's agent (SIGTERM) and starts exec in its place
// over the same state dir, then checks that the new process restored the
// previous one's state file and settled.
func (s *skewRun) replaceAgent(node, exec string) error {
	if _, err := s.c.StopAgent(s.ctx, node, 10*time.Second); err != nil {
		return err
	}
	s.c.SetAgentExec(node, exec)
	if err := s.c.StartAgent(s.ctx, node); err != nil {
		return err
	}
	// The state file was written by the other version: the new process
	// must read it (a damaged or foreign file is logged and ignored, which
	// would cost a full resync and hide a format skew).
	log, err := s.c.AgentLog(s.ctx, node)
	if err != nil {
		return err
	}
	if strings.Contains(log, "ignoring unreadable state file") || !strings.Contains(log, "restored applied state") {
		return fmt.Errorf("%s's agent (%s) did not restore the state file of the previous version:\n%s", node, exec, log)
	}
	return s.settled()
}

// trafficDuring runs a bounded request loop to the Service from each of
// froms while step runs, and fails the test on any failed request (or if
// step fails).
func (s *skewRun) trafficDuring(what string, froms []*vm.Netns, step func() error) {
	s.t.Helper()
	s.loops++
	stopFile := fmt.Sprintf("/tmp/skew-loops-%d.stop", s.loops)
	var procs []*vm.Proc
	for i, from := range froms {
		p, err := s.c.StartRequestLoopFrom(s.ctx, from, fmt.Sprintf("skew-loop-%d-%d", s.loops, i), "tcp", s.vip+":80", loopBound, loopInterval, stopFile)
		if err != nil {
			s.t.Fatal(err)
		}
		// Running before the step starts: the first request answered.
		if _, err := p.AwaitLog(s.ctx, "1 ok"); err != nil {
			s.t.Fatalf("%s: request loop from %s: %v", what, from.Name, err)
		}
		procs = append(procs, p)
	}
	stepErr := step()
	// Stopped also when the step failed: the loops' result is evidence.
	if _, err := s.c.VM.RunOK(s.ctx, "touch "+stopFile); err != nil {
		s.t.Fatal(err)
	}
	for i, p := range procs {
		sum, log, err := cluster.LoopResult(s.ctx, p)
		if err != nil {
			s.t.Fatalf("%s: request loop from %s: %v\n%s", what, froms[i].Name, err, log)
		}
		s.t.Logf("%s: from %s: %d ok, %d failed %v", what, froms[i].Name, sum.OK, sum.Fail, sum.Backends)
		if sum.Fail != 0 {
			s.t.Errorf("%s: %d of %d requests from %s failed:\n%s", what, sum.Fail, sum.OK+sum.Fail, froms[i].Name, failedLines(log))
		}
	}
	if stepErr != nil {
		s.t.Fatalf("%s: %v", what, stepErr)
	}
	if s.t.Failed() {
		s.t.FailNow()
	}
}

// failedLines are the loop's failed-request lines (at most 20).
func failedLines(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, " fail") && len(out) < 20 {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
