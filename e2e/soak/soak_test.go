package soak

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/measure"
)

// The soak's knobs (make soak sets them; CI runs the defaults).
const (
	envDuration = "VSPLANE_SOAK_DURATION" // fault phase length (Go duration)
	envSeed     = "VSPLANE_SOAK_SEED"     // schedule seed ("" or "random": drawn and printed)
	envReport   = "VSPLANE_SOAK_REPORT"   // report directory (relative to the repo root)
	// ciDuration and ciSeed are CI's soak: with the VM's boot about 4
	// minutes on the 2-core CI machine. The seed was picked for its
	// variety: its 7 faults are 7 kinds (apiserver stopped, a chain flush
	// on node2, state disk full, rolling restart, agent cut off, agent
	// SIGKILL, agent SIGSTOP). Until 2026-12-07 CI's seed had no chain
	// flush (a NodePort request through node2 failed after one in 2 runs of
	// 3 on 2026-12-05); that day 7 runs of two seeds with one passed (see
	// e2e/soak/README.md). ipvsadm -C and a replica's SIGKILL, in the seed
	// before, are covered by e2e/vmtests.
	ciDuration = 150 * time.Second
	ciSeed     = 20326461
	ciReport   = "_out/soak"
)

const (
	ns = "default"
	// reconcilePeriod is the agents' full reconcile: what repairs drift.
	reconcilePeriod = 5 * time.Second
	// convergeBound is how long after a fault's end every node's kernel
	// must equal its desired state and every agent have acked. The issue
	// asks ~10 s; the bound is wider for TCG on a shared 2-core host, and
	// the report gives the measured times.
	convergeBound = 60 * time.Second
	// reqInterval and reqTimeout pace each stable Service's request loop.
	reqInterval = 200 * time.Millisecond
	reqTimeout  = "2s"
	// driftGrace extends a drift window past its repair: a failure is seen
	// when the log is polled, up to a poll and a request timeout later.
	driftGrace = 5 * time.Second
	stopFile   = "/tmp/soak-stop"
	// maxLogged violations are logged as they happen; the report has all.
	maxLogged = 20
)

var stablePorts = []cluster.Port{
	{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP},
	{Name: "udp", Port: 80, Protocol: corev1.ProtocolUDP},
}

// run is one soak: the cluster, the clock, the invariants' record.
type run struct {
	t     *testing.T
	ctx   context.Context
	c     *cluster.Cluster
	seed  uint64
	start time.Time

	vip           string // the stable ClusterIP Service
	nodePort      int32  // the stable NodePort Service's port
	affinityVIP   string // the stable ClusterIP Service with ClientIP affinity
	localNodePort int32  // the stable NodePort Service with externalTrafficPolicy Local
	nodeIP        map[string]string

	mu         sync.Mutex
	violations []Violation
	// driftUntil: node -> end of its drift window (zero: none).
	driftUntil map[string]time.Time
	// paused: node -> its agent is SIGSTOPped or down (its inspection does
	// not answer; the monitor leaves it alone).
	paused map[string]bool
	// last is the latest fault started, at lastAt (context for violations).
	last   Fault
	lastAt time.Duration
}

func (r *run) since() time.Duration { return time.Since(r.start) }

// violate records a broken invariant and fails the test at once, with the
// time, the seed and the context.
func (r *run) violate(what, format string, args ...any) {
	v := Violation{At: r.since(), Seed: r.seed, What: what, Context: fmt.Sprintf(format, args...)}
	r.mu.Lock()
	if r.last.Seq > 0 {
		v.Context += fmt.Sprintf(" [last fault: %v, started %v before]", r.last, (v.At - r.lastAt).Round(100*time.Millisecond))
	}
	// The host's load: the TCG guest shares the host's cores, and a busy
	// host alone fails 2 s requests (e2e/soak/README.md, open findings).
	v.Context += " [host load " + measure.LoadAvgLine() + "]"
	r.violations = append(r.violations, v)
	n := len(r.violations)
	r.mu.Unlock()
	switch {
	case n == 1:
		r.t.Errorf("FIRST %s", v)
	case n <= maxLogged:
		r.t.Errorf("%s", v)
	case n == maxLogged+1:
		r.t.Errorf("more violations: only the report lists them")
	}
}

func (r *run) inDrift(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.driftUntil[node]
	return !u.IsZero() && time.Now().Before(u)
}

func (r *run) setDrift(node string, until time.Time) {
	r.mu.Lock()
	r.driftUntil[node] = until
	r.mu.Unlock()
}

func (r *run) setPaused(node string, p bool) {
	r.mu.Lock()
	r.paused[node] = p
	r.mu.Unlock()
}

func (r *run) isPaused(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused[node]
}

func soakParams(t *testing.T) (time.Duration, uint64, string) {
	d, seed, dir, err := Params(Knobs{Duration: envDuration, Seed: envSeed, Report: envReport},
		Defaults{Duration: ciDuration, Seed: ciSeed, Report: ciReport})
	if err != nil {
		t.Fatal(err)
	}
	return d, seed, dir
}

// TestSoak is the chaos soak: two nodes, three control-plane replicas,
// request loops to stable Services (ClusterIP TCP and UDP through node1, a
// NodePort of node2), churn of other Services, and the faults of
// Schedule(seed). Invariants, each violation reported with its time and
// the seed: no failed request to a stable Service except while a drift
// fault has broken its node's kernel (until repaired); the stable virtual
// servers present on every node not under drift; after each fault, within
// convergeBound, every node's kernel equal to its desired state and every
// agent acked. CI runs ciDuration with ciSeed (a missing VM fails it);
// make soak any length (DURATION, SEED). The report goes to envReport.
func TestSoak(t *testing.T) {
	d, seed, reportDir := soakParams(t)
	plan := Schedule(seed, d, DefaultShape)
	t.Logf("soak: seed %d, duration %v, %d faults (replay: make soak SEED=%d DURATION=%v)", seed, d, len(plan), seed, d)
	for _, f := range plan {
		t.Logf("  planned %v", f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Minute)
	defer cancel()
	if dl, ok := t.Deadline(); ok {
		var c2 context.CancelFunc
		ctx, c2 = context.WithDeadline(ctx, dl.Add(-30*time.Second))
		defer c2()
	}
	t0 := time.Now()
	c := cluster.StartForTest(t, ctx, cluster.Options{
		Nodes:           2,
		Pods:            [][]string{{"pod-a", "pod-c"}, {"pod-b", "pod-d"}},
		Replicas:        3,
		ReplicaMetrics:  true,
		IPv6:            true, // the churn's dual-stack Services
		Zones:           churnZones,
		ReconcilePeriod: reconcilePeriod,
		AgentArgs:       "--first-delta-timeout 10s",
		GoPackages:      []string{KStatePackage},
	})
	t.Logf("cluster up in %v (VM build %v, boot %v)", time.Since(t0).Round(time.Millisecond),
		c.VM.BuildTime.Round(time.Millisecond), c.VM.BootTime.Round(time.Millisecond))

	r := &run{t: t, ctx: ctx, c: c, seed: seed, driftUntil: map[string]time.Time{}, paused: map[string]bool{}, nodeIP: map[string]string{}}
	for _, n := range c.Nodes {
		r.nodeIP[n.Name] = n.IP
	}
	r.createStable(t)
	t.Logf("stable Services programmed at %v", time.Since(t0).Round(time.Millisecond))

	r.start = time.Now()
	rep := &Report{Date: time.Now().UTC().Format("2006-01-02"), Seed: seed, Duration: d, Nodes: 2, Replicas: 3}
	loops := r.startLoops(t)
	mem := newMemory(r)
	churn, err := newChurn(r, seed)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	bg, stopBG := context.WithCancel(ctx)
	for _, f := range []func(context.Context){
		func(ctx context.Context) { r.pollLoops(ctx, loops) },
		r.monitor,
		mem.run,
		churn.run,
	} {
		wg.Add(1)
		go func() { defer wg.Done(); f(bg) }()
	}

	rep.Faults = RunFaults(ctx, plan, r.since, r.inject, r.violate, t.Logf)
	if wait := d - r.since(); wait > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	// The end: every node converged once more (the churn still running).
	if _, err := r.awaitConverged(Fault{Kind: "final"}, nil); err != nil {
		r.violate("not converged", "at the end: %v", err)
	}
	rep.Elapsed = r.since()
	stopBG()
	wg.Wait()
	rep.Traffic = r.finishLoops(t, loops)
	rep.Churn, rep.ChurnErrors = churn.counts, churn.errors
	rep.Memory = mem.series()
	rep.Load = measure.LoadAvgLine()
	mem.check(t, rep.Memory) // before the report: its violations belong in it
	r.mu.Lock()
	rep.Violations = append([]Violation(nil), r.violations...)
	r.mu.Unlock()
	rep.Aggregate()
	written, err := rep.Write(reportDir, "soak-"+rep.Date)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s.{json,md,png}\n%s", written, rep.Markdown())
}

// createStable creates the stable Services and waits until both nodes
// serve them, all on pod-a (node1) and pod-b (node2):
//   - "stable": ClusterIP, TCP and UDP port 80;
//   - "stable-np": NodePort, TCP;
//   - "stable-affinity": ClusterIP, TCP, sessionAffinity ClientIP;
//   - "stable-local": NodePort, TCP, externalTrafficPolicy Local (through
//     node2's NodePort only pod-b answers, and sees the client's address).
func (r *run) createStable(t *testing.T) {
	ctx, c := r.ctx, r.c
	backends, err := c.Backends("pod-a", "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	if r.vip, err = c.CreateService(ctx, ns, "stable", stablePorts, backends); err != nil {
		t.Fatal(err)
	}
	var eps []cluster.Endpoint
	var want []string
	for _, p := range []string{"pod-a", "pod-b"} {
		ep, err := c.PodEndpoint(p, false)
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
		want = append(want, fmt.Sprintf("%s:%d", ep.IP, cluster.ServePort))
	}
	create := func(name string, spec corev1.ServiceSpec) *corev1.Service {
		spec.Ports = []corev1.ServicePort{{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(cluster.ServePort)}}
		svc, err := c.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ApplySlice(ctx, ns, name, name+"-1", discoveryv1.AddressTypeIPv4, stablePorts[:1], eps); err != nil {
			t.Fatal(err)
		}
		return svc
	}
	r.nodePort = create("stable-np", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}).Spec.Ports[0].NodePort
	r.affinityVIP = create("stable-affinity", corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP,
		SessionAffinity: corev1.ServiceAffinityClientIP}).Spec.ClusterIP
	r.localNodePort = create("stable-local", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal}).Spec.Ports[0].NodePort
	for _, n := range c.Nodes {
		if err := c.AwaitServing(ctx, n.Name, r.vip, 80, 2, want, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := c.AwaitServing(ctx, n.Name, n.IP, r.nodePort, 1, want, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := c.AwaitServing(ctx, n.Name, r.affinityVIP, 80, 1, want, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// Local: node2's NodePort serves its own pod only.
	if err := c.AwaitServing(ctx, "node2", r.nodeIP["node2"], r.localNodePort, 1, want[1:], 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.AwaitAcked(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}
