package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func hcService(port, local uint32) *vsplanev1.Resource {
	return &vsplanev1.Resource{Name: "service/default/lb", Version: fmt.Sprintf("%d-%d", port, local),
		Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{Namespace: "default", Name: "lb",
			HealthCheckNodePort: port, LocalEndpoints: local,
			VirtualServers: []*vsplanev1.VirtualServer{{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP,
				Address: "198.18.0.50", Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
				Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS}}}}}
}

func nodeSettings(deleting bool) *vsplanev1.Resource {
	return &vsplanev1.Resource{Name: reconcile.SettingsResource, Version: fmt.Sprint(deleting),
		Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{NodeDeleting: deleting}}}
}

// healthAgent is an agent over a memory kernel whose health-check servers
// listen on loopback only (never on every host address).
func healthAgent(t *testing.T) *Agent {
	t.Helper()
	k := memory.New().Kernel()
	a, err := New(context.Background(), Config{ControlPlane: []string{"127.0.0.1:1"}, NodeName: "node1", Kernel: &k,
		Logger: zaptest.NewLogger(t), HealthCheckNodePorts: true,
		healthListen: func(network, addr string) (net.Listener, error) {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
		}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func freeLoopbackPort(t *testing.T) uint32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint32(ln.Addr().(*net.TCPAddr).Port)
}

// getCode returns the HTTP status at 127.0.0.1:port, or 0 when refused.
func getCode(t *testing.T, port uint32) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// awaitCode polls until the health-check port answers want (bounded).
func awaitCode(t *testing.T, port uint32, want int) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := getCode(t, port)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %d: got %d %q, want %d", port, code, body, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The agent's health-check servers follow the applied Services: opened
// after an Apply, 200/503 by local endpoints, closed when the Service goes.
func TestHealthCheckNodePortsFollowAppliedState(t *testing.T) {
	a := healthAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Apply through the same wrapper the stream client uses.
	applier := notifyApplier{Applier: a.Reconciler, ch: a.healthSync}
	port := freeLoopbackPort(t)
	applier.Apply(ctx, &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{nodeSettings(false), hcService(port, 2)}})
	if body := awaitCode(t, port, 200); !strings.Contains(body, `"name": "lb"`) || !strings.Contains(body, `"localEndpoints": 2`) {
		t.Errorf("body %q", body)
	}
	applier.Apply(ctx, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{hcService(port, 0)}})
	awaitCode(t, port, 503)
	applier.Apply(ctx, &vsplanev1.Delta{Nonce: "3", Removed: []string{"service/default/lb"}})
	awaitCode(t, port, 0)
}

// /healthz follows node/settings: not eligible before they arrive, nor
// while node_deleting; /livez looks at neither.
func TestHealthzNodeDeleting(t *testing.T) {
	a := healthAgent(t)
	h := a.httpHandler(false) // the --healthz-address handler
	code := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	if code("/metrics") != http.StatusNotFound {
		t.Errorf("the healthz listener serves /metrics (kube-proxy keeps metrics on its own, loopback address)")
	}
	if rec := httptest.NewRecorder(); func() int {
		a.httpHandler(true).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Code
	}() != http.StatusOK {
		t.Errorf("the metrics listener does not serve /metrics")
	}
	// /debug/pprof/ only with Profiling (kube-proxy's enableProfiling).
	pprofCode := func() int {
		rec := httptest.NewRecorder()
		a.httpHandler(true).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/", nil))
		return rec.Code
	}
	if c := pprofCode(); c != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without Profiling: %d, want 404", c)
	}
	a.cfg.Profiling = true
	if c := pprofCode(); c != http.StatusOK {
		t.Errorf("/debug/pprof/ with Profiling: %d, want 200", c)
	}
	a.cfg.Profiling = false
	if code("/healthz") != 503 || code("/livez") != 200 {
		t.Errorf("before the node settings: healthz %d livez %d, want 503 (kube-proxy: Node not seen yet) and 200", code("/healthz"), code("/livez"))
	}
	ctx := context.Background()
	a.Reconciler.Apply(ctx, &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{nodeSettings(false)}})
	if code("/healthz") != 200 || code("/livez") != 200 {
		t.Fatalf("healthy node: healthz %d livez %d", code("/healthz"), code("/livez"))
	}
	a.Reconciler.Apply(ctx, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{nodeSettings(true)}})
	if code("/healthz") != 503 || code("/livez") != 200 {
		t.Errorf("deleting node: healthz %d livez %d", code("/healthz"), code("/livez"))
	}
}
