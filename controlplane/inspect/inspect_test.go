package inspect_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/vsplane/vsplane/controlplane/inspect"
	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/stream/streamtest"
	"github.com/vsplane/vsplane/internal/grpcserver"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

type env struct {
	addr string
	src  *streamtest.Source
	srv  *stream.Server
	conn *grpc.ClientConn
	reg  *prometheus.Registry
	feed *inspect.Feed
	// problems is what the fake engine reports, by Service.
	problems fakeProblems
}

type fakeProblems map[model.ServiceKey][]model.Problem

func (f fakeProblems) Problems(k model.ServiceKey) []model.Problem { return f[k] }

// newEnv serves the agent and inspection services as the control plane does
// (grpcserver.New) on a real 127.0.0.1 socket.
func newEnv(t *testing.T) *env {
	t.Helper()
	src := streamtest.New()
	e := newEnvWith(t, src, src)
	e.src = src
	return e
}

// newEnvWith is newEnv over any source; snaps must be the same state as src.
func newEnvWith(t *testing.T, src stream.Source, snaps inspect.Snapshots) *env {
	t.Helper()
	e := &env{reg: prometheus.NewRegistry(), problems: fakeProblems{}}
	e.feed = inspect.NewFeed(4)
	e.srv = stream.NewServer(src, stream.Options{Logger: zaptest.NewLogger(t), Hooks: e.feed.Hooks(stream.Hooks{})})
	gs, err := grpcserver.New(grpcserver.Options{Logger: zaptest.NewLogger(t), Registerer: e.reg},
		func(r grpc.ServiceRegistrar) {
			vsplanev1.RegisterAgentServiceServer(r, e.srv)
			vsplanev1.RegisterInspectServiceServer(r, inspect.NewServer(inspect.Config{
				Agents: e.srv.Registry(), Snapshots: snaps, Problems: e.problems, Feed: e.feed}))
		})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { e.srv.Shutdown(); gs.Stop(time.Second) })
	e.conn, err = grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.conn.Close() })
	return e
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestGetNodeSnapshot(t *testing.T) {
	e := newEnv(t)
	e.src.Set("n1", "service/default/b", "b1", time.Time{})
	e.src.Set("n1", "node/settings", "s1", time.Time{})
	c := vsplanev1.NewInspectServiceClient(e.conn)

	resp, err := c.GetNodeSnapshot(ctx(t), &vsplanev1.GetNodeSnapshotRequest{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range resp.GetResources() {
		names = append(names, r.GetName()+"@"+r.GetVersion())
	}
	if resp.GetNodeName() != "n1" || resp.GetSystemVersion() == "" ||
		!slices.Equal(names, []string{"node/settings@s1", "service/default/b@b1"}) {
		t.Fatalf("snapshot = %v", resp)
	}

	_, err = c.GetNodeSnapshot(ctx(t), &vsplanev1.GetNodeSnapshotRequest{NodeName: "nope"})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown node: %v, want NotFound naming the node", err)
	}
	_, err = c.GetNodeSnapshot(ctx(t), &vsplanev1.GetNodeSnapshotRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("empty node: %v, want InvalidArgument", err)
	}
}

func TestListAgents(t *testing.T) {
	e := newEnv(t)
	e.src.Set("n1", "node/settings", "s1", time.Time{})
	c := vsplanev1.NewInspectServiceClient(e.conn)
	resp, err := c.ListAgents(ctx(t), &vsplanev1.ListAgentsRequest{})
	if err != nil || len(resp.GetAgents()) != 0 {
		t.Fatalf("ListAgents before any agent = %v, %v", resp, err)
	}

	st, err := vsplanev1.NewAgentServiceClient(e.conn).Connect(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{
		NodeName: "n1", AgentVersion: "v9"}}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Ack{Ack: &vsplanev1.Ack{
		Nonce: m.GetDelta().GetNonce(), Status: vsplanev1.AckStatus_ACK_STATUS_ACK}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err = c.ListAgents(ctx(t), &vsplanev1.ListAgentsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetAgents()) == 1 && resp.GetAgents()[0].GetLastAck() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ListAgents never showed the acked agent: %v", resp)
		}
		time.Sleep(5 * time.Millisecond)
	}
	a := resp.GetAgents()[0]
	if a.GetNodeName() != "n1" || a.GetAgentVersion() != "v9" || a.GetPendingResources() != 0 ||
		a.GetAcknowledgedVersions()["node/settings"] != "s1" {
		t.Fatalf("agent = %v", a)
	}
}

// TestReflectionHealthAndMetrics checks what grpcurl relies on: reflection
// lists every service and resolves their descriptors (`list`, `describe`).
func TestReflectionHealthAndMetrics(t *testing.T) {
	e := newEnv(t)
	rc, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := rc.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := rc.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{"vsplane.v1.AgentService", "vsplane.v1.InspectService", "grpc.health.v1.Health",
		"grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(services, want) {
			t.Errorf("reflection list = %v, missing %s", services, want)
		}
	}
	resp = ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "vsplane.v1.InspectService"}})
	fds := resp.GetFileDescriptorResponse().GetFileDescriptorProto()
	if len(fds) == 0 {
		t.Fatalf("describe InspectService: %v", resp)
	}
	fd := &descriptorpb.FileDescriptorProto{}
	if err := proto.Unmarshal(fds[0], fd); err != nil {
		t.Fatal(err)
	}
	if fd.GetName() != "vsplane/v1/inspect.proto" || fd.GetService()[0].GetMethod()[0].GetName() != "ListAgents" {
		t.Fatalf("descriptor = %s / %v", fd.GetName(), fd.GetService())
	}

	h, err := healthpb.NewHealthClient(e.conn).Check(ctx(t), &healthpb.HealthCheckRequest{Service: "vsplane.v1.AgentService"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", h, err)
	}

	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "grpc_server_handled_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "grpc_method" && l.GetValue() == "Check" && m.GetCounter().GetValue() >= 1 {
						found = true
					}
				}
			}
		}
	}
	if !found {
		t.Fatal("grpc_server_handled_total{grpc_method=Check} not counted")
	}
}
