package app

import (
	"context"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/watch"
	"github.com/vsplane/vsplane/internal/testpki"
)

// kubeconfig writes a kubeconfig whose server is server.
func kubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	doc := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + server + `"}}]
users: [{name: u, user: {token: t0k3n}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func commandLine(t *testing.T, env map[string]string, args ...string) *config.CommandLine {
	t.Helper()
	cl, err := config.ParseCommandLine(flag.NewFlagSet("vsplane-controlplane", flag.ContinueOnError), args,
		func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func closeListeners(cfg Config) {
	for _, ln := range []net.Listener{cfg.GRPCListener, cfg.MetricsListener} {
		if ln != nil {
			ln.Close()
		}
	}
}

// TestFromCommandLine: the command line's settings land in the replica's
// Config as main used to map them.
func TestFromCommandLine(t *testing.T) {
	kc := kubeconfig(t, "https://127.0.0.1:1")
	cl := commandLine(t, map[string]string{"POD_IP": "198.18.1.11"}, "--kubeconfig", kc, "--listen=127.0.0.1:0",
		"--metrics-address=127.0.0.1:0", "--profiling", "--kube-api-qps=20", "--auth-api-qps=7", "--min-sync-interval=50ms",
		"--max-sync-interval=2h", "--ack-timeout=1m", "--unknown-node-timeout=2m", "--max-unknown-node-streams=9",
		"--max-inflight-deltas=3", "--delta-target-apply-time=100ms", "--min-delta-ops=10", "--max-delta-ops=20",
		"--max-connection-age=1h", "--max-connection-age-grace=1s", "--scheduler=wlc", "--rollout-lease=ns/lease",
		"--peers=198.18.1.12:18000", "--peer-service=ns/peers", "--agent-service-account=ns/agent",
		"--tls-cert-file=/c", "--tls-key-file=/k", "--tls-ca-file=/ca", "--tls-server-name=cp", "--peer-token-file=/t")
	cfg, err := FromCommandLine(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeListeners(cfg)
	if cfg.REST == nil || cfg.REST.Host != "https://127.0.0.1:1" || cfg.REST.BearerToken != "t0k3n" {
		t.Errorf("REST %+v: want the kubeconfig's", cfg.REST)
	}
	if cfg.Kube != nil || cfg.Dynamic != nil || cfg.TLS != nil || cfg.AgentAuth != nil {
		t.Error("clients built before New")
	}
	if cfg.KubeAPIQPS != 20 || cfg.AuthAPIQPS != 7 {
		t.Errorf("QPS %v, %v", cfg.KubeAPIQPS, cfg.AuthAPIQPS)
	}
	if got, want := cfg.Watch, (watch.Options{MinInterval: 50 * time.Millisecond, MaxInterval: 2 * time.Hour}); got != want {
		t.Errorf("watch %+v, want %+v", got, want)
	}
	wantStream := stream.Options{AckTimeout: time.Minute, UnknownNodeTimeout: 2 * time.Minute, MaxUnknownNodeStreams: 9,
		MaxInFlight: 3, TargetApplyTime: 100 * time.Millisecond, MinDeltaOps: 10, MaxDeltaOps: 20}
	if diff := cmp.Diff(wantStream, cfg.Stream); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
	if cfg.MaxConnectionAge != time.Hour || cfg.MaxConnectionAgeGrace != time.Second {
		t.Errorf("connection age %v, grace %v", cfg.MaxConnectionAge, cfg.MaxConnectionAgeGrace)
	}
	if cfg.Translate.DefaultScheduler != "wlc" {
		t.Errorf("translate %+v", cfg.Translate)
	}
	if !cfg.Rollouts || cfg.RolloutLease != "ns/lease" || cfg.PeerService != "ns/peers" || strings.Join(cfg.Peers, ",") != "198.18.1.12:18000" {
		t.Errorf("rollouts %v %q, peers %v %q", cfg.Rollouts, cfg.RolloutLease, cfg.Peers, cfg.PeerService)
	}
	_, port, _ := net.SplitHostPort(cfg.GRPCListener.Addr().String())
	if cfg.Advertise != "198.18.1.11:"+port {
		t.Errorf("advertise %q: want $POD_IP and the listener's port %s", cfg.Advertise, port)
	}
	if cfg.MetricsListener == nil || !cfg.Profiling {
		t.Errorf("metrics listener %v, profiling %v", cfg.MetricsListener, cfg.Profiling)
	}
	wantSec := &Security{CertFile: "/c", KeyFile: "/k", AgentServiceAccounts: []string{"ns/agent"}, CAFile: "/ca", ServerName: "cp", PeerTokenFile: "/t",
		CAConfigMap: "vsplane-system/vsplane-controlplane-ca"}
	if diff := cmp.Diff(wantSec, cfg.Security); diff != "" {
		t.Errorf("security (-want +got):\n%s", diff)
	}
	if cfg.Reload != nil {
		t.Error("a Reloader without --config")
	}

	// --insecure-plaintext, an advertised address given, no metrics, a file.
	path := filepath.Join(t.TempDir(), "vsplane.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\ncontrolPlane: {metricsAddress: \"\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cl = commandLine(t, map[string]string{"POD_IP": "198.18.1.11"}, "--kubeconfig", kc, "--listen=127.0.0.1:0", "--config", path,
		"--insecure-plaintext", "--advertise-address=198.18.1.99:1", "--rollouts=false")
	cfg, err = FromCommandLine(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeListeners(cfg)
	if cfg.Security != nil || cfg.Advertise != "198.18.1.99:1" || cfg.MetricsListener != nil || cfg.Reload == nil || cfg.Rollouts {
		t.Errorf("insecure: security %+v, advertise %q, metrics %v, reload %v, rollouts %v", cfg.Security, cfg.Advertise, cfg.MetricsListener, cfg.Reload, cfg.Rollouts)
	}

	// Errors name what failed.
	cl = commandLine(t, nil, "--kubeconfig", filepath.Join(t.TempDir(), "none"))
	if _, err := FromCommandLine(cl, nil); err == nil || !strings.Contains(err.Error(), "kubernetes client config") {
		t.Errorf("missing kubeconfig: %v", err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cl = commandLine(t, nil, "--kubeconfig", kc, "--listen=127.0.0.1:0", "--metrics-address="+busy.Addr().String())
	if _, err := FromCommandLine(cl, nil); err == nil || !strings.Contains(err.Error(), "listen "+busy.Addr().String()) {
		t.Errorf("busy metrics address: %v", err)
	}
}

// TestBuildClients: New's clients come from the rest.Config: the typed
// one speaks protobuf at the API QPS, the reviews have a client of their
// own; Security gives TLS, authentication and the peers' credentials.
func TestBuildClients(t *testing.T) {
	var mu sync.Mutex
	var accepts []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accepts = append(accepts, r.Header.Get("Accept"))
		mu.Unlock()
		http.Error(w, "no", http.StatusNotFound)
	}))
	defer api.Close()
	dir := t.TempDir()
	ca, err := testpki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{REST: &rest.Config{Host: api.URL}, KubeAPIQPS: 20, AuthAPIQPS: 7, Rollouts: true, Peers: []string{"127.0.0.1:1"},
		Security: &Security{CertFile: files.Cert, KeyFile: files.Key, AgentServiceAccounts: []string{"ns/agent"},
			CAFile: files.CA, ServerName: testpki.ServerName, PeerTokenFile: filepath.Join(dir, "token")}}
	if err := buildClients(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Kube == nil || cfg.Dynamic == nil || cfg.TLS == nil || cfg.AgentAuth == nil || cfg.InspectAuth == nil || len(cfg.PeerDialOptions) != 2 {
		t.Fatalf("not built: %+v", cfg)
	}
	_, _ = cfg.Kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	mu.Lock()
	got := strings.Join(accepts, " | ")
	mu.Unlock()
	if !strings.HasPrefix(got, protobuf) {
		t.Errorf("typed client sent Accept %q, want protobuf first", got)
	}
	if cfg.REST.QPS != 0 {
		t.Error("the caller's rest.Config was changed")
	}

	// Without Security: no TLS, no authentication; without Rollouts no
	// dynamic client.
	plain := Config{REST: &rest.Config{Host: api.URL}}
	if err := buildClients(&plain); err != nil {
		t.Fatal(err)
	}
	if plain.Kube == nil || plain.Dynamic != nil || plain.TLS != nil || plain.AgentAuth != nil || plain.PeerDialOptions != nil {
		t.Errorf("plain: %+v", plain)
	}

	// A missing certificate names the way out, as the binary always did.
	bad := Config{REST: &rest.Config{Host: api.URL}, Security: &Security{CertFile: filepath.Join(dir, "none.crt"), KeyFile: files.Key}}
	if err := buildClients(&bad); err == nil || !strings.Contains(err.Error(), "(or --insecure-plaintext for local development)") {
		t.Errorf("missing certificate: %v", err)
	}
	bad = Config{REST: &rest.Config{Host: api.URL}, PeerService: "ns/peers",
		Security: &Security{CertFile: files.Cert, KeyFile: files.Key, CAFile: filepath.Join(dir, "none.crt"), ServerName: "x"}}
	if err := buildClients(&bad); err == nil || !strings.HasPrefix(err.Error(), "peers: ") {
		t.Errorf("missing CA: %v", err)
	}
}
