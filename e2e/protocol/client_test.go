// Package protocol_test runs the agent's stream client (dataplane/client)
// against the control plane's real stream server (controlplane/stream) over
// real sockets: the two halves of the protocol, tested together.
package protocol_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/stream/streamtest"
	"github.com/vsplane/vsplane/dataplane/client"
	"github.com/vsplane/vsplane/internal/grpcserver"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

const wait = 15 * time.Second

// memApplier holds versions in memory; it fails resources listed in fail.
type memApplier struct {
	mu      sync.Mutex
	held    map[string]string
	deltas  []*vsplanev1.Delta
	fail    map[string]bool
	applied chan *vsplanev1.Delta
}

func newMemApplier() *memApplier {
	return &memApplier{held: map[string]string{}, fail: map[string]bool{}, applied: make(chan *vsplanev1.Delta, 100)}
}

func (m *memApplier) Apply(_ context.Context, d *vsplanev1.Delta) *vsplanev1.Ack {
	m.mu.Lock()
	ack := &vsplanev1.Ack{Status: vsplanev1.AckStatus_ACK_STATUS_ACK}
	for _, r := range d.GetResources() {
		if m.fail[r.GetName()] {
			ack.Status = vsplanev1.AckStatus_ACK_STATUS_NACK
			ack.Errors = append(ack.Errors, &vsplanev1.ResourceError{Name: r.GetName(), Version: r.GetVersion(), Message: "injected"})
			continue
		}
		m.held[r.GetName()] = r.GetVersion()
	}
	for _, n := range d.GetRemoved() {
		delete(m.held, n)
	}
	m.deltas = append(m.deltas, d)
	m.mu.Unlock()
	m.applied <- d
	return ack
}

func (m *memApplier) Versions() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.held)
}

func (m *memApplier) next(t *testing.T) *vsplanev1.Delta {
	t.Helper()
	select {
	case d := <-m.applied:
		return d
	case <-time.After(wait):
		t.Fatal("timed out waiting for the applier to get a delta")
	}
	return nil
}

// cp is a control plane on a fixed real TCP address that can be restarted.
type cp struct {
	t        *testing.T
	addr     string
	src      *streamtest.Source
	srv      *stream.Server
	gs       *grpcserver.Server
	connects chan stream.ConnectEvent
}

func startCP(t *testing.T, src *streamtest.Source, addr string) *cp {
	return startCPOpts(t, src, addr, stream.Options{})
}

func startCPOpts(t *testing.T, src *streamtest.Source, addr string, opts stream.Options) *cp {
	t.Helper()
	c := &cp{t: t, src: src, connects: make(chan stream.ConnectEvent, 100)}
	c.srv = stream.NewServer(src, stream.Options{Logger: zaptest.NewLogger(t), Ready: opts.Ready,
		Hooks: stream.Hooks{OnConnect: func(ev stream.ConnectEvent) {
			select { // hooks must never block
			case c.connects <- ev:
			default:
				t.Errorf("connect event dropped: %+v", ev)
			}
		}}})
	var err error
	c.gs, err = grpcserver.New(grpcserver.Options{Logger: zaptest.NewLogger(t)}, func(r grpc.ServiceRegistrar) {
		vsplanev1.RegisterAgentServiceServer(r, c.srv)
	})
	if err != nil {
		t.Fatal(err)
	}
	lis := listen(t, addr)
	c.addr = lis.Addr().String()
	go func() { _ = c.gs.Serve(lis) }()
	t.Cleanup(func() { c.srv.Shutdown(); c.gs.Stop(time.Second) })
	return c
}

// listen listens on addr, retrying for a while: a restarted server's old
// listener may take a moment to free its port.
func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		lis, err := net.Listen("tcp", addr)
		if err == nil {
			return lis
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *cp) connect(t *testing.T) stream.ConnectEvent {
	t.Helper()
	select {
	case ev := <-c.connects:
		return ev
	case <-time.After(wait):
		t.Fatal("timed out waiting for the agent to connect")
	}
	return stream.ConnectEvent{}
}

func runClient(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	cfg.Logger = zaptest.NewLogger(t)
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Error("Run did not return after cancel")
		}
	})
	return c
}

func TestClientAppliesAndReconnectsAfterServerRestart(t *testing.T) {
	src := streamtest.New()
	src.Set("n1", "node/settings", "s1", time.Time{})
	src.Set("n1", "service/default/a", "a1", time.Time{})
	c1 := startCP(t, src, "127.0.0.1:0")
	app := newMemApplier()
	runClient(t, client.Config{
		Targets: []string{c1.addr}, NodeName: "n1", AgentVersion: "v-test", Applier: app,
		Capabilities: func() *vsplanev1.Capabilities { return &vsplanev1.Capabilities{Ipv6: true} },
		BackoffBase:  20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
	})
	if ev := c1.connect(t); ev.Node != "n1" || ev.AgentVersion != "v-test" || ev.HeldResources != 0 {
		t.Fatalf("first connect = %+v", ev)
	}
	if d := app.next(t); len(d.GetResources()) != 2 {
		t.Fatalf("initial delta = %v", d)
	}
	waitFor(t, func() bool {
		info, ok := c1.srv.Registry().Agent("n1")
		return ok && info.GetPendingResources() == 0 && info.GetCapabilities().GetIpv6()
	})

	// Restart the control plane on the same address; change one resource while down.
	c1.srv.Shutdown()
	c1.gs.Stop(time.Second)
	src.Set("n1", "service/default/a", "a2", time.Time{})
	c2 := startCP(t, src, c1.addr)
	if ev := c2.connect(t); ev.HeldResources != 2 {
		t.Fatalf("reconnect Hello carried %d versions, want 2", ev.HeldResources)
	}
	d := app.next(t)
	if len(d.GetResources()) != 1 || d.GetResources()[0].GetVersion() != "a2" || len(d.GetRemoved()) != 0 {
		t.Fatalf("delta after reconnect = %v, want only service/default/a@a2", d)
	}
	waitFor(t, func() bool {
		info, ok := c2.srv.Registry().Agent("n1")
		return ok && info.GetAcknowledgedVersions()["service/default/a"] == "a2"
	})
	// Fail-static: while the control plane was down nothing was applied.
	app.mu.Lock()
	n := len(app.deltas)
	app.mu.Unlock()
	if n != 2 {
		t.Fatalf("applier saw %d deltas, want 2 (initial + after reconnect)", n)
	}
}

func TestClientNackIsNotResent(t *testing.T) {
	src := streamtest.New()
	src.Set("n1", "service/default/bad", "x1", time.Time{})
	c := startCP(t, src, "127.0.0.1:0")
	app := newMemApplier()
	app.fail["service/default/bad"] = true
	runClient(t, client.Config{Targets: []string{c.addr}, NodeName: "n1", Applier: app})
	app.next(t)
	waitFor(t, func() bool {
		info, ok := c.srv.Registry().Agent("n1")
		return ok && info.GetNacks() == 1
	})
	src.Set("n1", "service/default/good", "g1", time.Time{})
	d := app.next(t)
	if len(d.GetResources()) != 1 || d.GetResources()[0].GetName() != "service/default/good" {
		t.Fatalf("delta = %v, want only service/default/good", d)
	}
}

func TestClientConfigValidation(t *testing.T) {
	app := newMemApplier()
	for _, cfg := range []client.Config{
		{NodeName: "n", Applier: app},
		{Targets: []string{"x:1"}, Applier: app},
		{Targets: []string{"x:1"}, NodeName: "n"},
		{Targets: []string{"x:1"}, NodeName: "n", Applier: app, BackoffBase: time.Second, BackoffMax: time.Millisecond},
	} {
		if _, err := client.New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded, want error", cfg)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClientReceivesDeltaLargerThanGRPCDefault: a first Delta over gRPC's
// default 4 MiB limit (here ~16 MiB) still arrives, and the Hello after a
// reconnect carries all those versions (server receive limit).
func TestClientReceivesDeltaLargerThanGRPCDefault(t *testing.T) {
	src := streamtest.New()
	long := strings.Repeat("v", 8192)
	for i := range 2000 {
		name := fmt.Sprintf("service/default/s%04d", i)
		src.SetResource("n1", &vsplanev1.Resource{Name: name, Version: fmt.Sprintf("v%d", i),
			Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{DefaultScheduler: long}}}, time.Time{})
	}
	c := startCP(t, src, "127.0.0.1:0")
	app := newMemApplier()
	runClient(t, client.Config{Targets: []string{c.addr}, NodeName: "n1", Applier: app,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	c.connect(t)
	if d := app.next(t); len(d.GetResources()) != 2000 {
		t.Fatalf("got %d resources, want 2000", len(d.GetResources()))
	}
	waitFor(t, func() bool {
		info, ok := c.srv.Registry().Agent("n1")
		return ok && info.GetPendingResources() == 0
	})
	c.srv.Shutdown()
	c.gs.Stop(time.Second)
	c2 := startCP(t, src, c.addr)
	if ev := c2.connect(t); ev.HeldResources != 2000 {
		t.Fatalf("Hello after reconnect carried %d versions, want 2000", ev.HeldResources)
	}
	if d := app.next(t); len(d.GetResources()) != 0 {
		t.Fatalf("resume delta has %d resources, want 0", len(d.GetResources()))
	}
}

func TestClientSendsStatusNowAndAfterReconnect(t *testing.T) {
	src := streamtest.New()
	src.Set("n1", "node/settings", "s1", time.Time{})
	c := startCP(t, src, "127.0.0.1:0")
	app := newMemApplier()
	cl := runClient(t, client.Config{Targets: []string{c.addr}, NodeName: "n1", Applier: app,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	c.connect(t)
	waitFor(t, cl.Connected)
	cl.SetStatus(&vsplanev1.AgentStatus{DriftRepaired: 7})
	waitFor(t, func() bool { return c.srv.Registry().LastStatus("n1").GetDriftRepaired() == 7 })

	c.srv.Shutdown()
	c.gs.Stop(time.Second)
	c2 := startCP(t, src, c.addr)
	c2.connect(t)
	waitFor(t, func() bool { return c2.srv.Registry().LastStatus("n1").GetDriftRepaired() == 7 })
}

// A replica that holds the stream (still computing its first full state)
// is left after FirstDeltaTimeout for another one, which serves the agent.
func TestClientLeavesAReplicaThatSendsNoFirstDelta(t *testing.T) {
	src := streamtest.New()
	src.Set("n1", "node/settings", "s1", time.Time{})
	starting := startCPOpts(t, src, "127.0.0.1:0", stream.Options{Ready: make(chan struct{})}) // never ready
	ready := startCP(t, src, "127.0.0.1:0")
	app := newMemApplier()
	var ends []error
	var mu sync.Mutex
	runClient(t, client.Config{Targets: []string{starting.addr, ready.addr}, NodeName: "n1", Applier: app,
		FirstDeltaTimeout: 200 * time.Millisecond, BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		OnStreamEnd: func(err error) { mu.Lock(); ends = append(ends, err); mu.Unlock() }})
	if d := app.next(t); len(d.GetResources()) != 1 {
		t.Fatalf("delta %v", d)
	}
	if _, ok := ready.srv.Registry().Agent("n1"); !ok {
		t.Fatal("the agent is not served by the ready replica")
	}
	mu.Lock()
	defer mu.Unlock()
	// The client starts at a random target: it either went to the ready
	// one at once, or left the starting one with a clear reason.
	for _, err := range ends {
		if !strings.Contains(err.Error(), "no first Delta") {
			t.Errorf("stream ended with %v", err)
		}
	}
}

// A first Delta removing most of the node's Services is held, reported
// and not applied; the client asks again after the confirmation period and
// applies only what the control plane then says.
func TestClientHoldsMassRemovalUntilConfirmed(t *testing.T) {
	for _, confirmed := range []bool{false, true} {
		t.Run(fmt.Sprintf("confirmed=%v", confirmed), func(t *testing.T) {
			src := streamtest.New()
			app := newMemApplier()
			for i := range 10 {
				name := fmt.Sprintf("service/default/s%d", i)
				app.held[name] = "v1"
				if i < 2 {
					src.Set("n1", name, "v1", time.Time{})
				}
			}
			c := startCP(t, src, "127.0.0.1:0")
			held := make(chan *vsplanev1.HeldRemoval, 10)
			runClient(t, client.Config{Targets: []string{c.addr}, NodeName: "n1", Applier: app,
				RemovalConfirmation: time.Second, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
				OnRemovalHeld: func(h *vsplanev1.HeldRemoval) { held <- h }})
			var h *vsplanev1.HeldRemoval
			select {
			case h = <-held:
			case <-time.After(wait):
				t.Fatal("no hold reported")
			}
			if h.GetRemovals() != 8 || h.GetHeldServices() != 10 {
				t.Fatalf("hold %v, want 8 of 10", h)
			}
			if !confirmed {
				// The control plane recovers meanwhile (a replica finished
				// its initial sync): nothing is removed.
				for i := 2; i < 10; i++ {
					src.Set("n1", fmt.Sprintf("service/default/s%d", i), "v1", time.Time{})
				}
			}
			d := app.next(t)
			if confirmed && len(d.GetRemoved()) != 8 {
				t.Fatalf("confirmed removal: delta removes %v, want 8", d.GetRemoved())
			}
			if !confirmed && len(d.GetRemoved()) != 0 {
				t.Fatalf("unconfirmed removal applied: %v", d.GetRemoved())
			}
			select {
			case h := <-held:
				if h != nil {
					t.Fatalf("hold not cleared: %v", h)
				}
			case <-time.After(wait):
				t.Fatal("hold not reported cleared")
			}
			app.mu.Lock()
			defer app.mu.Unlock()
			if len(app.deltas) != 1 {
				t.Fatalf("applier saw %d deltas, want 1 (the held one was never applied)", len(app.deltas))
			}
		})
	}
}
