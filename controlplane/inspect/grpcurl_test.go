package inspect_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
