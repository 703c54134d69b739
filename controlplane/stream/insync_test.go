package stream_test

import (
	"testing"
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// An agent that acknowledged everything is reported in sync without its
// node's state being listed (a metrics scrape is O(agents), not
// O(agents x Services)); anything else is computed as before.
func TestPendingOfAnAgentInSyncIsNotListed(t *testing.T) {
	e := newEnv(t, false)
	e.src.Set("n1", "service/default/a", "a1", t0)
	e.src.Set("n1", "service/default/b", "b1", t0)
	reg := e.srv.Registry()
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())

	// pending returns ListAgentsPending's and Agent's pending count and
	// whether the node's state was listed for them.
	pending := func() (scrape, agent uint32, listed bool) {
		t.Helper()
		n := e.src.Lists("n1")
		l := reg.ListAgentsPending()
		if len(l) != 1 || l[0].GetNodeName() != "n1" {
			t.Fatalf("ListAgentsPending = %v", l)
		}
		info, ok := reg.Agent("n1")
		if !ok {
			t.Fatal("agent n1 not listed")
		}
		return l[0].GetPendingResources(), info.GetPendingResources(), e.src.Lists("n1") != n
	}
	inSync := func() bool { s, g, listed := pending(); return s == 0 && g == 0 && !listed }
	waitFor(t, inSync)
	if info, _ := reg.Agent("n1"); len(info.GetAcknowledgedVersions()) != 2 || info.GetLag() != nil {
		t.Fatalf("agent info in sync = %v", info)
	}

	// A change not acknowledged yet is pending, whatever the record says.
	e.src.Set("n1", "service/default/b", "b2", t0)
	if s, g, _ := pending(); s != 1 || g != 1 {
		t.Fatalf("pending with b2 unsent = %d (scrape), %d (agent); want 1", s, g)
	}
	d = a.delta()
	expectDelta(t, d, []string{"service/default/b@b2"}, nil)
	if s, g, _ := pending(); s != 1 || g != 1 {
		t.Fatalf("pending with b2 in flight = %d, %d; want 1", s, g)
	}
	if l := reg.ListAgentsPending(); l[0].GetLag() == nil || l[0].GetAcknowledgedVersions() != nil {
		t.Fatalf("a lagging agent's scrape info: want its lag and no copy of its versions, got %v", l[0])
	}
	if info, _ := reg.Agent("n1"); info.GetAcknowledgedVersions()["service/default/b"] != "b1" || info.GetPendingResources() != 1 {
		t.Fatalf("a lagging agent's info lacks its acknowledged versions or pending count: %v", info)
	}
	a.ack(d.GetNonce())
	e.waitAck(d.GetNonce())
	waitFor(t, inSync)

	// A removal the agent NACKs leaves the name acknowledged: pending
	// counts it, and the agent is never taken for in sync.
	e.src.Delete("n1", "service/default/a")
	d = a.delta()
	expectDelta(t, d, nil, []string{"service/default/a"})
	a.ack(d.GetNonce(), &vsplanev1.ResourceError{Name: "service/default/a", Message: "ipvs: busy"})
	e.waitAck(d.GetNonce())
	deadline := time.Now().Add(100 * time.Millisecond)
	for time.Now().Before(deadline) {
		if s, g, _ := pending(); s != 1 || g != 1 {
			t.Fatalf("pending after a NACKed removal = %d, %d; want 1", s, g)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Back to a state the agent holds (a restored): counted as before.
	e.src.Set("n1", "service/default/a", "a1", t0)
	if s, g, _ := pending(); s != 0 || g != 0 {
		t.Fatalf("pending with a restored = %d, %d; want 0", s, g)
	}
}
