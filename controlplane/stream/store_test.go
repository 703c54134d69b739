package stream_test

import (
	"net"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/internal/grpcserver"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestWithRealSnapshotStore runs the protocol against *snapshot.Store (via
// Adapt) over a real socket: initial state, resume with zero resources,
// only the changed Service after an update, and resume by system version.
func TestWithRealSnapshotStore(t *testing.T) {
	st := snapshot.NewStore()
	settings, err := snapshot.NewNodeSettingsResource(&vsplanev1.NodeSettings{DefaultScheduler: "rr"})
	if err != nil {
		t.Fatal(err)
	}
	svc := func(ns, name string, port uint32) *vsplanev1.Resource {
		r, err := snapshot.NewServiceResource(&vsplanev1.ServiceState{Namespace: ns, Name: name,
			VirtualServers: []*vsplanev1.VirtualServer{{Address: "198.18.0.10", Port: port}}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var b snapshot.Batch
	b.StageNode("n1", time.Time{})
	b.PublishNode("n1")
	b.Set("n1", settings, time.Time{})
	b.Set("n1", svc("default", "a", 80), time.Now())
	b.Set("n1", svc("default", "b", 80), time.Now())
	st.Commit(&b)

	srv := stream.NewServer(st, stream.Options{Logger: zaptest.NewLogger(t)})
	gs, err := grpcserver.New(grpcserver.Options{Logger: zaptest.NewLogger(t)}, func(r grpc.ServiceRegistrar) {
		vsplanev1.RegisterAgentServiceServer(r, srv)
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { srv.Shutdown(); gs.Stop(time.Second) })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e := &env{t: t, conn: conn}

	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	held := map[string]string{}
	for _, r := range d.GetResources() {
		held[r.GetName()] = r.GetVersion()
	}
	if len(held) != 3 || d.GetSystemVersion() == "" || len(d.GetTriggerTimes()) != 2 {
		t.Fatalf("initial delta = %v", d)
	}
	a.ack(d.GetNonce())
	a.cancel()

	// Resume with everything held: zero resources.
	a = e.open()
	a.hello("n1", held)
	d = a.delta()
	expectDelta(t, d, nil, nil)
	a.ack(d.GetNonce())

	// Change one Service: only it is sent.
	b.Reset()
	nb := svc("default", "b", 81)
	b.Set("n1", nb, time.Now())
	st.Commit(&b)
	d = a.delta()
	expectDelta(t, d, []string{"service/default/b@" + nb.GetVersion()}, nil)
	a.ack(d.GetNonce())
	held["service/default/b"] = nb.GetVersion()
	if want := wire.SystemVersion(held); d.GetSystemVersion() != want {
		t.Fatalf("the store's system version is %s; the agent computes %s for the same versions", d.GetSystemVersion(), want)
	}
	a.cancel()

	// Resume by system version: the store's is the agent's, so nothing is
	// sent and nothing is asked.
	a = e.open()
	a.helloBySystemVersion("n1", held)
	d = a.delta()
	expectDelta(t, d, nil, nil)
}
