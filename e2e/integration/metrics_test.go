package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestMetricsAgainstRealAPIServer checks the control plane's and agents' metrics end to end: a
// Service change produces one programming-latency observation per agent on
// the control plane's /metrics, an agent that acknowledged every desired
// version shows no pending resources and no lag, and each agent's own
// /metrics and /healthz (separate registries, all in one process) report its
// syncs.
func TestMetricsAgainstRealAPIServer(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	kube, ctx := startKube(t, nodes...)
	log := &deltaLog{}
	r, cpAddr, cpMetrics := startControlPlaneWithMetrics(t, ctx, kube, log)
	agentMetrics := map[string]string{}
	stops := map[string]func(){}
	for _, n := range nodes {
		agentMetrics[n], stops[n] = startAgentWithMetrics(t, ctx, cpAddr, n)
	}
	t.Cleanup(func() {
		for _, stop := range stops {
			stop()
		}
	})
	eventually(t, converge, func() string {
		if got := scrape(t, cpMetrics)["vsplane_controlplane_connected_agents"]; got != 3 {
			return fmt.Sprintf("connected agents = %v", got)
		}
		return ""
	})
	// Each agent has acknowledged exactly its initial state before the
	// change below, so the change is a Delta of its own (connected is not
	// enough: the first Delta waits for the initial sync, which could include
	// the change). The initial state includes default/kubernetes, which the
	// apiserver creates in the background: it must not arrive mid-test.
	kubeName := snapshot.ServiceName("default", "kubernetes")
	for _, n := range nodes {
		eventually(t, converge, func() string {
			if _, ok := r.Store.Get(n, kubeName); !ok {
				return n + ": no " + kubeName + " yet"
			}
			return ackedExactly(r, n)
		})
	}

	// The change: a Service, then its EndpointSlice, the slice carrying the
	// EndpointSlice controller's trigger-time annotation. The Service is in
	// the desired state first: the two kinds come through separate watches,
	// so a slice created right after its Service can be seen first, and the
	// Service's own change would then produce the version with the endpoint.
	const ns = "default"
	mustCreateService(t, ctx, kube, clusterIPService(ns, "web", 80))
	webName := snapshot.ServiceName(ns, "web")
	for _, n := range nodes {
		eventually(t, converge, func() string {
			if _, ok := r.Store.Get(n, webName); !ok {
				return n + ": " + webName + " is not desired yet"
			}
			return ""
		})
	}
	trigger := time.Now()
	es := endpointSlice(ns, "web", []int32{80}, endpoint{"198.19.1.10", "node-a"})
	es.Annotations = map[string]string{model.AnnotationTriggerTime: trigger.UTC().Format(time.RFC3339Nano)}
	mustCreateSlice(t, ctx, kube, es)
	// Exact versions: web's desired version includes the slice's endpoint,
	// and every agent acknowledged exactly the versions the store holds.
	for _, n := range nodes {
		eventually(t, converge, func() string {
			res, ok := r.Store.Get(n, webName)
			if !ok || !hasRealServer(res, "198.19.1.10") {
				return n + ": " + webName + " with the slice's endpoint is not desired yet"
			}
			return ackedExactly(r, n)
		})
	}
	// The version built from the slice was ACKed with the slice's trigger
	// time: its programming latency is measured from the annotation.
	for _, n := range nodes {
		if !slices.ContainsFunc(log.acksFor(n), func(a stream.AckEvent) bool {
			return a.Status == vsplanev1.AckStatus_ACK_STATUS_ACK && a.TriggerTimes[webName].Equal(trigger)
		}) {
			t.Errorf("%s: no ACK of %s with the slice's trigger time %v", n, webName, trigger)
		}
	}
	// Up-to-date agents: no pending resources, no lag. The gauges are
	// computed at scrape time against the store, which can move on after
	// the wait above (an apiserver write of default/kubernetes reaches every
	// node), so poll until they read 0; they never do if an up-to-date agent
	// is reported as pending or lagging.
	eventually(t, converge, func() string {
		m := scrape(t, cpMetrics)
		for _, n := range nodes {
			for _, g := range []string{"vsplane_controlplane_agent_pending_resources", "vsplane_controlplane_agent_lag_seconds"} {
				key := fmt.Sprintf("%s{node=%q}", g, n)
				if v, ok := m[key]; !ok || v != 0 {
					return fmt.Sprintf("%s = %v (present %v), want 0 for an up-to-date agent", key, v, ok)
				}
			}
		}
		return ""
	})
	// Every ACKed resource with a trigger time is one observation; the
	// metrics hook runs before the log's, so the scrape has at least these.
	want := 0
	for _, n := range nodes {
		for _, a := range log.acksFor(n) {
			if a.Status != vsplanev1.AckStatus_ACK_STATUS_ACK {
				continue
			}
			for _, tt := range a.TriggerTimes {
				if !tt.IsZero() {
					want++
				}
			}
		}
	}
	cp := scrape(t, cpMetrics)
	count := cp["kubeproxy_network_programming_duration_seconds_count"]
	sum := cp["kubeproxy_network_programming_duration_seconds_sum"]
	t.Logf("network programming: %v observations (log expects >= %d), sum %.3fs; web change took %v until the test saw every ACK",
		count, want, sum, time.Since(trigger).Round(time.Millisecond))
	if count < float64(want) || count < float64(len(nodes)) {
		t.Errorf("kubeproxy_network_programming_duration_seconds_count = %v, want >= %d and >= %d agents", count, want, len(nodes))
	}
	if sum <= 0 || sum > float64(len(nodes))*converge.Seconds()*float64(max(want, 1)) {
		t.Errorf("implausible programming latency sum %v", sum)
	}
	// Every observation is within the wait above (the web change is the only
	// one with a trigger time older than the test's start, and it is bounded).
	if inf, le := cp[`kubeproxy_network_programming_duration_seconds_bucket{le="+Inf"}`], cp[`kubeproxy_network_programming_duration_seconds_bucket{le="30"}`]; inf != count || le != count {
		t.Errorf("observations above 30s: +Inf=%v le30=%v count=%v", inf, le, count)
	}
	for name, min := range map[string]float64{
		"vsplane_controlplane_deltas_sent_total":                  float64(2 * len(nodes)), // initial state + web
		"vsplane_controlplane_resources_sent_total":               float64(2 * len(nodes)),
		"vsplane_controlplane_delta_bytes_sent_total":             1,
		"vsplane_controlplane_acks_total":                         float64(2 * len(nodes)),
		"vsplane_controlplane_agent_connects_total":               float64(len(nodes)),
		"vsplane_controlplane_delta_queue_seconds_count":          float64(len(nodes)),
		"vsplane_controlplane_agent_apply_duration_seconds_count": float64(len(nodes)),
	} {
		if cp[name] < min {
			t.Errorf("%s = %v, want >= %v", name, cp[name], min)
		}
	}
	for _, n := range nodes {
		if v := cp[fmt.Sprintf("vsplane_controlplane_nacks_total{node=%q}", n)]; v != 0 {
			t.Errorf("NACKs from %s: %v", n, v)
		}
	}

	// One agent's own metrics (its private registry) and health.
	am := scrape(t, agentMetrics["node-a"])
	t.Logf("node-a: %v syncs, %.4fs total", am["kubeproxy_sync_proxy_rules_duration_seconds_count"], am["kubeproxy_sync_proxy_rules_duration_seconds_sum"])
	if am["kubeproxy_sync_proxy_rules_duration_seconds_count"] < 2 {
		t.Errorf("kubeproxy_sync_proxy_rules_duration_seconds_count = %v, want >= 2 (initial state and web)", am["kubeproxy_sync_proxy_rules_duration_seconds_count"])
	}
	for _, name := range []string{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"} {
		if v := am[name]; v < float64(trigger.Unix()) || v > float64(time.Now().Unix()+1) {
			t.Errorf("%s = %v, want a time since the change (%d)", name, v, trigger.Unix())
		}
	}
	if am[`vsplane_agent_kernel_operations_total{kind="ipvs_add_service"}`] < 1 || am[`vsplane_agent_deltas_applied_total{status="ack"}`] < 2 {
		t.Errorf("agent kernel operations / applies missing: %v", am)
	}
	if v, ok := am["vsplane_agent_failed_resources"]; !ok || v != 0 {
		t.Errorf("vsplane_agent_failed_resources = %v (present %v), want 0", v, ok)
	}
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := get(t, "http://"+agentMetrics["node-a"]+path)
		var fields map[string]any
		if err := json.Unmarshal([]byte(body), &fields); err != nil || code != http.StatusOK || fields["lastUpdated"] == nil || fields["currentTime"] == nil {
			t.Errorf("%s: %d %q (%v)", path, code, body, err)
		}
		if _, ok := fields["nodeEligible"]; ok != (path == "/healthz") {
			t.Errorf("%s: nodeEligible present=%v", path, ok)
		}
	}

	// A disconnected agent's lag series disappear.
	stops["node-c"]()
	delete(stops, "node-c")
	eventually(t, converge, func() string {
		m := scrape(t, cpMetrics)
		if _, ok := m[`vsplane_controlplane_agent_lag_seconds{node="node-c"}`]; ok || m["vsplane_controlplane_connected_agents"] != 2 {
			return fmt.Sprintf("after node-c left: connected %v, lag series present %v", m["vsplane_controlplane_connected_agents"], ok)
		}
		return ""
	})
}

// startControlPlaneWithMetrics is startControlPlane plus a metrics listener;
// it returns the replica and its gRPC and metrics addresses.
func startControlPlaneWithMetrics(t *testing.T, ctx context.Context, kube kubernetes.Interface, log *deltaLog) (*app.Replica, string, string) {
	t.Helper()
	grpcLn := listen(t)
	metricsLn := listen(t)
	r, _ := runReplica(t, ctx, app.Config{
		Kube:            kube,
		GRPCListener:    grpcLn,
		MetricsListener: metricsLn,
		Stream:          stream.Options{Hooks: log.hooks()},
	})
	return r, grpcLn.Addr().String(), metricsLn.Addr().String()
}

// hasRealServer reports whether a Service resource has a real server at ip.
func hasRealServer(res *vsplanev1.Resource, ip string) bool {
	for _, vs := range res.GetService().GetVirtualServers() {
		for _, rs := range vs.GetRealServers() {
			if rs.GetAddress() == ip {
				return true
			}
		}
	}
	return false
}

// startAgentWithMetrics runs an in-memory agent with its own registry and
// metrics listener; it returns the metrics address and a stop function.
func startAgentWithMetrics(t *testing.T, ctx context.Context, cp, node string) (string, func()) {
	t.Helper()
	k := memory.New().Kernel()
	ln := listen(t)
	actx, cancel := context.WithCancel(ctx)
	a, err := agent.New(actx, agent.Config{
		ControlPlane:    []string{cp},
		NodeName:        node,
		Kernel:          &k,
		Reconcile:       reconcile.Config{Period: time.Hour},
		BackoffBase:     20 * time.Millisecond,
		BackoffMax:      200 * time.Millisecond,
		MetricsListener: ln,
		Metrics:         prometheus.NewRegistry(),
		Logger:          zaptest.NewLogger(t).Named(node),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	stopped := false
	return ln.Addr().String(), func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent %s: %v", node, err)
		}
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// scrape reads addr's /metrics (Prometheus text format) into
// `name{labels}` -> value, labels exactly as exposed.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	code, body := get(t, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("scrape %s: HTTP %d", addr, code)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("scrape %s: bad line %q", addr, line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape %s: bad value in %q: %v", addr, line, err)
		}
		out[line[:i]] = v
	}
	return out
}
