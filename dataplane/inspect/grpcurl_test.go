package inspect

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// grpcurlPath is the repository's pinned grpcurl (make tools).
func grpcurlPath(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "bin", "grpcurl")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("grpcurl not found at %s (%v): run `make tools`", p, err)
	}
	return p
}

// TestGrpcurl runs the real grpcurl against the endpoint on TCP loopback
// and on a Unix socket, the way the README tells users to.
func TestGrpcurl(t *testing.T) {
	bin := grpcurlPath(t)
	mk := memory.New()
	r, err := reconcile.New(mk.Kernel(), reconcile.Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{
		settings(), service("a", "198.18.0.10", 80, "198.19.1.2", "198.19.2.3")}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v", ack.GetErrors())
	}
	if err := mk.SetConnections(vsA, rsA2, 2, 0); err != nil {
		t.Fatal(err)
	}
	if ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "2",
		Resources: []*vsplanev1.Resource{service("a", "198.18.0.10", 80, "198.19.1.2")}}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v", ack.GetErrors())
	}
	k := mk.Kernel()
	s, err := New(r, Readers{IPVS: k.IPVS, Links: k.Links, IPSets: k.IPSets, IPTables: k.IPTables})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "inspect.sock")
	tcpLn, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unixLn, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- Serve(ctx, tcpLn, s, zaptest.NewLogger(t)) }()
	go func() { done <- Serve(ctx, unixLn, s, zaptest.NewLogger(t)) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	})
	mk.ResetCalls()

	run := func(args ...string) string {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		out, err := exec.CommandContext(cctx, bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	addr := tcpLn.Addr().String()
	list := run("-plaintext", addr, "list")
	for _, svc := range []string{"vsplane.v1.AgentInspectService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !strings.Contains(list, svc) {
			t.Errorf("grpcurl list lacks %s:\n%s", svc, list)
		}
	}
	if out := run("-plaintext", addr, "grpc.health.v1.Health/Check"); !strings.Contains(out, "SERVING") {
		t.Errorf("health: %s", out)
	}

	var state struct {
		VirtualServers []struct {
			Key         string `json:"key"`
			Status      string `json:"status"`
			RealServers []struct {
				Address  string `json:"address"`
				Status   string `json:"status"`
				Draining bool   `json:"draining"`
			} `json:"realServers"`
		} `json:"virtualServers"`
		Versions map[string]string `json:"versions"`
	}
	out := run("-plaintext", addr, "vsplane.v1.AgentInspectService/GetKernelState")
	if err := json.Unmarshal([]byte(out), &state); err != nil {
		t.Fatalf("GetKernelState output: %v\n%s", err, out)
	}
	if len(state.VirtualServers) != 1 || state.VirtualServers[0].Key != "tcp/198.18.0.10:80" ||
		state.VirtualServers[0].Status != "ITEM_STATUS_IN_SYNC" || len(state.VirtualServers[0].RealServers) != 2 ||
		!state.VirtualServers[0].RealServers[1].Draining || state.Versions["service/default/a"] == "" {
		t.Fatalf("GetKernelState:\n%s", out)
	}

	var drains struct {
		Draining []struct {
			VirtualServer     string `json:"virtualServer"`
			Address           string `json:"address"`
			ActiveConnections int    `json:"activeConnections"`
		} `json:"draining"`
	}
	out = run("-plaintext", "-unix", sock, "vsplane.v1.AgentInspectService/ListDrains")
	if err := json.Unmarshal([]byte(out), &drains); err != nil {
		t.Fatalf("ListDrains output: %v\n%s", err, out)
	}
	if len(drains.Draining) != 1 || drains.Draining[0].Address != "198.19.2.3" || drains.Draining[0].ActiveConnections != 2 {
		t.Fatalf("ListDrains over the Unix socket:\n%s", out)
	}
	requireNoWrites(t, mk)
}
