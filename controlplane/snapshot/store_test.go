package snapshot

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func svcRes(t *testing.T, name, addr string) *vsplanev1.Resource {
	t.Helper()
	r, err := NewServiceResource(&vsplanev1.ServiceState{Namespace: "ns", Name: name,
		VirtualServers: []*vsplanev1.VirtualServer{{Address: addr, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP}}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// addNode makes a new node known, empty, as the engine adds one: staged
// and published in the same batch.
func addNode(b *Batch, node string) {
	b.StageNode(node, time.Time{})
	b.PublishNode(node)
}

func names(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Resource.Name)
	}
	return out
}

// triggerAt is node's trigger time of name as Lookup reads it with the
// resource (zero if node does not hold name).
func triggerAt(s *Store, node, name string) time.Time {
	found, _, _ := s.Lookup(node, []string{name})
	if len(found) == 0 {
		return time.Time{}
	}
	return found[0].Trigger
}

func TestVersionIsContentHash(t *testing.T) {
	a, b := svcRes(t, "a", "198.18.0.1"), svcRes(t, "a", "198.18.0.1")
	if a.Version != b.Version || a.Version == "" {
		t.Fatalf("equal content, versions %q %q", a.Version, b.Version)
	}
	if c := svcRes(t, "a", "198.18.0.2"); c.Version == a.Version {
		t.Fatalf("different content, same version %q", c.Version)
	}
	if a.Name != "service/ns/a" {
		t.Fatalf("name %q", a.Name)
	}
}

func TestIdenticalContentIsShared(t *testing.T) {
	s := NewStore()
	var b Batch
	addNode(&b, "n1")
	addNode(&b, "n2")
	// Separately built but equal values: the store keeps the first one.
	r1, r2 := svcRes(t, "a", "198.18.0.1"), svcRes(t, "a", "198.18.0.1")
	b.Set("n1", r1, time.Time{})
	b.Set("n2", r2, time.Time{})
	s.Commit(&b)
	g1, _ := s.Get("n1", "service/ns/a")
	g2, _ := s.Get("n2", "service/ns/a")
	if g1 != g2 || g1 != r1 {
		t.Fatalf("not shared: %p %p (first %p)", g1, g2, r1)
	}
	if st := s.Stats(); st != (Stats{Nodes: 2, Slots: 2, Distinct: 1}) {
		t.Fatalf("stats %+v", st)
	}
	_, v1, _ := s.List("n1")
	_, v2, _ := s.List("n2")
	if v1 != v2 {
		t.Fatalf("same content, system versions %s %s", v1, v2)
	}

	// Node 1 moves on: two distinct values now.
	b = Batch{}
	b.Set("n1", svcRes(t, "a", "198.18.0.9"), time.Time{})
	s.Commit(&b)
	if st := s.Stats(); st.Distinct != 2 {
		t.Fatalf("stats %+v", st)
	}
	// Removing node 2 frees the old value.
	b = Batch{}
	b.RemoveNode("n2")
	s.Commit(&b)
	if st := s.Stats(); st != (Stats{Nodes: 1, Slots: 1, Distinct: 1}) {
		t.Fatalf("stats after remove %+v", st)
	}
	if _, _, ok := s.List("n2"); ok {
		t.Fatal("removed node still listed")
	}
	// Deleting the last holder frees the last entry.
	b = Batch{}
	b.Delete("n1", "service/ns/a")
	s.Commit(&b)
	if st := s.Stats(); st != (Stats{Nodes: 1, Slots: 0, Distinct: 0}) {
		t.Fatalf("stats after delete %+v", st)
	}
	if len(s.intern) != 0 {
		t.Fatalf("intern table not empty: %d", len(s.intern))
	}
}

func TestListGetTriggerAndSystemVersion(t *testing.T) {
	s := NewStore()
	if _, _, ok := s.List("n1"); ok {
		t.Fatal("unknown node listed")
	}
	var b Batch
	addNode(&b, "n1")
	s.Commit(&b)
	rs, empty, ok := s.List("n1")
	if !ok || len(rs) != 0 {
		t.Fatalf("known empty node: %v %v", rs, ok)
	}
	t1 := time.Unix(100, 5)
	b = Batch{}
	b.Set("n1", svcRes(t, "b", "198.18.0.2"), t1)
	b.Set("n1", svcRes(t, "a", "198.18.0.1"), t1)
	s.Commit(&b)
	rs, v1, _ := s.List("n1")
	if diff := cmp.Diff([]string{"service/ns/a", "service/ns/b"}, names(rs)); diff != "" {
		t.Fatalf("List names (-want +got):\n%s", diff)
	}
	if v1 == empty {
		t.Fatal("system version did not change")
	}
	if got := triggerAt(s, "n1", "service/ns/a"); !got.Equal(t1) {
		t.Fatalf("trigger %v, want %v", got, t1)
	}
	// Re-setting equal content changes nothing, not even the trigger time.
	b = Batch{}
	b.Set("n1", svcRes(t, "a", "198.18.0.1"), time.Unix(200, 0))
	if st := s.Commit(&b); st.Changed != 0 {
		t.Fatalf("no-op set changed %d", st.Changed)
	}
	if got := triggerAt(s, "n1", "service/ns/a"); !got.Equal(t1) {
		t.Fatalf("trigger moved to %v on a no-op", got)
	}
	// Change then change back: the system version returns to its old value
	// (it depends on content only).
	b = Batch{}
	b.Set("n1", svcRes(t, "a", "198.18.0.7"), time.Unix(300, 0))
	s.Commit(&b)
	_, v2, _ := s.List("n1")
	if v2 == v1 {
		t.Fatal("system version unchanged after a change")
	}
	if got := triggerAt(s, "n1", "service/ns/a"); !got.Equal(time.Unix(300, 0)) {
		t.Fatalf("trigger %v", got)
	}
	b = Batch{}
	b.Set("n1", svcRes(t, "a", "198.18.0.1"), time.Unix(400, 0))
	s.Commit(&b)
	if _, v3, _ := s.List("n1"); v3 != v1 {
		t.Fatalf("system version %s, want %s", v3, v1)
	}
	if _, ok := s.Get("n1", "service/ns/zzz"); ok {
		t.Fatal("Get of absent name")
	}
	if !triggerAt(s, "n9", "x").IsZero() {
		t.Fatal("trigger of unknown node")
	}
	// Set on an unknown node is ignored.
	b = Batch{}
	b.Set("n9", svcRes(t, "a", "198.18.0.1"), time.Time{})
	if st := s.Commit(&b); st.Changed != 0 {
		t.Fatalf("set on unknown node changed %d", st.Changed)
	}
}

func TestSubscription(t *testing.T) {
	s := NewStore()
	sub := s.Subscribe("n1") // before the node exists
	defer sub.Close()
	other := s.Subscribe("n2")
	var b Batch
	addNode(&b, "n1")
	b.Set("n1", svcRes(t, "a", "198.18.0.1"), time.Time{})
	b.Set("n1", svcRes(t, "b", "198.18.0.2"), time.Time{})
	s.Commit(&b)
	select {
	case <-sub.C():
	default:
		t.Fatal("no signal")
	}
	if diff := cmp.Diff([]string{"service/ns/a", "service/ns/b"}, sub.Drain()); diff != "" {
		t.Fatalf("drain (-want +got):\n%s", diff)
	}
	if got := sub.Drain(); got != nil {
		t.Fatalf("second drain %v", got)
	}
	if got := other.Drain(); got != nil {
		t.Fatalf("other node's subscriber saw %v", got)
	}
	// Two commits coalesce into one signal and one drain.
	b = Batch{}
	b.Delete("n1", "service/ns/a")
	s.Commit(&b)
	b = Batch{}
	b.Set("n1", svcRes(t, "c", "198.18.0.3"), time.Time{})
	s.Commit(&b)
	<-sub.C()
	select {
	case <-sub.C():
		t.Fatal("signal not coalesced")
	default:
	}
	if diff := cmp.Diff([]string{"service/ns/a", "service/ns/c"}, sub.Drain()); diff != "" {
		t.Fatalf("drain (-want +got):\n%s", diff)
	}
	// Removing the node reports every name.
	b = Batch{}
	b.RemoveNode("n1")
	s.Commit(&b)
	if diff := cmp.Diff([]string{"service/ns/b", "service/ns/c"}, sub.Drain()); diff != "" {
		t.Fatalf("drain after remove (-want +got):\n%s", diff)
	}
	// Closed subscriptions record nothing.
	other.Close()
	b = Batch{}
	addNode(&b, "n2")
	b.Set("n2", svcRes(t, "a", "198.18.0.1"), time.Time{})
	s.Commit(&b)
	if got := other.Drain(); got != nil {
		t.Fatalf("closed subscription drained %v", got)
	}
	if len(s.subs["n2"]) != 0 {
		t.Fatal("closed subscription still registered")
	}
}

// A staged node is invisible to readers and subscribers until it is
// published, across any number of commits; publishing notifies exactly
// the names that differ and keeps the trigger time of unchanged ones.
func TestStagedNodeIsPublishedWhole(t *testing.T) {
	s := NewStore()
	sub := s.Subscribe("n1")
	defer sub.Close()
	var b Batch
	b.StageNode("n1", time.Time{})
	b.Set("n1", svcRes(t, "a", "198.18.0.1"), time.Unix(10, 0))
	s.Commit(&b)
	b = Batch{}
	b.Set("n1", svcRes(t, "b", "198.18.0.2"), time.Unix(10, 0))
	s.Commit(&b)
	if _, _, ok := s.List("n1"); ok {
		t.Fatal("staged new node is listed before PublishNode")
	}
	if got := s.Nodes(); len(got) != 0 {
		t.Fatalf("Nodes() = %v before publish", got)
	}
	if got := sub.Drain(); got != nil {
		t.Fatalf("subscriber saw %v before publish", got)
	}
	b = Batch{}
	b.PublishNode("n1")
	if st := s.Commit(&b); st.Changed != 2 || st.NodesChanged != 1 {
		t.Fatalf("publish stats %+v", st)
	}
	rs, v1, ok := s.List("n1")
	if !ok || len(rs) != 2 {
		t.Fatalf("after publish: %v %v", names(rs), ok)
	}
	if diff := cmp.Diff([]string{"service/ns/a", "service/ns/b"}, sub.Drain()); diff != "" {
		t.Fatalf("drain (-want +got):\n%s", diff)
	}

	// Restage: a unchanged, b changed, c new, d removed by not being in
	// the new state.
	b = Batch{}
	b.Set("n1", svcRes(t, "d", "198.18.0.4"), time.Unix(20, 0))
	s.Commit(&b)
	sub.Drain()
	b = Batch{}
	b.StageNode("n1", time.Time{})
	b.Set("n1", svcRes(t, "a", "198.18.0.1"), time.Unix(30, 0))
	b.Set("n1", svcRes(t, "b", "198.18.0.9"), time.Unix(30, 0))
	b.Set("n1", svcRes(t, "c", "198.18.0.3"), time.Unix(30, 0))
	s.Commit(&b)
	// The published state (a, b, d) is still what readers see.
	if rs, v, _ := s.List("n1"); v == v1 || cmp.Diff([]string{"service/ns/a", "service/ns/b", "service/ns/d"}, names(rs)) != "" {
		t.Fatalf("published state changed while staging: %v", names(rs))
	}
	if got := sub.Drain(); got != nil {
		t.Fatalf("subscriber saw %v while staging", got)
	}
	b = Batch{}
	b.PublishNode("n1")
	if st := s.Commit(&b); st.Changed != 3 {
		t.Fatalf("publish changed %d, want 3 (b, c, d)", st.Changed)
	}
	if diff := cmp.Diff([]string{"service/ns/b", "service/ns/c", "service/ns/d"}, sub.Drain()); diff != "" {
		t.Fatalf("drain (-want +got):\n%s", diff)
	}
	if got := triggerAt(s, "n1", "service/ns/a"); !got.Equal(time.Unix(10, 0)) {
		t.Fatalf("unchanged resource's trigger time moved to %v", got)
	}
	if got := triggerAt(s, "n1", "service/ns/c"); !got.Equal(time.Unix(30, 0)) {
		t.Fatalf("new resource's trigger time %v", got)
	}
	if st := s.Stats(); st != (Stats{Nodes: 1, Slots: 3, Distinct: 3}) {
		t.Fatalf("stats %+v (released old values?)", st)
	}

	// Removing a node while it is staged drops both states.
	b = Batch{}
	b.StageNode("n1", time.Time{})
	b.Set("n1", svcRes(t, "z", "198.18.0.26"), time.Time{})
	b.RemoveNode("n1")
	b.PublishNode("n1") // no staged state left: no-op
	s.Commit(&b)
	if _, _, ok := s.List("n1"); ok {
		t.Fatal("removed node listed")
	}
	if len(s.intern) != 0 {
		t.Fatalf("intern table holds %d values after the node went", len(s.intern))
	}
}

// Nodes filled at different times (each staged with its own trigger) share
// every resource's common slot: the trigger is kept once per node, not as
// an exception per (node, resource). Each node still reports its own
// trigger, a later Set's trigger replaces it, and a restage keeps the
// trigger of what did not change.
func TestFilledNodesShareResources(t *testing.T) {
	s := NewStore()
	res := []*vsplanev1.Resource{svcRes(t, "a", "198.18.0.1"), svcRes(t, "b", "198.18.0.2")}
	const nodes = 5
	for i := range nodes {
		var b Batch
		node := fmt.Sprintf("n%d", i)
		b.StageNode(node, time.Unix(int64(100+i), 0))
		for _, r := range res {
			b.Fill(node, r)
		}
		b.PublishNode(node)
		s.Commit(&b)
	}
	if st := s.Stats(); st != (Stats{Nodes: nodes, Slots: 2 * nodes, Distinct: 2}) {
		t.Fatalf("stats %+v, want no exceptions", st)
	}
	for i := range nodes {
		node := fmt.Sprintf("n%d", i)
		if got := triggerAt(s, node, "service/ns/a"); !got.Equal(time.Unix(int64(100+i), 0)) {
			t.Fatalf("%s: trigger %v, want its stage trigger", node, got)
		}
	}
	// A change of b reaching every node carries the change's trigger.
	var b Batch
	b2 := svcRes(t, "b", "198.18.0.3")
	for i := range nodes {
		b.Set(fmt.Sprintf("n%d", i), b2, time.Unix(200, 0))
	}
	s.Commit(&b)
	if got := triggerAt(s, "n3", "service/ns/b"); !got.Equal(time.Unix(200, 0)) {
		t.Fatalf("trigger after a change %v", got)
	}
	if got := triggerAt(s, "n3", "service/ns/a"); !got.Equal(time.Unix(103, 0)) {
		t.Fatalf("unchanged a: trigger %v", got)
	}
	// Restaging n1 (zone change) with the same content keeps the triggers
	// the node had.
	b = Batch{}
	b.StageNode("n1", time.Unix(300, 0))
	b.Fill("n1", res[0])
	b.Fill("n1", b2)
	b.PublishNode("n1")
	if st := s.Commit(&b); st.Changed != 0 {
		t.Fatalf("restage with the same content changed %d names", st.Changed)
	}
	if got := triggerAt(s, "n1", "service/ns/a"); !got.Equal(time.Unix(101, 0)) {
		t.Fatalf("restaged a: trigger %v, want the first stage's", got)
	}
	if got := triggerAt(s, "n1", "service/ns/b"); !got.Equal(time.Unix(200, 0)) {
		t.Fatalf("restaged b: trigger %v, want the change's", got)
	}
	// Fill on a published node is a Set without a trigger.
	b = Batch{}
	b.Fill("n2", svcRes(t, "c", "198.18.0.4"))
	s.Commit(&b)
	if got := triggerAt(s, "n2", "service/ns/c"); !got.IsZero() {
		t.Fatalf("Fill on a published node: trigger %v, want none", got)
	}
}

// Commit hands a node's changed names to each of its subscriptions (two
// streams of one node both see them), signals each once, counts nodes
// nobody subscribed to, and signals nothing when nothing changed.
func TestCommitNotifiesEverySubscription(t *testing.T) {
	s := NewStore()
	a, b2 := s.Subscribe("n1"), s.Subscribe("n1")
	defer a.Close()
	defer b2.Close()
	var b Batch
	addNode(&b, "n1")
	addNode(&b, "n2")
	s.Commit(&b)
	a.Drain()
	b2.Drain()
	drainSignal := func(sub Subscription) bool {
		select {
		case <-sub.C():
			return true
		default:
			return false
		}
	}
	drainSignal(a)
	drainSignal(b2)
	b = Batch{}
	for _, n := range []string{"n1", "n2"} {
		b.Set(n, svcRes(t, "a", "198.18.0.1"), time.Time{})
		b.Set(n, svcRes(t, "b", "198.18.0.2"), time.Time{})
	}
	if st := s.Commit(&b); st.Changed != 4 || st.NodesChanged != 2 {
		t.Fatalf("stats %+v, want 4 changed on 2 nodes", st)
	}
	for i, sub := range []Subscription{a, b2} {
		if !drainSignal(sub) || drainSignal(sub) {
			t.Errorf("subscription %d: not signalled exactly once", i)
		}
		if diff := cmp.Diff([]string{"service/ns/a", "service/ns/b"}, sub.Drain()); diff != "" {
			t.Errorf("subscription %d (-want +got):\n%s", i, diff)
		}
	}
	// The same versions again: nothing changed, nobody signalled.
	if st := s.Commit(&b); st.Changed != 0 || st.NodesChanged != 0 {
		t.Fatalf("stats %+v for a commit of unchanged versions", st)
	}
	if drainSignal(a) || drainSignal(b2) {
		t.Error("signalled for a commit that changed nothing")
	}
}
