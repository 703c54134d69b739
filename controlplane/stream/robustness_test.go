package stream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vsplane/vsplane/controlplane/stream"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// A replica that has not computed its first full state holds every stream:
// the agent is registered but gets nothing, not even an empty first Delta,
// until Ready closes.
func TestStreamsWaitForReady(t *testing.T) {
	ready := make(chan struct{})
	e := newEnvOpts(t, false, stream.Options{Ready: ready})
	e.src.Set("n1", "service/default/a", "a1", t0)
	a := e.open()
	a.hello("n1", map[string]string{"service/default/a": "a1", "service/default/b": "b1"})
	waitFor(t, func() bool { return e.srv.Registry().Len() == 1 })
	n := e.src.Lookups("n1")
	select {
	case m := <-a.msgs:
		t.Fatalf("got %v before Ready", m)
	case <-time.After(100 * time.Millisecond):
	}
	if e.src.Lookups("n1") != n {
		t.Fatal("the stream read the desired state before Ready")
	}
	close(ready)
	expectDelta(t, a.delta(), nil, []string{"service/default/b"})
}

// An agent that never acknowledges is disconnected after AckTimeout with a
// status that says so; the close is classified for the metric.
func TestAckTimeoutClosesStream(t *testing.T) {
	closed := make(chan error, 1)
	e := newEnvOpts(t, false, stream.Options{AckTimeout: 150 * time.Millisecond,
		Hooks: stream.Hooks{OnDisconnect: func(_ string, err error) { closed <- err }}})
	e.src.Set("n1", "service/default/a", "a1", t0)
	a := e.open()
	a.hello("n1", nil)
	a.delta() // never acknowledged
	err := a.streamErr()
	if c := statusCode(t, err); c != codes.DeadlineExceeded || !strings.Contains(err.Error(), "no Ack for Delta 1") {
		t.Fatalf("stream ended with %v, want DeadlineExceeded naming the Delta", err)
	}
	if r := stream.ReasonOf(<-closed); r != stream.ReasonAckTimeout {
		t.Fatalf("reason %q, want %q", r, stream.ReasonAckTimeout)
	}
}

// An agent that stops reading blocks only its own sender: its stream is
// still replaced, shut down or timed out promptly, and every other agent
// gets its changes while that one is stuck.
func TestNonReadingAgentDelaysNobody(t *testing.T) {
	ended := make(chan error, 10)
	e := newEnvOpts(t, false, stream.Options{AckTimeout: time.Hour, Hooks: stream.Hooks{
		OnDisconnect: func(node string, err error) {
			if node == "stuck" {
				ended <- err
			}
		}}})
	// The stuck node's state (24 MiB) is far larger than gRPC's largest
	// flow-control window (16 MiB) plus the bufconn buffer, so sending its
	// first Delta blocks.
	big := strings.Repeat("x", 256<<10)
	for i := range 96 {
		e.src.SetResource("stuck", &vsplanev1.Resource{Name: fmt.Sprintf("service/default/s%02d", i), Version: "v1",
			Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{DefaultScheduler: big}}}, t0)
	}
	stuck := e.openRaw() // never reads
	stuck.hello("stuck", nil)
	waitFor(t, func() bool { return e.src.Lookups("stuck") > 0 })

	const others = 20
	agents := make([]*agent, others)
	for i := range others {
		node := fmt.Sprintf("n%02d", i)
		e.src.Set(node, "service/default/a", "a1", t0)
		agents[i] = e.open()
		agents[i].hello(node, nil)
		d := agents[i].delta()
		agents[i].ack(d.GetNonce())
		e.waitAck(d.GetNonce())
	}
	start := time.Now()
	for i := range others {
		e.src.Set(fmt.Sprintf("n%02d", i), "service/default/a", "a2", time.Now())
	}
	var wg sync.WaitGroup
	var slowest time.Duration
	var mu sync.Mutex
	for i := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := agents[i].delta()
			lat := time.Since(start)
			mu.Lock()
			slowest = max(slowest, lat)
			mu.Unlock()
			if up, _ := summary(d); len(up) != 1 || up[0] != "service/default/a@a2" {
				t.Errorf("agent %d got %v", i, up)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d agents got a change %v after it (slowest) while one agent did not read", others, slowest)
	if info, ok := e.srv.Registry().Agent("stuck"); !ok || len(info.GetAcknowledgedVersions()) != 0 {
		t.Fatalf("the non-reading agent must still be connected and have acknowledged nothing: %v %v", info, ok)
	}

	// A new stream for the stuck node replaces it at once although its
	// Send is blocked.
	again := e.openRaw()
	again.hello("stuck", nil)
	waitFor(t, func() bool {
		info, ok := e.srv.Registry().Agent("stuck")
		return ok && info.GetConnectedSince().AsTime().After(start)
	})
	select {
	case err := <-ended:
		if r := stream.ReasonOf(err); r != stream.ReasonReplaced {
			t.Fatalf("stuck stream ended with %v (%s), want replaced", err, r)
		}
	case <-time.After(wait):
		t.Fatal("the stuck stream's handler did not end after it was replaced")
	}
	stuck.cancel()
}

// Streams for nodes that are not in the cluster wait at most
// UnknownNodeTimeout, and at most MaxUnknownNodeStreams of them wait.
func TestUnknownNodeStreamsAreBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	e := newEnvOpts(t, false, stream.Options{UnknownNodeTimeout: 2 * time.Second, MaxUnknownNodeStreams: 1, Clock: clk})
	a := e.open()
	a.hello("ghost-1", nil)
	waitFor(t, func() bool { return e.srv.UnknownNodeStreams() == 1 })
	b := e.open()
	b.hello("ghost-2", nil)
	if err := b.streamErr(); statusCode(t, err) != codes.ResourceExhausted {
		t.Fatalf("second unknown node: %v, want ResourceExhausted", err)
	}
	// The first waits until UnknownNodeTimeout passed on the clock.
	waitFor(t, func() bool { clk.Step(500 * time.Millisecond); return e.srv.UnknownNodeStreams() == 0 })
	err := a.streamErr()
	if c := statusCode(t, err); c != codes.FailedPrecondition || !strings.Contains(err.Error(), "not been in the cluster") {
		t.Fatalf("unknown node: %v, want FailedPrecondition", err)
	}
	// The slot is free again, and a node that appears in time is served.
	c := e.open()
	c.hello("late", nil)
	waitFor(t, func() bool { return e.src.Lookups("late") > 0 })
	e.src.Set("late", "node/settings", "s1", t0)
	expectDelta(t, c.delta(), []string{"node/settings@s1"}, nil)
}

// What an agent sends is bounded: each violation ends the stream with
// InvalidArgument naming the limit, before it is stored.
func TestAgentInputLimits(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	tooLong := strings.Repeat("a", 254)
	for _, tc := range []struct {
		name string
		run  func(a *agent)
		want string
	}{
		{"node name not DNS-1123", func(a *agent) { a.hello("Node_1", nil) }, "not a valid Node name"},
		{"node name too long", func(a *agent) { a.hello(tooLong, nil) }, "not a valid Node name"},
		{"huge resource name", func(a *agent) {
			a.hello("n1", map[string]string{strings.Repeat("n", 600): "v"})
		}, "longer than"},
		{"more errors than resources", func(a *agent) {
			a.hello("n1", nil)
			d := a.delta()
			errs := []*vsplanev1.ResourceError{{Name: "x"}, {Name: "y"}, {Name: "z"}}
			a.ack(d.GetNonce(), errs...)
		}, "carries 3 errors"},
		{"too many kernel operation kinds", func(a *agent) {
			a.hello("n1", nil)
			d := a.delta()
			ops := map[string]uint32{}
			for i := range stream.MaxKernelOperationKinds + 1 {
				ops[fmt.Sprintf("kind%d", i)] = 1
			}
			a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Ack{Ack: &vsplanev1.Ack{
				Nonce: d.GetNonce(), Status: vsplanev1.AckStatus_ACK_STATUS_ACK, KernelOperations: ops}}})
		}, "kernel operation kinds"},
		{"too many kernel errors in status", func(a *agent) {
			a.hello("n1", nil)
			errs := make([]string, stream.MaxStatusKernelErrors+1)
			a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Status{Status: &vsplanev1.AgentStatus{KernelErrors: errs}}})
		}, "kernel errors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := e.open()
			tc.run(a)
			var err error
			for err == nil {
				select { // a first Delta may arrive before the error
				case <-a.msgs:
				case err = <-a.errc:
				case <-time.After(wait):
					t.Fatal("timed out waiting for the stream to fail")
				}
			}
			if c := statusCode(t, err); c != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
}

// With Authenticate, the node comes from the credentials: a Hello naming
// another node is refused before anything is registered or sent, and the
// real agent's stream is untouched.
func TestHelloMustNameTheAuthenticatedNode(t *testing.T) {
	var rejected []error
	var mu sync.Mutex
	e := newEnvOpts(t, false, stream.Options{
		Authenticate: func(ctx context.Context) (string, error) {
			md := incomingNode(ctx)
			if md == "" {
				return "", status.Error(codes.Unauthenticated, "no credentials")
			}
			return md, nil
		},
		Hooks: stream.Hooks{OnReject: func(err error) { mu.Lock(); rejected = append(rejected, err); mu.Unlock() }},
	})
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n2", "service/default/a", "a1", t0)
	real := e.openAs("n1")
	real.hello("n1", nil)
	d := real.delta()
	real.ack(d.GetNonce())
	e.waitAck(d.GetNonce())

	evil := e.openAs("n2")
	evil.hello("n1", nil)
	err := evil.streamErr()
	if c := statusCode(t, err); c != codes.PermissionDenied || !strings.Contains(err.Error(), `credentials belong to node "n2"`) {
		t.Fatalf("Hello for another node: %v, want PermissionDenied", err)
	}
	// Refused before its Hello is read: the Hello may find the stream ended.
	anon := e.open()
	_ = anon.st.Send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{
		NodeName: "n1", AgentVersion: "test"}}})
	if c := statusCode(t, anon.streamErr()); c != codes.Unauthenticated {
		t.Fatalf("no credentials: %v", c)
	}
	// The real agent was never replaced and still gets changes.
	if info, _ := e.srv.Registry().Agent("n1"); info.GetAcknowledgedVersions()["service/default/a"] != "a1" {
		t.Fatalf("real agent's state changed: %v", info)
	}
	e.src.Set("n1", "service/default/a", "a2", t0)
	expectDelta(t, real.delta(), []string{"service/default/a@a2"}, nil)
	mu.Lock()
	defer mu.Unlock()
	if len(rejected) != 2 || stream.ReasonOf(rejected[0]) != stream.ReasonPermissionDenied ||
		stream.ReasonOf(rejected[1]) != stream.ReasonUnauthenticated {
		t.Fatalf("rejections %v", rejected)
	}
}

// incomingNode is the test's stand-in for credentials: the x-test-node header.
func incomingNode(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-test-node"); len(v) == 1 {
		return v[0]
	}
	return ""
}
