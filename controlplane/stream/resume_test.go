package stream_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Resuming by system version (agent.proto, AgentService): a Hello with only
// the system version of what the agent holds.

func (a *agent) helloBySystemVersion(node string, held map[string]string) {
	a.t.Helper()
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{
		NodeName: node, AgentVersion: "test",
		HeldSystemVersion: wire.SystemVersion(held), HeldCount: uint32(len(held)),
	}}})
}

func (a *agent) next() *vsplanev1.ConnectResponse {
	a.t.Helper()
	select {
	case m := <-a.msgs:
		return m
	case err := <-a.errc:
		a.t.Fatalf("stream ended while waiting for a message: %v", err)
	case <-time.After(wait):
		a.t.Fatal("timed out waiting for a message")
	}
	return nil
}

// Every stream announces resumption in its headers, a full Hello's too.
func TestStreamsAnnounceResumeBySystemVersion(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "node/settings", "s1", time.Time{})
	a := e.open()
	a.hello("n1", nil)
	a.delta()
	md, err := a.st.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got := md.Get(wire.ResumeBySystemVersionHeader); len(got) != 1 || got[0] != "1" {
		t.Fatalf("header %s = %q, want [\"1\"]", wire.ResumeBySystemVersionHeader, got)
	}
}

// The agent holds the node's desired state: an empty first Delta, the
// registry shows every version acknowledged, and later changes go out as
// differences from it.
func TestResumeBySystemVersionThatMatches(t *testing.T) {
	e := newEnv(t, true)
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	e.src.Set("n1", "node/settings", "s1", t0)
	a := e.open()
	a.helloBySystemVersion("n1", map[string]string{"service/default/a": "a1", "service/default/b": "b1", "node/settings": "s1"})
	d := a.delta()
	expectDelta(t, d, nil, nil)
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
	info, ok := e.srv.Registry().Agent("n1")
	if !ok || info.GetPendingResources() != 0 || len(info.GetAcknowledgedVersions()) != 3 ||
		info.GetAcknowledgedVersions()["service/default/b"] != "b1" {
		t.Fatalf("agent info = %v", info)
	}

	e.src.Set("n1", "service/default/b", "b2", t0)
	e.src.Delete("n1", "service/default/a")
	d = a.delta()
	expectDelta(t, d, []string{"service/default/b@b2"}, []string{"service/default/a"})
}

// The agent holds something else: the server asks for its versions, sends
// nothing before they come, then the differences as after a full Hello.
func TestResumeBySystemVersionThatDiffersAsksForVersions(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a2", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	e.src.Set("n1", "node/settings", "s1", t0)
	held := map[string]string{
		"service/default/a":    "a1", // stale
		"service/default/b":    "b1", // current
		"service/default/gone": "g1", // no longer desired
	}
	a := e.open()
	a.helloBySystemVersion("n1", held)
	if m := a.next(); m.GetVersionsRequest() == nil {
		t.Fatalf("first message = %v, want a VersionsRequest", m)
	}
	// A change meanwhile sends nothing before the versions arrive: the
	// next message is the first Delta, computed against them (one computed
	// against nothing held would carry service/default/b too).
	e.src.Set("n1", "service/default/c", "c1", t0)
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_HeldVersions{
		HeldVersions: &vsplanev1.HeldVersions{ResourceVersions: held}}})
	expectDelta(t, a.delta(), []string{"node/settings@s1", "service/default/a@a2", "service/default/c@c1"},
		[]string{"service/default/gone"})
}

// Same versions but a different count (cannot happen with an honest agent
// unless hashes collide) is not taken as a match.
func TestResumeBySystemVersionChecksTheCount(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "node/settings", "s1", t0)
	a := e.open()
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{
		NodeName: "n1", HeldSystemVersion: wire.SystemVersion(map[string]string{"node/settings": "s1"}), HeldCount: 2,
	}}})
	if m := a.next(); m.GetVersionsRequest() == nil {
		t.Fatalf("first message = %v, want a VersionsRequest", m)
	}
}

func TestResumeBySystemVersionProtocolErrors(t *testing.T) {
	sys := wire.SystemVersion(map[string]string{"node/settings": "s1"})
	for name, tc := range map[string]struct {
		hello *vsplanev1.Hello
		then  *vsplanev1.ConnectRequest
	}{
		"both versions and a system version": {hello: &vsplanev1.Hello{NodeName: "n1",
			ResourceVersions: map[string]string{"node/settings": "s1"}, HeldSystemVersion: sys, HeldCount: 1}},
		"not hex":   {hello: &vsplanev1.Hello{NodeName: "n1", HeldSystemVersion: "zz" + sys[2:], HeldCount: 1}},
		"too short": {hello: &vsplanev1.Hello{NodeName: "n1", HeldSystemVersion: sys[:30], HeldCount: 1}},
		"count over the limit": {hello: &vsplanev1.Hello{NodeName: "n1", HeldSystemVersion: sys,
			HeldCount: stream.MaxHeldResources + 1}},
		"HeldVersions unasked": {hello: &vsplanev1.Hello{NodeName: "n1"},
			then: &vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_HeldVersions{HeldVersions: &vsplanev1.HeldVersions{}}}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, false)
			e.src.Set("n1", "node/settings", "s2", t0)
			a := e.open()
			a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: tc.hello}})
			if tc.then != nil {
				a.delta()
				a.send(tc.then)
			}
			if code := statusCode(t, a.streamErr()); code != codes.InvalidArgument {
				t.Fatalf("code = %v, want InvalidArgument", code)
			}
		})
	}
}

// An agent that never answers the VersionsRequest is closed after
// HelloTimeout, like one that never says Hello.
func TestUnansweredVersionsRequestTimesOut(t *testing.T) {
	e := newEnvOpts(t, false, stream.Options{HelloTimeout: 200 * time.Millisecond})
	e.src.Set("n1", "node/settings", "s2", t0)
	a := e.open()
	a.helloBySystemVersion("n1", map[string]string{"node/settings": "s1"})
	if m := a.next(); m.GetVersionsRequest() == nil {
		t.Fatalf("first message = %v, want a VersionsRequest", m)
	}
	if err := a.streamErr(); statusCode(t, err) != codes.InvalidArgument {
		t.Fatalf("err = %v, want InvalidArgument", err)
	}
}
