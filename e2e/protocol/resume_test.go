package protocol_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/vsplane/vsplane/controlplane/stream/streamtest"
	"github.com/vsplane/vsplane/dataplane/client"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// A client's first stream lists every version; once a control plane
// announced resumption by system version, a reconnect sends only that, and
// a control plane in the same state sends an empty first Delta.
func TestClientResumesBySystemVersion(t *testing.T) {
	src := streamtest.New()
	src.Set("n1", "node/settings", "s1", time.Time{})
	src.Set("n1", "service/default/a", "a1", time.Time{})
	c1 := startCP(t, src, "127.0.0.1:0")
	app := newMemApplier()
	runClient(t, client.Config{Targets: []string{c1.addr}, NodeName: "n1", Applier: app,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if ev := c1.connect(t); ev.HeldSystemVersion != "" {
		t.Fatalf("a client's first Hello resumed by system version: %+v", ev)
	}
	if d := app.next(t); len(d.GetResources()) != 2 {
		t.Fatalf("initial delta = %v", d)
	}
	waitFor(t, func() bool {
		info, ok := c1.srv.Registry().Agent("n1")
		return ok && len(info.GetAcknowledgedVersions()) == 2
	})

	c1.srv.Shutdown()
	c1.gs.Stop(time.Second)
	c2 := startCP(t, src, c1.addr)
	ev := c2.connect(t)
	if ev.HeldSystemVersion == "" || ev.HeldResources != 2 {
		t.Fatalf("reconnect Hello = %+v, want a system version for 2 resources", ev)
	}
	if d := app.next(t); len(d.GetResources()) != 0 || len(d.GetRemoved()) != 0 {
		t.Fatalf("first Delta after resuming in sync = %v, want empty", d)
	}
	waitFor(t, func() bool {
		info, ok := c2.srv.Registry().Agent("n1")
		return ok && len(info.GetAcknowledgedVersions()) == 2 && info.GetPendingResources() == 0
	})
	// A later change is sent as a difference from what the agent holds.
	src.Set("n1", "service/default/a", "a2", time.Time{})
	if d := app.next(t); len(d.GetResources()) != 1 || d.GetResources()[0].GetVersion() != "a2" {
		t.Fatalf("delta after a change = %v, want only service/default/a@a2", d)
	}
}

// oldControlPlane answers like a control plane from before resumption by
// system version: no announcement, and a Hello without versions taken as
// "holds nothing" (everything sent, nothing removed).
type oldControlPlane struct {
	vsplanev1.UnimplementedAgentServiceServer
	hellos  chan *vsplanev1.Hello
	streams atomic.Int64
}

func (o *oldControlPlane) Connect(st vsplanev1.AgentService_ConnectServer) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	o.hellos <- m.GetHello()
	n := o.streams.Add(1)
	r := streamtest.Resource("node/settings", "s-old")
	if err := st.Send(&vsplanev1.ConnectResponse{Message: &vsplanev1.ConnectResponse_Delta{Delta: &vsplanev1.Delta{
		Nonce: "old-" + strconv.FormatInt(n, 10), Resources: []*vsplanev1.Resource{r}}}}); err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err != nil {
			return nil
		}
	}
}

// A client that learned resumption from one control plane and reaches an
// older one applies nothing from the stream where it sent only a system
// version, and lists every version on the next.
func TestClientListsVersionsToAnOlderControlPlane(t *testing.T) {
	src := streamtest.New()
	src.Set("n1", "node/settings", "s1", time.Time{})
	src.Set("n1", "service/default/gone", "g1", time.Time{})
	c1 := startCP(t, src, "127.0.0.1:0")
	app := newMemApplier()
	runClient(t, client.Config{Targets: []string{c1.addr}, NodeName: "n1", Applier: app,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	c1.connect(t)
	app.next(t)
	waitFor(t, func() bool {
		info, ok := c1.srv.Registry().Agent("n1")
		return ok && len(info.GetAcknowledgedVersions()) == 2
	})
	c1.srv.Shutdown()
	c1.gs.Stop(time.Second)

	old := &oldControlPlane{hellos: make(chan *vsplanev1.Hello, 10)}
	gs := grpc.NewServer()
	vsplanev1.RegisterAgentServiceServer(gs, old)
	lis := listen(t, c1.addr)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	hello := func() *vsplanev1.Hello {
		t.Helper()
		select {
		case h := <-old.hellos:
			return h
		case <-time.After(wait):
			t.Fatal("no Hello at the older control plane")
		}
		return nil
	}
	if h := hello(); h.GetHeldSystemVersion() == "" || len(h.GetResourceVersions()) != 0 {
		t.Fatalf("first Hello to the older control plane = %v, want only a system version", h)
	}
	if h := hello(); h.GetHeldSystemVersion() != "" || len(h.GetResourceVersions()) != 2 {
		t.Fatalf("second Hello = %v, want every held version", h)
	}
	// The Delta of the stream that sent only a system version was never
	// applied: the first one applied is the second stream's.
	if d := app.next(t); d.GetNonce() != "old-2" {
		t.Fatalf("applied Delta %q, want old-2 (old-1 answered a Hello the older control plane misread)", d.GetNonce())
	}
}

// An agent process restarted with its saved state (a new client whose
// Applier already holds versions) sends only their system version in its
// first Hello: in sync with the node's desired state it gets an empty
// first Delta; with a state the control plane does not recognise it is
// asked for every version and gets the difference. A restarted fleet then
// uploads a digest per node, not every version (#27 item 4).
func TestRestartedClientResumesBySystemVersion(t *testing.T) {
	src := streamtest.New()
	src.Set("n1", "node/settings", "s1", time.Time{})
	src.Set("n1", "service/default/a", "a1", time.Time{})
	c1 := startCP(t, src, "127.0.0.1:0")

	inSync := newMemApplier()
	inSync.held = map[string]string{"node/settings": "s1", "service/default/a": "a1"}
	runClient(t, client.Config{Targets: []string{c1.addr}, NodeName: "n1", Applier: inSync,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if ev := c1.connect(t); ev.HeldSystemVersion == "" || ev.HeldResources != 2 {
		t.Fatalf("restarted client's first Hello = %+v, want a system version for 2 resources", ev)
	}
	if d := inSync.next(t); len(d.GetResources()) != 0 || len(d.GetRemoved()) != 0 {
		t.Fatalf("first Delta to a restarted client in sync = %v, want empty", d)
	}

	src.Set("n2", "node/settings", "s1", time.Time{})
	src.Set("n2", "service/default/a", "a2", time.Time{})
	stale := newMemApplier()
	stale.held = map[string]string{"node/settings": "s1", "service/default/a": "a1", "service/default/gone": "g1"}
	runClient(t, client.Config{Targets: []string{c1.addr}, NodeName: "n2", Applier: stale,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if ev := c1.connect(t); ev.HeldSystemVersion == "" || ev.HeldResources != 3 {
		t.Fatalf("stale client's first Hello = %+v, want a system version for 3 resources", ev)
	}
	d := stale.next(t)
	if len(d.GetResources()) != 1 || d.GetResources()[0].GetVersion() != "a2" ||
		len(d.GetRemoved()) != 1 || d.GetRemoved()[0] != "service/default/gone" {
		t.Fatalf("first Delta to a stale restarted client = %v, want service/default/a@a2 and the removal of service/default/gone", d)
	}
}
