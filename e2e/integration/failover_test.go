package integration_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/engine"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/e2e/kubeenv"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Agents holding the full state of 40 nodes x 2,500 Services (100,000
// node x Service slots) move from a replica that goes away to one that is
// still starting: the new replica holds them (NOT_SERVING, nothing sent)
// until its first full computation is committed, in many small store
// commits, then sends each agent one empty Delta. Nothing is removed,
// nothing resent, nothing written to any kernel. A third replica answers
// inspection for all of them (the fleet-wide view).
func TestReplicaFailoverAtScale(t *testing.T) {
	const nodes, services = 40, 2500
	nodeNames := make([]string, nodes)
	for i := range nodes {
		nodeNames[i] = fmt.Sprintf("node-%02d", i)
	}
	env, kube, ctx := startKubeEnv(t, nodeNames...)
	createServices(t, ctx, env, services)

	lnA, lnB, lnC := listen(t), listen(t), listen(t)
	addrA, addrB, addrC := lnA.Addr().String(), lnB.Addr().String(), lnC.Addr().String()
	all := []string{addrA, addrB, addrC}
	logB := &deltaLog{}
	var connectsBeforeReady atomic.Int32
	replicaCfg := func(ln net.Listener, kube kubernetes.Interface, log *deltaLog) app.Config {
		cfg := app.Config{Kube: kube, GRPCListener: ln, Advertise: ln.Addr().String(), Peers: all,
			// Many small commits: before nodes were published whole, a
			// resuming agent could be diffed against a half-filled node.
			Engine: engine.Config{MaxBatch: 1000}}
		if log != nil {
			cfg.Stream.Hooks = log.hooks()
		}
		return cfg
	}
	replicaA, stopA := runReplica(t, ctx, replicaCfg(lnA, kube, nil))
	awaitReady(t, replicaA, converge)

	kernels := make([]*memory.Kernel, nodes)
	agents := make([]*testAgent, nodes)
	stateDir := t.TempDir()
	for i, n := range nodeNames {
		kernels[i] = memory.New()
		agents[i] = startAgentCfg(t, ctx, agent.Config{
			ControlPlane: []string{addrA, addrB}, NodeName: n, Kernel: ptr(kernels[i].Kernel()),
			StateDir: filepath.Join(stateDir, n), FirstDeltaTimeout: time.Minute,
		})
	}
	t.Cleanup(func() {
		for _, a := range agents {
			a.stop(t)
		}
	})
	// Wait for every agent on A to hold every resource: 2,500 Services, the
	// apiserver's default/kubernetes and node/settings.
	eventually(t, 3*time.Minute, func() string {
		for _, n := range nodeNames {
			info, ok := replicaA.Streams.Registry().Agent(n)
			if !ok || info.GetPendingResources() != 0 || len(info.GetAcknowledgedVersions()) != services+2 {
				return fmt.Sprintf("%s not in sync on A: %v", n, summarizeAgent(info))
			}
		}
		return ""
	})
	for _, k := range kernels {
		k.ResetCalls()
	}

	// B starts, slowed down on its first list of Services so that every
	// agent is connected to it while it computes; then A goes away.
	slow := env.RESTConfig()
	slow.QPS, slow.Burst = 1000, 2000
	var firstList sync.Once
	slow.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			// The informer's initial list (or watch-list) of Services.
			if r.URL.Path == "/api/v1/services" {
				firstList.Do(func() { time.Sleep(5 * time.Second) })
			}
			return rt.RoundTrip(r)
		})
	})
	kubeB, err := kubernetes.NewForConfig(slow)
	if err != nil {
		t.Fatal(err)
	}
	cfgB := replicaCfg(lnB, kubeB, logB)
	metricsB := listen(t)
	cfgB.MetricsListener = metricsB
	var replicaB *app.Replica
	cfgB.Stream.Hooks.OnConnect = func(stream.ConnectEvent) {
		select {
		case <-replicaB.Ready():
		default:
			connectsBeforeReady.Add(1)
		}
	}
	replicaB, _ = runReplica(t, ctx, cfgB)
	checkHealth(t, addrB, healthpb.HealthCheckResponse_NOT_SERVING)
	// kubelet's probes (plain HTTP: its gRPC probe cannot do TLS) agree.
	checkHTTP(t, metricsB.Addr().String(), "/readyz", http.StatusServiceUnavailable)
	checkHTTP(t, metricsB.Addr().String(), "/livez", http.StatusOK)
	stopA()
	started := time.Now()
	eventually(t, 3*time.Minute, func() string {
		for _, n := range nodeNames {
			info, ok := replicaB.Streams.Registry().Agent(n)
			if !ok || info.GetLastAck() == nil || info.GetPendingResources() != 0 {
				return fmt.Sprintf("%s not resumed on B: %v", n, summarizeAgent(info))
			}
		}
		return ""
	})
	t.Logf("%d agents resumed on the new replica %v after the old one stopped; %d of them connected before it was ready",
		nodes, time.Since(started).Round(time.Millisecond), connectsBeforeReady.Load())
	checkHealth(t, addrB, healthpb.HealthCheckResponse_SERVING)
	checkHTTP(t, metricsB.Addr().String(), "/readyz", http.StatusOK)
	if got := connectsBeforeReady.Load(); got != nodes {
		t.Errorf("%d of %d agents connected while B was still computing; the test must exercise that window", got, nodes)
	}
	sent, removed := 0, 0
	for _, d := range logB.since(0) {
		sent += len(d.resources)
		removed += len(d.removed)
	}
	if sent != 0 || removed != 0 {
		t.Fatalf("the new replica sent %d resources and %d removals to agents that held the current state; want 0 and 0", sent, removed)
	}
	for i, k := range kernels {
		if calls := k.Calls(); len(calls) != 0 {
			t.Fatalf("%s: resuming on another replica wrote to the kernel: %v", nodeNames[i], calls)
		}
	}

	// The fleet-wide view: C, with no agent of its own, answers for all.
	replicaC, _ := runReplica(t, ctx, replicaCfg(lnC, kube, nil))
	awaitReady(t, replicaC, converge)
	conn, err := grpc.NewClient(addrC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	insp := vsplanev1.NewInspectServiceClient(conn)
	var list *vsplanev1.ListAgentsResponse
	eventually(t, converge, func() string {
		list, err = insp.ListAgents(ctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
		if err != nil {
			return err.Error()
		}
		if len(list.GetAgents()) != nodes {
			return fmt.Sprintf("C lists %d agents, want %d (unreachable: %v)", len(list.GetAgents()), nodes, list.GetUnreachableReplicas())
		}
		return ""
	})
	for _, a := range list.GetAgents() {
		if a.GetReplica() != addrB || len(a.GetAcknowledgedVersions()) != 0 {
			t.Fatalf("agent %s: replica %q, %d versions; want %s and none (omitted)", a.GetNodeName(), a.GetReplica(), len(a.GetAcknowledgedVersions()), addrB)
		}
	}
	if unreachable := list.GetUnreachableReplicas(); len(unreachable) != 1 || unreachable[0] != addrA {
		t.Errorf("unreachable replicas %v, want only the stopped %s", unreachable, addrA)
	}
	t.Logf("fleet-wide ListAgents (omit_versions) for %d agents: %d bytes", nodes, proto.Size(list))
	local, err := insp.ListAgents(ctx, &vsplanev1.ListAgentsRequest{Scope: vsplanev1.Scope_SCOPE_REPLICA})
	if err != nil || len(local.GetAgents()) != 0 {
		t.Fatalf("C's own agents: %v %v, want none", local, err)
	}
	ex, err := insp.ExplainService(ctx, &vsplanev1.ExplainServiceRequest{NodeName: nodeNames[7], Namespace: "scale", Name: "svc-0042"})
	if err != nil {
		t.Fatal(err)
	}
	if ex.GetAcknowledgement() != vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED || ex.GetReplica() != addrB {
		t.Fatalf("ExplainService on C: %v via %q, want ACKNOWLEDGED via %s", ex.GetAcknowledgement(), ex.GetReplica(), addrB)
	}
	st, err := insp.GetNodeStatus(ctx, &vsplanev1.GetNodeStatusRequest{NodeName: nodeNames[3]})
	if err != nil || st.GetAgent().GetReplica() != addrB {
		t.Fatalf("GetNodeStatus on C: %v %v", st.GetAgent().GetReplica(), err)
	}
}

// createServices creates n ClusterIP Services "scale/svc-NNNN", every tenth
// with an EndpointSlice of two endpoints, through a fast client.
func createServices(t *testing.T, ctx context.Context, env *kubeenv.Env, n int) {
	t.Helper()
	cfg := env.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "scale"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("svc-%04d", i)
			if _, err := kube.CoreV1().Services("scale").Create(gctx, clusterIPService("scale", name, 80), metav1.CreateOptions{}); err != nil {
				return err
			}
			if i%10 != 0 {
				return nil
			}
			es := endpointSlice("scale", name, []int32{80},
				endpoint{fmt.Sprintf("198.19.%d.%d", 10+i/250, i%250), ""}, endpoint{fmt.Sprintf("198.19.%d.%d", 40+i/250, i%250), ""})
			_, err := kube.DiscoveryV1().EndpointSlices("scale").Create(gctx, es, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d Services (%d with endpoints) in %v", n, n/10, time.Since(start).Round(time.Millisecond))
}

// checkHTTP fails unless GET path on addr answers want.
func checkHTTP(t *testing.T, addr, path string, want int) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %s, want %d", path, resp.Status, want)
	}
}

func checkHealth(t *testing.T, addr string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eventually(t, converge, func() string {
		r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			return err.Error()
		}
		if r.GetStatus() != want {
			return fmt.Sprintf("health %v, want %v", r.GetStatus(), want)
		}
		return ""
	})
}

func summarizeAgent(info *vsplanev1.AgentInfo) string {
	if info == nil {
		return "not connected"
	}
	return fmt.Sprintf("pending %d, acknowledged %d", info.GetPendingResources(), len(info.GetAcknowledgedVersions()))
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func ptr[T any](v T) *T { return &v }
