package stream_test

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/vsplane/vsplane/controlplane/stream"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// svc is a Service resource of cost 1 + Σ(1 + rs) + entries.
func svc(name, version string, rs []int, entries int) *vsplanev1.Resource {
	st := &vsplanev1.ServiceState{Namespace: "default", Name: name}
	for i, n := range rs {
		vs := &vsplanev1.VirtualServer{Address: "198.18.0.1", Port: uint32(80 + i), Scheduler: version}
		for j := range n {
			vs.RealServers = append(vs.RealServers, &vsplanev1.RealServer{Address: fmt.Sprintf("198.19.0.%d", j+1), Port: 8080})
		}
		st.VirtualServers = append(st.VirtualServers, vs)
	}
	for i := range entries {
		st.IpsetEntries = append(st.IpsetEntries, &vsplanev1.IPSetEntry{Ip: "198.18.0.1", Port: uint32(i)})
	}
	return &vsplanev1.Resource{Name: "service/default/" + name, Version: version, Body: &vsplanev1.Resource_Service{Service: st}}
}

func cost(d *vsplanev1.Delta) int {
	n := 0
	for _, r := range d.GetResources() {
		n += stream.ResourceCost(r)
	}
	return n
}

// ackOps acknowledges nonce reporting ops kernel operations applied in took.
func (a *agent) ackOps(nonce string, ops uint32, took time.Duration) {
	a.t.Helper()
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Ack{Ack: &vsplanev1.Ack{
		Nonce: nonce, Status: vsplanev1.AckStatus_ACK_STATUS_ACK, ApplyDuration: durationpb.New(took),
		KernelOperations: map[string]uint32{"ipvs_add_destination": ops},
	}}})
}

// applyUntilSynced acknowledges every Delta (starting with d, if not nil)
// until the agent's acknowledged versions equal node's desired state, and
// returns the Deltas in order.
func (e *env) applyUntilSynced(a *agent, node string, d *vsplanev1.Delta) []*vsplanev1.Delta {
	e.t.Helper()
	var out []*vsplanev1.Delta
	for range 1000 {
		if d == nil {
			d = a.delta()
		}
		out = append(out, d)
		a.ack(d.GetNonce())
		e.waitAck(d.GetNonce())
		if e.acknowledgedIsDesired(node) {
			return out
		}
		d = nil
	}
	e.t.Fatal("agent not in sync after 1000 Deltas")
	return nil
}

// acknowledgedIsDesired: what the server counts as acknowledged by node's
// agent is exactly node's desired state, and nothing is pending.
func (e *env) acknowledgedIsDesired(node string) bool {
	info, ok := e.srv.Registry().Agent(node)
	if !ok {
		return false
	}
	res, _, _ := e.src.List(node)
	want := map[string]string{}
	for _, e := range res {
		want[e.Resource.GetName()] = e.Resource.GetVersion()
	}
	return maps.Equal(info.GetAcknowledgedVersions(), want) && info.GetPendingResources() == 0
}

// holdSlot sends a change and returns its Delta unacknowledged, so that the
// changes made before releasing it coalesce into one pending set. It holds
// the stream's only slot when the test runs with MaxInFlight 1 (with more,
// a change could go out at once, depending on timing).
func (e *env) holdSlot(a *agent, node string) *vsplanev1.Delta {
	e.t.Helper()
	e.src.Set(node, "node/settings", fmt.Sprintf("hold-%d", time.Now().UnixNano()), time.Time{})
	d := a.delta()
	if len(d.GetResources()) != 1 || d.GetResources()[0].GetName() != "node/settings" {
		e.t.Fatalf("holding Delta carries %v", d.GetResources())
	}
	return d
}

// release acknowledges the held Delta once the stream has taken in every
// change made meanwhile.
func (e *env) release(a *agent, node string, held *vsplanev1.Delta) {
	e.t.Helper()
	waitFor(e.t, func() bool { return e.src.Pending(node) == 0 })
	a.ack(held.GetNonce())
	e.waitAck(held.GetNonce())
}

func TestBurstGoesOutInBoundedDeltas(t *testing.T) {
	const budget = 20
	e := newEnvOpts(t, false, stream.Options{MaxInFlight: 1, MinDeltaOps: 1, MaxDeltaOps: budget})
	e.src.Set("n1", "node/settings", "s1", time.Time{})
	a := e.open()
	a.hello("n1", nil)
	e.applyUntilSynced(a, "n1", nil)

	held := e.holdSlot(a, "n1")
	want := map[string]string{}
	for i := range 60 {
		var r *vsplanev1.Resource
		switch {
		case i == 17:
			r = svc(fmt.Sprintf("s%02d", i), "v1", []int{29}, 0) // 31: larger than the budget
		case i%5 == 0:
			r = svc(fmt.Sprintf("s%02d", i), "v1", []int{2, 1}, 3) // 9
		default:
			r = svc(fmt.Sprintf("s%02d", i), "v1", []int{1}, 0) // 3
		}
		e.src.SetResource("n1", r, t0.Add(time.Duration(i)*time.Second))
		want[r.GetName()] = r.GetVersion()
	}
	e.release(a, "n1", held)

	deltas := e.applyUntilSynced(a, "n1", nil)
	if len(deltas) < 60*3/budget {
		t.Fatalf("%d Deltas for a burst of cost > %d with budget %d", len(deltas), 60*3, budget)
	}
	got := map[string]string{}
	var sentOrder []string
	for i, d := range deltas {
		if c := cost(d); c > budget && len(d.GetResources()) != 1 {
			t.Errorf("Delta %d: cost %d over the budget %d with %d resources", i, c, budget, len(d.GetResources()))
		}
		// Greedy: a Delta stops only where the next resource would not fit.
		if i+1 < len(deltas) {
			if c, next := cost(d), stream.ResourceCost(deltas[i+1].GetResources()[0]); c+next <= budget {
				t.Errorf("Delta %d: cost %d, yet the next resource (cost %d) was left for Delta %d", i, c, next, i+1)
			}
		}
		if len(d.GetRemoved()) != 0 {
			t.Errorf("Delta %d removes %v", i, d.GetRemoved())
		}
		for _, r := range d.GetResources() {
			if _, dup := got[r.GetName()]; dup {
				t.Errorf("%s sent twice", r.GetName())
			}
			got[r.GetName()] = r.GetVersion()
			sentOrder = append(sentOrder, r.GetName())
			if tt := d.GetTriggerTimes()[r.GetName()]; tt == nil || !tt.AsTime().Equal(e.triggerOf(r.GetName())) {
				t.Errorf("%s: trigger time %v", r.GetName(), tt)
			}
		}
	}
	if !slices.IsSorted(sentOrder) {
		t.Errorf("resources not sent in name order: %v", sentOrder)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
}

func (e *env) triggerOf(name string) time.Time { return e.src.TriggerTime("n1", name) }

// Removals wait for the last of the pending upserts, which may replace what
// they take away; removals alone go at once, however many.
func TestRemovalsRideWithTheLastUpserts(t *testing.T) {
	e := newEnvOpts(t, false, stream.Options{MaxInFlight: 1, MinDeltaOps: 1, MaxDeltaOps: 10})
	for _, n := range []string{"m-old1", "m-old2"} {
		e.src.Set("n1", "service/default/"+n, "o1", t0)
	}
	a := e.open()
	a.hello("n1", nil)
	e.applyUntilSynced(a, "n1", nil)

	held := e.holdSlot(a, "n1")
	e.src.Delete("n1", "service/default/m-old1")
	e.src.Delete("n1", "service/default/m-old2")
	for i := range 25 { // names on both sides of the removed ones
		e.src.Set("n1", fmt.Sprintf("service/default/%c%02d", "az"[i%2], i), "v1", t0)
	}
	e.release(a, "n1", held)
	deltas := e.applyUntilSynced(a, "n1", nil)
	if len(deltas) < 3 {
		t.Fatalf("%d Deltas for 25 upserts with budget 10", len(deltas))
	}
	for i, d := range deltas[:len(deltas)-1] {
		if len(d.GetRemoved()) != 0 {
			t.Fatalf("Delta %d of %d removes %v ahead of later upserts", i, len(deltas), d.GetRemoved())
		}
	}
	last := deltas[len(deltas)-1]
	if up, rm := summary(last); len(up) == 0 || !equal(rm, []string{"service/default/m-old1", "service/default/m-old2"}) {
		t.Fatalf("last Delta: upserts %v removed %v; want the last upserts with both removals", up, rm)
	}

	held = e.holdSlot(a, "n1")
	var gone []string
	for i := range 25 {
		gone = append(gone, fmt.Sprintf("service/default/%c%02d", "az"[i%2], i))
		e.src.Delete("n1", gone[i])
	}
	e.release(a, "n1", held)
	slices.Sort(gone)
	d := a.delta()
	expectDelta(t, d, nil, gone)
	e.applyUntilSynced(a, "n1", d)
}

// The agent's mass-removal guard judges the first Delta after a (re)connect
// alone: a first Delta with removals must carry them all, so it goes whole.
func TestFirstDeltaWithRemovalsIsNotSplit(t *testing.T) {
	e := newEnvOpts(t, false, stream.Options{MinDeltaOps: 1, MaxDeltaOps: 10})
	var wantUp []string
	for i := range 30 {
		name := fmt.Sprintf("service/default/s%02d", i)
		e.src.Set("n1", name, "v2", t0)
		wantUp = append(wantUp, name+"@v2")
	}
	a := e.open()
	a.hello("n1", map[string]string{"service/default/s00": "v1", "service/default/gone": "g1"})
	d := a.delta()
	expectDelta(t, d, wantUp, []string{"service/default/gone"})
	if got := e.applyUntilSynced(a, "n1", d); len(got) != 1 {
		t.Fatalf("%d Deltas after an unsplit first Delta, want 1", len(got))
	}
}

// A cold start removes nothing: it is split like any burst, and with
// MaxInFlight 2 two Deltas wait at the agent, never more.
func TestColdFirstDeltaIsSplit(t *testing.T) {
	var mu sync.Mutex
	inflight, most := 0, 0
	e := newEnvOpts(t, false, stream.Options{MinDeltaOps: 1, MaxDeltaOps: 10, MaxInFlight: 2, Hooks: stream.Hooks{
		OnDeltaSent: func(string, *vsplanev1.Delta) {
			mu.Lock()
			inflight++
			most = max(most, inflight)
			mu.Unlock()
		},
		OnAck: func(stream.AckEvent) { mu.Lock(); inflight--; mu.Unlock() },
	}})
	want := map[string]string{}
	for i := range 35 {
		name := fmt.Sprintf("service/default/s%02d", i)
		e.src.Set("n1", name, "v1", t0)
		want[name] = "v1"
	}
	a := e.open()
	a.hello("n1", nil)
	first, second := a.delta(), a.delta() // both before any Ack
	if len(first.GetResources()) != 10 || len(second.GetResources()) != 10 {
		t.Fatalf("first Deltas carry %d and %d resources, want 10 each", len(first.GetResources()), len(second.GetResources()))
	}
	a.ack(first.GetNonce())
	e.waitAck(first.GetNonce())
	deltas := append([]*vsplanev1.Delta{first}, e.applyUntilSynced(a, "n1", second)...)
	got := map[string]string{}
	for _, d := range deltas {
		for _, r := range d.GetResources() {
			if _, dup := got[r.GetName()]; dup {
				t.Errorf("%s sent twice", r.GetName())
			}
			got[r.GetName()] = r.GetVersion()
		}
	}
	if len(deltas) != 4 || !maps.Equal(got, want) {
		t.Fatalf("%d Deltas sent %v; want 4 sending %v", len(deltas), got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 2 {
		t.Fatalf("at most %d Deltas were in flight, want 2", most)
	}
}

// A name changed while it waits in the burst goes out once, at its newest
// version; one already sent is sent again.
func TestChangeDuringBurstSentAtNewestVersion(t *testing.T) {
	e := newEnvOpts(t, false, stream.Options{MaxInFlight: 1, MinDeltaOps: 1, MaxDeltaOps: 10})
	for i := range 30 {
		e.src.Set("n1", fmt.Sprintf("service/default/s%02d", i), "v1", t0)
	}
	a := e.open()
	a.hello("n1", nil)
	first := a.delta()
	if len(first.GetResources()) != 10 {
		t.Fatalf("first Delta carries %d resources, want 10", len(first.GetResources()))
	}
	e.src.Set("n1", "service/default/s25", "v2", t0)
	e.src.Set("n1", "service/default/s05", "v2", t0)
	e.release(a, "n1", first)
	sent := map[string][]string{}
	for _, d := range e.applyUntilSynced(a, "n1", nil) {
		for _, r := range d.GetResources() {
			sent[r.GetName()] = append(sent[r.GetName()], r.GetVersion())
		}
	}
	if got := sent["service/default/s25"]; !equal(got, []string{"v2"}) {
		t.Errorf("s25 sent as %v, want once as v2", got)
	}
	if got := sent["service/default/s05"]; !equal(got, []string{"v2"}) {
		t.Errorf("s05 resent as %v, want v2 (after v1 in the first Delta)", got)
	}
	if len(sent) != 21 {
		t.Errorf("after the first Delta %d names were sent, want 20 + s05", len(sent))
	}
}

// The budget follows what the agent reports: a slow Ack shrinks the next
// Delta, a fast one grows it again.
func TestBudgetFollowsAgentRate(t *testing.T) {
	e := newEnvOpts(t, false, stream.Options{MaxInFlight: 1, MinDeltaOps: 10, MaxDeltaOps: 400, TargetApplyTime: time.Second})
	for i := range 1000 {
		e.src.Set("n1", fmt.Sprintf("service/default/s%04d", i), "v1", t0)
	}
	a := e.open()
	a.hello("n1", nil)
	d := a.delta()
	if n := len(d.GetResources()); n != 400 {
		t.Fatalf("first Delta: %d resources, want 400 (initial budget within the max)", n)
	}
	a.ackOps(d.GetNonce(), 400, 10*time.Second) // 40 ops/s
	d = a.delta()
	if n := len(d.GetResources()); n != 40 {
		t.Fatalf("after a slow Ack: %d resources, want 40 (40 ops/s x 1s)", n)
	}
	a.ackOps(d.GetNonce(), 40, 10*time.Millisecond) // 4,000 ops/s: the average moves to 1,030
	d = a.delta()
	if n := len(d.GetResources()); n != 400 {
		t.Fatalf("after a fast Ack: %d resources, want the max 400", n)
	}
	e.applyUntilSynced(a, "n1", d)
}
