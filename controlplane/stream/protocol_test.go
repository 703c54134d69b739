package stream_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/vsplane/vsplane/controlplane/stream"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestHelloGetsInitialDelta(t *testing.T) {
	for _, real := range []bool{false, true} {
		name := "bufconn"
		if real {
			name = "tcp"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, real)
			e.src.Set("n1", "service/default/a", "a1", t0)
			e.src.Set("n1", "node/settings", "s1", time.Time{})
			a := e.open()
			a.hello("n1", nil)
			d := a.delta()
			expectDelta(t, d, []string{"node/settings@s1", "service/default/a@a1"}, nil)
			if d.GetNonce() == "" || d.GetSystemVersion() == "" {
				t.Fatalf("nonce %q systemVersion %q must be set", d.GetNonce(), d.GetSystemVersion())
			}
			if got := d.GetTriggerTimes()["service/default/a"].AsTime(); !got.Equal(t0) {
				t.Fatalf("trigger time = %v, want %v", got, t0)
			}
			if _, ok := d.GetTriggerTimes()["node/settings"]; ok {
				t.Fatal("no trigger time expected for a resource without one")
			}
			a.ack(d.GetNonce())
			ev := e.waitAck(d.GetNonce())
			if ev.Status != vsplanev1.AckStatus_ACK_STATUS_ACK || ev.Resources != 2 || !ev.TriggerTimes["service/default/a"].Equal(t0) {
				t.Fatalf("ack event = %+v", ev)
			}
		})
	}
}

func TestResumeWithFullVersionsGetsZeroResources(t *testing.T) {
	e := newEnv(t, true)
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n1", "node/settings", "s1", t0)
	a := e.open()
	a.hello("n1", map[string]string{"service/default/a": "a1", "node/settings": "s1"})
	d := a.delta()
	expectDelta(t, d, nil, nil)
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
	info, ok := e.srv.Registry().Agent("n1")
	if !ok || info.GetPendingResources() != 0 || len(info.GetAcknowledgedVersions()) != 2 {
		t.Fatalf("agent info = %v", info)
	}
}

func TestResumeWithStaleVersionsGetsOnlyDifferences(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a2", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	e.src.Set("n1", "node/settings", "s1", t0)
	a := e.open()
	a.hello("n1", map[string]string{
		"service/default/a":    "a1", // stale
		"service/default/b":    "b1", // current
		"service/default/gone": "g1", // no longer desired
	})
	expectDelta(t, a.delta(), []string{"node/settings@s1", "service/default/a@a2"}, []string{"service/default/gone"})
}

func TestChangeSendsOnlyChangedResource(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())

	e.src.Set("n1", "service/default/b", "b2", t0)
	d = a.delta()
	expectDelta(t, d, []string{"service/default/b@b2"}, nil)
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())

	e.src.Delete("n1", "service/default/a")
	d = a.delta()
	expectDelta(t, d, nil, []string{"service/default/a"})
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
	info, _ := e.srv.Registry().Agent("n1")
	if got := info.GetAcknowledgedVersions(); len(got) != 1 || got["service/default/b"] != "b2" {
		t.Fatalf("acknowledged versions = %v", got)
	}

	// A change that reverts before it is sent produces no Delta: setting b to
	// b2 again (same version) is not a difference. Prove it by sending a real
	// change afterwards and seeing only that one.
	e.src.Set("n1", "service/default/b", "b2", t0)
	e.src.Set("n1", "service/default/c", "c1", t0)
	expectDelta(t, a.delta(), []string{"service/default/c@c1"}, nil)
}

func TestNackedVersionNotResentUntilChanged(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	a.ack(d.GetNonce(), &vsplanev1.ResourceError{Name: "service/default/a", Version: "a1", Message: "ipvs: no such scheduler"})
	ev := e.waitAck(d.GetNonce())
	if ev.Status != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("status = %v", ev.Status)
	}
	info, _ := e.srv.Registry().Agent("n1")
	if info.GetNacks() != 1 || !strings.Contains(info.GetLastNackError(), "no such scheduler") ||
		info.GetAcknowledgedVersions()["service/default/b"] != "b1" || info.GetPendingResources() != 1 {
		t.Fatalf("agent info after NACK = %v", info)
	}
	// Lag: time since the trigger of the oldest unacknowledged resource.
	if lag := info.GetLag().AsDuration(); lag < time.Since(t0)-time.Minute {
		t.Fatalf("lag = %v, want about %v (since the NACKed resource's trigger)", lag, time.Since(t0))
	}

	// Another change: only b is sent; a@a1 is not retried.
	e.src.Set("n1", "service/default/b", "b2", t0)
	d = a.delta()
	expectDelta(t, d, []string{"service/default/b@b2"}, nil)
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())

	// A change of a's content (a new version) is sent.
	e.src.Set("n1", "service/default/a", "a2", t0)
	d = a.delta()
	expectDelta(t, d, []string{"service/default/a@a2"}, nil)
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
	info, _ = e.srv.Registry().Agent("n1")
	if info.GetPendingResources() != 0 || info.GetAcknowledgedVersions()["service/default/a"] != "a2" || info.GetLag() != nil {
		t.Fatalf("agent info after fix = %v", info)
	}
}

func TestSlowAgentGetsCoalescedDelta(t *testing.T) {
	// One Delta in flight: while it is unacknowledged nothing else can go.
	e := newEnvOpts(t, false, stream.Options{MaxInFlight: 1})
	e.src.Set("n1", "service/default/a", "a1", t0)
	a := e.open()
	a.hello("n1", nil)
	first := a.delta()
	// While the first Delta is unacknowledged, many changes happen.
	for i, v := range []string{"a2", "a3", "a4"} {
		e.src.Set("n1", "service/default/a", v, t0.Add(time.Duration(i)*time.Second))
	}
	e.src.Set("n1", "service/default/b", "b1", t0)
	e.src.Set("n1", "service/default/c", "c1", t0)
	e.src.Delete("n1", "service/default/c") // cancels out: never sent
	// The stream has drained every change before the Ack frees the slot.
	waitFor(t, func() bool { return e.src.Pending("n1") == 0 })
	a.ack(first.GetNonce())
	d := a.delta()
	expectDelta(t, d, []string{"service/default/a@a4", "service/default/b@b1"}, nil)
}

func TestUnknownNodeWaitsThenGetsState(t *testing.T) {
	e := newEnv(t, false)
	a := e.open()
	a.hello("late", map[string]string{"service/default/old": "o1"})
	waitFor(t, func() bool { return e.src.Subscribers("late") == 1 })
	if _, ok := e.srv.Registry().Agent("late"); !ok {
		t.Fatal("agent of an unknown node must still be registered")
	}
	e.src.Set("late", "node/settings", "s1", time.Time{})
	// Full diff on appearance: the old resource the agent holds is removed.
	expectDelta(t, a.delta(), []string{"node/settings@s1"}, []string{"service/default/old"})
}

func TestNodeDisappearingRemovesNothing(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
	n := e.src.Lookups("n1")
	e.src.RemoveNode("n1")
	// Let the stream see the node absent before it comes back.
	waitFor(t, func() bool { return e.src.Lookups("n1") > n })
	// Node back with a different set: a full diff against what was sent.
	e.src.Set("n1", "service/default/b", "b1", t0)
	expectDelta(t, a.delta(), []string{"service/default/b@b1"}, []string{"service/default/a"})
}

func TestMalformedMessagesAreInvalidArgument(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "node/settings", "s1", t0)
	cases := []struct {
		name string
		msgs []*vsplanev1.ConnectRequest
		want string
	}{
		{"ack first", []*vsplanev1.ConnectRequest{{Message: &vsplanev1.ConnectRequest_Ack{Ack: &vsplanev1.Ack{Nonce: "1"}}}}, "first message must be Hello"},
		{"empty first", []*vsplanev1.ConnectRequest{{}}, "first message must be Hello"},
		{"empty node", []*vsplanev1.ConnectRequest{{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{}}}}, "node_name must not be empty"},
		{"second hello", []*vsplanev1.ConnectRequest{
			{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{NodeName: "n1"}}},
			{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{NodeName: "n1"}}},
		}, "Hello sent twice"},
		{"empty after hello", []*vsplanev1.ConnectRequest{
			{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{NodeName: "n1"}}}, {},
		}, "without a message"},
		{"unspecified ack status", []*vsplanev1.ConnectRequest{
			{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{NodeName: "n1"}}},
			{Message: &vsplanev1.ConnectRequest_Ack{Ack: &vsplanev1.Ack{Nonce: "1"}}},
		}, "want ACK or NACK"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := e.open()
			for _, m := range tc.msgs {
				a.send(m)
			}
			var err error
			for err == nil {
				select { // the initial Delta may arrive before the error
				case <-a.msgs:
				case err = <-a.errc:
				case <-time.After(wait):
					t.Fatal("timed out waiting for the stream to fail")
				}
			}
			if c := statusCode(t, err); c != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v (%v), want InvalidArgument containing %q", c, err, tc.want)
			}
		})
	}
	// The server is still fine after all that.
	a := e.open()
	a.hello("n1", nil)
	expectDelta(t, a.delta(), []string{"node/settings@s1"}, nil)
}

func TestUnknownNonceIgnored(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	a.ack("no-such-nonce")
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
	e.src.Set("n1", "service/default/a", "a2", t0)
	expectDelta(t, a.delta(), []string{"service/default/a@a2"}, nil)
}

func TestNewStreamReplacesOlder(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	old := e.open()
	old.hello("n1", nil)
	old.delta()
	nw := e.open()
	nw.hello("n1", map[string]string{"service/default/a": "a1"})
	d := nw.delta()
	expectDelta(t, d, nil, nil)
	nw.ack(d.GetNonce())
	if c := statusCode(t, old.streamErr()); c != codes.Aborted {
		t.Fatalf("old stream ended with %v, want Aborted", c)
	}
	if n := e.srv.Registry().Len(); n != 1 {
		t.Fatalf("registry has %d agents, want 1", n)
	}
	// The newer stream keeps working.
	e.src.Set("n1", "service/default/a", "a2", t0)
	expectDelta(t, nw.delta(), []string{"service/default/a@a2"}, nil)
}

func TestRegistryListsAgentsAndForgetsClosedOnes(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n2", "node/settings", "s1", t0)
	e.src.Set("n1", "node/settings", "s1", t0)
	a2, a1 := e.open(), e.open()
	a2.hello("n2", nil)
	a1.hello("n1", nil)
	a1.delta()
	a2.delta()
	a1.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Status{Status: &vsplanev1.AgentStatus{DriftRepaired: 3}}})
	waitFor(t, func() bool { return e.srv.Registry().LastStatus("n1").GetDriftRepaired() == 3 })
	list := e.srv.Registry().ListAgents(true)
	if len(list) != 2 || list[0].GetNodeName() != "n1" || list[1].GetNodeName() != "n2" {
		t.Fatalf("ListAgents = %v", list)
	}
	got := list[0]
	if got.GetAgentVersion() != "test" || got.GetPeer() == "" || got.GetConnectedSince() == nil ||
		got.GetCapabilities().GetIpvsSchedulers()[0] != "rr" || got.GetPendingResources() != 1 {
		t.Fatalf("agent info = %v", got)
	}
	if compact := e.srv.Registry().ListAgents(false); compact[0].GetAcknowledgedVersions() != nil || compact[0].GetNacked() != nil ||
		compact[0].GetPendingResources() != got.GetPendingResources() || compact[0].GetAgentVersion() != "test" {
		t.Fatalf("ListAgents without versions = %v; want the same info, pending %d, and no versions", compact[0], got.GetPendingResources())
	}
	a1.cancel()
	waitFor(t, func() bool { return e.srv.Registry().Len() == 1 })
	waitFor(t, func() bool { return e.src.Subscribers("n1") == 0 })
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

func TestShutdownEndsStreamsWithUnavailable(t *testing.T) {
	e := newEnv(t, true)
	e.src.Set("n1", "node/settings", "s1", t0)
	a := e.open()
	a.hello("n1", nil)
	a.delta()
	e.srv.Shutdown()
	e.srv.Shutdown() // idempotent
	if c := statusCode(t, a.streamErr()); c != codes.Unavailable {
		t.Fatalf("stream ended with %v, want Unavailable", c)
	}
	b := e.open()
	// The server may refuse before reading the Hello, so Send can see EOF.
	_ = b.st.Send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{NodeName: "n1"}}})
	if c := statusCode(t, b.streamErr()); c != codes.Unavailable {
		t.Fatalf("new stream after Shutdown: %v, want Unavailable", c)
	}
	waitFor(t, func() bool { return e.srv.Registry().Len() == 0 })
}

func TestSilentPeerTimesOut(t *testing.T) {
	e := newEnvOpts(t, false, stream.Options{HelloTimeout: 50 * time.Millisecond})
	a := e.open()
	err := a.streamErr()
	if c := statusCode(t, err); c != codes.InvalidArgument || !strings.Contains(err.Error(), "no Hello within") {
		t.Fatalf("silent peer: %v", err)
	}
}

func TestNackWithoutResourceNameFailsWholeDelta(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	a.ack(d.GetNonce(), &vsplanev1.ResourceError{Message: "applier crashed"})
	e.waitAck(d.GetNonce())
	info, _ := e.srv.Registry().Agent("n1")
	if len(info.GetAcknowledgedVersions()) != 0 || info.GetPendingResources() != 2 || info.GetLastNackError() == "" {
		t.Fatalf("agent info = %v", info)
	}
	// Neither is resent; a new resource is.
	e.src.Set("n1", "service/default/c", "c1", t0)
	expectDelta(t, a.delta(), []string{"service/default/c@c1"}, nil)
}

// A NACK caused by a transient kernel error heals on the agent by retrying,
// without new content: AgentStatus.recovered tells the control plane, which
// then counts that version as acknowledged (and only that version).
func TestRecoveredNackIsAcknowledgedByStatus(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	a.ack(d.GetNonce(), &vsplanev1.ResourceError{Name: "service/default/a", Version: "a1", Message: "iptables-save: Cannot initialize"})
	e.waitAck(d.GetNonce())
	pending := func() uint32 { info, _ := e.srv.Registry().Agent("n1"); return info.GetPendingResources() }
	if got := pending(); got != 1 {
		t.Fatalf("pending after NACK = %d, want 1", got)
	}
	status := func(st *vsplanev1.AgentStatus) {
		a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Status{Status: st}})
	}
	// A recovered version the control plane did not see NACKed, or
	// another version, changes nothing.
	status(&vsplanev1.AgentStatus{DriftRepaired: 1, Recovered: map[string]string{"service/default/a": "a0", "service/default/b": "bX"}})
	waitFor(t, func() bool { return e.srv.Registry().LastStatus("n1").GetDriftRepaired() == 1 })
	if got := pending(); got != 1 {
		t.Fatalf("pending after an unrelated recovered map = %d, want 1", got)
	}
	if info, _ := e.srv.Registry().Agent("n1"); info.GetAcknowledgedVersions()["service/default/b"] != "b1" {
		t.Fatalf("recovered bX overwrote b's acknowledged version: %v", info.GetAcknowledgedVersions())
	}
	status(&vsplanev1.AgentStatus{DriftRepaired: 2, Recovered: map[string]string{"service/default/a": "a1"}})
	waitFor(t, func() bool { return pending() == 0 })
	if info, _ := e.srv.Registry().Agent("n1"); info.GetAcknowledgedVersions()["service/default/a"] != "a1" {
		t.Fatalf("acknowledged %v", info.GetAcknowledgedVersions())
	}
	// It is acknowledged, so not sent again; a new version still is.
	e.src.Set("n1", "service/default/a", "a2", t0)
	d = a.delta()
	expectDelta(t, d, []string{"service/default/a@a2"}, nil)
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
}
