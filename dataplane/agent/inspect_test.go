package agent

import (
	"context"
	"net"
	"testing"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestInspectListener checks the wiring: Config.InspectListener serves
// AgentInspectService over the agent's reconciler until Run ends.
func TestInspectListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := memory.New().Kernel()
	ctx, cancel := context.WithCancel(context.Background())
	// No control plane listens there: the client keeps retrying, which is
	// fine; inspection works without a stream.
	a, err := New(ctx, Config{ControlPlane: "127.0.0.1:1", NodeName: "node1", Kernel: &k,
		InspectListener: ln, Logger: zaptest.NewLogger(t)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := vsplanev1.NewAgentInspectServiceClient(conn).GetKernelState(ctx, &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetVirtualServers()) != 0 || resp.GetDifferences() != 0 || len(resp.GetReadErrors()) != 0 {
		t.Fatalf("empty agent: %v", resp)
	}
}
