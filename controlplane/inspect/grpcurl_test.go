package inspect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// grpcurlPath finds grpcurl: $VSPLANE_GRPCURL, else <repo>/bin/grpcurl
// (installed by `make tools`). Missing is a failure, not a skip: this is the
// real-client check of reflection.
func grpcurlPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("VSPLANE_GRPCURL"); p != "" {
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "bin", "grpcurl")
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("grpcurl not found at %s (run `make tools` or set VSPLANE_GRPCURL): %v", p, err)
			}
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("repository root (go.mod) not found")
		}
		dir = parent
	}
}

func grpcurl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, grpcurlPath(t), args...).CombinedOutput()
	return string(out), err
}

func TestGrpcurlListDescribeAndCall(t *testing.T) {
	e := newEnv(t)
	e.src.Set("n1", "node/settings", "s1", time.Time{})

	out, err := grpcurl(t, "-plaintext", e.addr, "list")
	if err != nil {
		t.Fatalf("grpcurl list: %v\n%s", err, out)
	}
	for _, want := range []string{"vsplane.v1.AgentService", "vsplane.v1.InspectService", "grpc.health.v1.Health"} {
		if !strings.Contains(out, want) {
			t.Errorf("grpcurl list output lacks %s:\n%s", want, out)
		}
	}

	out, err = grpcurl(t, "-plaintext", e.addr, "describe", "vsplane.v1.InspectService")
	if err != nil || !strings.Contains(out, "rpc GetNodeSnapshot") {
		t.Fatalf("grpcurl describe: %v\n%s", err, out)
	}

	out, err = grpcurl(t, "-plaintext", "-d", `{"node_name":"n1"}`, e.addr, "vsplane.v1.InspectService/GetNodeSnapshot")
	if err != nil {
		t.Fatalf("grpcurl GetNodeSnapshot: %v\n%s", err, out)
	}
	var resp struct {
		NodeName  string `json:"nodeName"`
		Resources []struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if resp.NodeName != "n1" || len(resp.Resources) != 1 || resp.Resources[0].Name != "node/settings" {
		t.Fatalf("GetNodeSnapshot via grpcurl = %+v", resp)
	}

	out, err = grpcurl(t, "-plaintext", "-d", `{"node_name":"nope"}`, e.addr, "vsplane.v1.InspectService/GetNodeSnapshot")
	if err == nil || !strings.Contains(out, "NotFound") {
		t.Fatalf("unknown node via grpcurl: err=%v\n%s", err, out)
	}
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestGrpcurlStatusExplainWatch(t *testing.T) {
	e, store := storeEnv(t)
	a := connectAgent(t, e, "n1")
	a.ack(a.recv())
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Status{Status: &vsplanev1.AgentStatus{
		DriftRepaired: 1,
		Draining: []*vsplanev1.DrainingRealServer{{VirtualServer: "TCP/198.18.0.10:80", Address: "198.19.1.6", Port: 8080,
			ActiveConnections: 2}},
	}}})
	await(t, "status reported", func() bool {
		return e.srv.Registry().LastStatus("n1") != nil
	})

	out, err := grpcurl(t, "-plaintext", e.addr, "describe", "vsplane.v1.InspectService")
	if err != nil {
		t.Fatalf("grpcurl describe: %v\n%s", err, out)
	}
	for _, want := range []string{"rpc GetNodeStatus", "rpc ExplainService", "rpc WatchDeltas", "returns ( stream .vsplane.v1.WatchDeltasResponse )"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks %q:\n%s", want, out)
		}
	}

	out, err = grpcurl(t, "-plaintext", "-d", `{"node_name":"n1"}`, e.addr, "vsplane.v1.InspectService/GetNodeStatus")
	if err != nil {
		t.Fatalf("grpcurl GetNodeStatus: %v\n%s", err, out)
	}
	var ns struct {
		Agent struct {
			NodeName string `json:"nodeName"`
		} `json:"agent"`
		Status struct {
			DriftRepaired int `json:"driftRepaired"`
			Draining      []struct {
				Address           string `json:"address"`
				ActiveConnections int    `json:"activeConnections"`
			} `json:"draining"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &ns); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if ns.Agent.NodeName != "n1" || ns.Status.DriftRepaired != 1 || len(ns.Status.Draining) != 1 ||
		ns.Status.Draining[0].Address != "198.19.1.6" || ns.Status.Draining[0].ActiveConnections != 2 {
		t.Fatalf("GetNodeStatus via grpcurl = %+v\n%s", ns, out)
	}

	out, err = grpcurl(t, "-plaintext", "-d", `{"node_name":"n1","namespace":"default","name":"web"}`, e.addr,
		"vsplane.v1.InspectService/ExplainService")
	if err != nil {
		t.Fatalf("grpcurl ExplainService: %v\n%s", err, out)
	}
	for _, want := range []string{`"acknowledgement": "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED"`, `"reason": "ready"`, `"reject": true`} {
		if !strings.Contains(out, want) {
			t.Errorf("ExplainService via grpcurl lacks %s:\n%s", want, out)
		}
	}

	for _, c := range []struct{ method, data, code string }{
		{"GetNodeStatus", `{"node_name":"nope"}`, "NotFound"},
		{"GetNodeStatus", `{}`, "InvalidArgument"},
		{"ExplainService", `{"node_name":"n1","namespace":"default","name":"nope"}`, "NotFound"},
		{"ExplainService", `{"node_name":"n1"}`, "InvalidArgument"},
		{"WatchDeltas", `{"node_name":"nope"}`, "NotFound"},
	} {
		out, err = grpcurl(t, "-plaintext", "-d", c.data, e.addr, "vsplane.v1.InspectService/"+c.method)
		if err == nil || !strings.Contains(out, c.code) {
			t.Errorf("%s %s via grpcurl: err=%v, want %s\n%s", c.method, c.data, err, c.code, out)
		}
	}

	// WatchDeltas: grpcurl keeps streaming until killed.
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wout syncBuffer
	cmd := exec.CommandContext(wctx, grpcurlPath(t), "-plaintext", "-d", `{"node_name":"n1"}`, e.addr,
		"vsplane.v1.InspectService/WatchDeltas")
	cmd.Stdout, cmd.Stderr = &wout, &wout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { cancel(); <-done }()
	await(t, "grpcurl watching n1", func() bool { return e.feed.Watchers("n1") == 1 })
	setWeb(t, store, "zone hint")
	d := a.recv()
	await(t, "grpcurl printing the delta", func() bool {
		s := wout.String()
		return strings.Contains(s, `"nonce": "`+d.GetNonce()+`"`) && strings.Contains(s, `"reason": "zone hint"`)
	})
	// Killing the client ends the server-side watch (deferred Wait reaps it).
	cancel()
	await(t, "watch ended", func() bool { return e.feed.Watchers("n1") == 0 })
}
