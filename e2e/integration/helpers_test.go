package integration_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/e2e/kubeenv"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// sentDelta is what the control plane sent to one node.
type sentDelta struct {
	node      string
	nonce     string            // unique within one stream only
	resources map[string]string // name -> version
	removed   []string
}

// deltaLog records every Delta and Ack the control plane saw, in order.
type deltaLog struct {
	mu     sync.Mutex
	deltas []sentDelta
	acks   []stream.AckEvent
}

func (l *deltaLog) hooks() stream.Hooks {
	return stream.Hooks{
		OnDeltaSent: func(node string, d *vsplanev1.Delta) {
			sd := sentDelta{node: node, nonce: d.GetNonce(), resources: map[string]string{}, removed: slices.Clone(d.GetRemoved())}
			for _, r := range d.GetResources() {
				sd.resources[r.GetName()] = r.GetVersion()
			}
			l.mu.Lock()
			l.deltas = append(l.deltas, sd)
			l.mu.Unlock()
		},
		OnAck: func(ev stream.AckEvent) {
			l.mu.Lock()
			l.acks = append(l.acks, ev)
			l.mu.Unlock()
		},
	}
}

// mark returns a position; since(mark) returns the deltas sent after it.
func (l *deltaLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.deltas)
}

func (l *deltaLog) since(mark int) []sentDelta {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.deltas[mark:])
}

// ackMark returns a position in the Ack log; acksSince(mark) returns the
// Acks received after it.
func (l *deltaLog) ackMark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks)
}

func (l *deltaLog) acksSince(mark int) []stream.AckEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.acks[mark:])
}

func (l *deltaLog) acksFor(node string) []stream.AckEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []stream.AckEvent
	for _, a := range l.acks {
		if a.Node == node {
			out = append(out, a)
		}
	}
	return out
}

// startKube starts a real kube-apiserver + etcd and creates Nodes n
// ("node-a", "node-b", ...) at 198.19.0.11, .12, ...; the context ends
// with the test.
func startKube(t *testing.T, nodes ...string) (kubernetes.Interface, context.Context) {
	t.Helper()
	_, kube, ctx := startKubeEnv(t, nodes...)
	return kube, ctx
}

// startKubeEnv is startKube that also returns the env (for more clients).
func startKubeEnv(t *testing.T, nodes ...string) (*kubeenv.Env, kubernetes.Interface, context.Context) {
	t.Helper()
	return startKubeWith(t, kubeenv.Options{}, nodes...)
}

// startKubeWith is startKubeEnv with kubeenv options.
func startKubeWith(t *testing.T, opts kubeenv.Options, nodes ...string) (*kubeenv.Env, kubernetes.Interface, context.Context) {
	t.Helper()
	env := kubeenv.StartForTestWith(t, opts)
	kube, err := kubernetes.NewForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for i, n := range nodes {
		if _, err := kube.CoreV1().Nodes().Create(ctx, node(n, fmt.Sprintf("198.19.0.%d", 11+i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return env, kube, ctx
}

// runReplica runs a control-plane replica in-process until the returned
// stop is called (at the latest by the test's cleanup, which runs before
// the test's context is cancelled).
func runReplica(t *testing.T, ctx context.Context, cfg app.Config) (*app.Replica, func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t).Named("cp")
	}
	if cfg.Watch.MinInterval == 0 {
		cfg.Watch.MinInterval = 20 * time.Millisecond
	}
	r, err := app.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("control plane: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return r, stop
}

// startControlPlane starts a replica in-process on a real loopback socket.
func startControlPlane(t *testing.T, ctx context.Context, kube kubernetes.Interface, log *deltaLog) (*app.Replica, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, _ := runReplica(t, ctx, app.Config{Kube: kube, GRPCListener: ln, Stream: stream.Options{Hooks: log.hooks()}})
	return r, ln.Addr().String()
}

// testAgent is an agent over an in-memory kernel, on a real gRPC socket.
type testAgent struct {
	node   string
	mem    *memory.Kernel
	cancel context.CancelFunc
	done   chan error
	agent  *agent.Agent
}

func startAgent(t *testing.T, ctx context.Context, cp, node string, mem *memory.Kernel, stateDir string) *testAgent {
	t.Helper()
	k := mem.Kernel()
	ta := startAgentCfg(t, ctx, agent.Config{ControlPlane: []string{cp}, NodeName: node, Kernel: &k, StateDir: stateDir})
	ta.mem = mem
	return ta
}

// startAgentCfg starts an agent with cfg; zero fields get test defaults
// (no periodic reconcile, fast reconnects, a test logger).
func startAgentCfg(t *testing.T, ctx context.Context, cfg agent.Config) *testAgent {
	t.Helper()
	if cfg.Reconcile.Period == 0 {
		cfg.Reconcile.Period = time.Hour
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t).Named(cfg.NodeName)
	}
	actx, cancel := context.WithCancel(ctx)
	a, err := agent.New(actx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	node := cfg.NodeName
	ta := &testAgent{node: node, cancel: cancel, done: make(chan error, 1), agent: a}
	go func() { ta.done <- a.Run(actx) }()
	return ta
}

func (a *testAgent) stop(t *testing.T) {
	t.Helper()
	a.cancel()
	if err := <-a.done; err != nil {
		t.Errorf("agent %s: %v", a.node, err)
	}
}

// ipvsState renders a kernel's IPVS table as "tcp/VIP:port" -> sorted
// "addr:port w=N" lines, the way `ipvsadm -Ln` reads.
func ipvsState(t *testing.T, k kernel.IPVS) map[string][]string {
	t.Helper()
	vss, err := k.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, vs := range vss {
		ds, err := k.ListDestinations(vs.Key)
		if err != nil {
			t.Fatal(err)
		}
		lines := []string{}
		for _, d := range ds {
			lines = append(lines, fmt.Sprintf("%s w=%d", d.Key(), d.Weight))
		}
		sort.Strings(lines)
		out[vs.Key.String()] = lines
	}
	return out
}

// eventually polls cond until it returns "" or the deadline passes; the
// last non-empty answer is the failure message.
func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %s", timeout, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func node(name, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}},
	}
}

func clusterIPService(ns, name string, ports ...int32) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: fmt.Sprintf("p%d", p), Port: p, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
		})
	}
	return svc
}

// endpoint is one backend: address and the node it runs on ("" = none).
type endpoint struct{ ip, node string }

func endpointSlice(ns, svc string, ports []int32, eps ...endpoint) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: svc + "-abc",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "vsplane-test"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range ports {
		name, port, proto := fmt.Sprintf("p%d", p), int32(8080), corev1.ProtocolTCP
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
	}
	ready := true
	for _, ep := range eps {
		e := discoveryv1.Endpoint{Addresses: []string{ep.ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
		if ep.node != "" {
			n := ep.node
			e.NodeName = &n
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

func expectedDests(eps ...string) []string {
	out := []string{}
	for _, e := range eps {
		out = append(out, e+":8080 w=1")
	}
	sort.Strings(out)
	return out
}

func vsKey(ip string, port int32) string { return fmt.Sprintf("tcp/%s:%d", ip, port) }

func diffState(got, want map[string][]string) string {
	if len(got) != len(want) {
		return fmt.Sprintf("got %d virtual servers %v, want %d %v", len(got), got, len(want), want)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || strings.Join(g, ",") != strings.Join(w, ",") {
			return fmt.Sprintf("%s: got %v, want %v", k, g, w)
		}
	}
	return ""
}

// awaitReady waits (bounded) until the replica serves.
func awaitReady(t *testing.T, r *app.Replica, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.Ready():
	case <-time.After(timeout):
		t.Fatalf("replica not ready within %v (informers not synced: missing permissions or CRD?)", timeout)
	}
}

// ackedExactly returns "" when node's agent, connected to r, has
// acknowledged exactly the versions r's store holds for node now: every
// desired resource at its desired version and nothing the store no longer
// has; otherwise what differs.
func ackedExactly(r *app.Replica, node string) string {
	desired, _, ok := r.Store.List(node)
	if !ok {
		return node + " has no published state"
	}
	info, ok := r.Streams.Registry().Agent(node)
	if !ok {
		return node + ": agent not connected"
	}
	acked := info.GetAcknowledgedVersions()
	var diffs []string
	names := map[string]bool{}
	for _, e := range desired {
		res := e.Resource
		names[res.GetName()] = true
		if v, ok := acked[res.GetName()]; !ok || v != res.GetVersion() {
			diffs = append(diffs, fmt.Sprintf("%s: desired %s, acknowledged %q", res.GetName(), res.GetVersion(), v))
		}
	}
	for name, v := range acked {
		if !names[name] {
			diffs = append(diffs, fmt.Sprintf("%s: removed, still acknowledged at %s", name, v))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return node + ": " + strings.Join(diffs, "; ")
	}
	return ""
}
