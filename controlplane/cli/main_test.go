package cli_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/vsplane/vsplane/controlplane/cli"
	"github.com/vsplane/vsplane/internal/testpki"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// inspector answers for node-a (in sync) and node-b (one resource behind)
// to the token "good" only.
type inspector struct {
	vsplanev1.UnimplementedInspectServiceServer
}

func (inspector) ListAgents(context.Context, *vsplanev1.ListAgentsRequest) (*vsplanev1.ListAgentsResponse, error) {
	return &vsplanev1.ListAgentsResponse{Agents: []*vsplanev1.AgentInfo{
		{NodeName: "node-a", Replica: "r1"}, {NodeName: "node-b", Replica: "r1", PendingResources: 1},
	}}, nil
}

func (inspector) GetNodeStatus(_ context.Context, r *vsplanev1.GetNodeStatusRequest) (*vsplanev1.GetNodeStatusResponse, error) {
	// The AgentInfo of GetNodeStatus is whole: node-b's NACK shows.
	var agent *vsplanev1.AgentInfo
	if r.GetNodeName() == "node-b" {
		agent = &vsplanev1.AgentInfo{NodeName: "node-b", Replica: "r1", PendingResources: 1, Nacked: map[string]string{"svc/default/web": "v1: no mh"}}
	}
	return &vsplanev1.GetNodeStatusResponse{NodeName: r.GetNodeName(), Agent: agent, Status: &vsplanev1.AgentStatus{}}, nil
}

func (inspector) GetNodeSnapshot(_ context.Context, r *vsplanev1.GetNodeSnapshotRequest) (*vsplanev1.GetNodeSnapshotResponse, error) {
	if r.GetNodeName() != "node-a" {
		return nil, status.Errorf(codes.NotFound, "node %q is not known", r.GetNodeName())
	}
	return &vsplanev1.GetNodeSnapshotResponse{NodeName: "node-a", SystemVersion: "1"}, nil
}

func serve(t *testing.T) (addr, caFile string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := testpki.NewCA("cli")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer good" {
				return nil, status.Errorf(codes.Unauthenticated, "bad token %v", got)
			}
			return h(ctx, req)
		}))
	vsplanev1.RegisterInspectServiceServer(srv, inspector{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), files.CA
}

// Main end to end with --token, --certificate-authority and --address (no
// kubeconfig read): output and exit codes.
func TestMainExitCodes(t *testing.T) {
	addr, caFile := serve(t)
	other, err := testpki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	otherFiles, err := other.WriteServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	conn := []string{"--address", addr, "--kubeconfig", filepath.Join(t.TempDir(), "absent")}
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"status", "--token", "good", "--certificate-authority", caFile}, cli.ExitNotInSync, "node-b  r1       NACKED 1", ""},
		{[]string{"snapshot", "node-a", "--token", "good", "--certificate-authority", caFile, "-o", "yaml"}, cli.ExitOK, "nodeName: node-a", ""},
		{[]string{"snapshot", "node-z", "--token", "good", "--certificate-authority", caFile}, cli.ExitNotFound, "", `node "node-z" is not known`},
		{[]string{"rollout", "status", "x", "--token", "good", "--certificate-authority", caFile}, cli.ExitError, "", "Unimplemented"},
		{[]string{"status", "--token", "bad", "--certificate-authority", caFile}, cli.ExitDenied, "", "bad token"},
		{[]string{"status", "--token", "good", "--certificate-authority", otherFiles.CA}, cli.ExitError, "", "certificate signed by unknown authority"},
		{[]string{"status", "--token", "good", "--certificate-authority", caFile, "--tls-server-name", "elsewhere.example"}, cli.ExitError, "", "elsewhere.example"},
		// No token given and no kubeconfig to take one from.
		{[]string{"status", "--certificate-authority", caFile}, cli.ExitError, "", "kubeconfig"},
	} {
		var out, errOut bytes.Buffer
		code := cli.Main(context.Background(), append(tc.args, conn...), &out, &errOut)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errOut.String(), tc.stderr) {
			t.Errorf("%q: exit %d, want %d (stdout %q, stderr %q)\nstdout:\n%s\nstderr:\n%s", tc.args, code, tc.code, tc.stdout, tc.stderr, out.String(), errOut.String())
		}
	}
}
