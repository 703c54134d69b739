package watch

import (
	"testing"
	"time"

	"github.com/vsplane/vsplane/controlplane/model"
)

func obs(node string) *Observed[model.Node] {
	return &Observed[model.Node]{Value: &model.Node{Name: node, Zone: "z-" + node}}
}

// was is a tracker's lazy previous value: prev itself.
func was(prev *Observed[model.Node]) func() *Observed[model.Node] {
	return func() *Observed[model.Node] { return prev }
}

func TestTrackerCancelsOut(t *testing.T) {
	tr := newTracker[string, model.Node]()
	t1, t2 := time.Unix(10, 0), time.Unix(5, 0)

	// add then delete = nothing
	if !tr.update("a", was(nil), obs("a"), t1) {
		t.Fatal("add not pending")
	}
	if tr.update("a", was(obs("a")), nil, t1) {
		t.Fatal("add+delete still pending")
	}
	// update then back to the same content = nothing
	before := obs("b")
	after := &Observed[model.Node]{Value: &model.Node{Name: "b", Zone: "other"}}
	tr.update("b", was(before), after, t1)
	if tr.update("b", was(after), obs("b"), t1) {
		t.Fatal("update back to same still pending")
	}
	if n := tr.len(); n != 0 {
		t.Fatalf("%d pending", n)
	}

	// Coalescing keeps the first previous, the last current, the earliest trigger.
	tr.update("c", was(obs("c")), after, t1)
	tr.update("c", was(after), nil, t2)
	got := tr.take()
	ch, ok := got["c"]
	if !ok || ch.Previous == nil || ch.Previous.Value.Zone != "z-c" || ch.Current != nil || !ch.Trigger.Equal(t2) {
		t.Fatalf("coalesced change %+v", ch)
	}
	if tr.len() != 0 {
		t.Fatal("take did not clear")
	}

	// requeue lays a failed batch under newer changes.
	tr.update("c", was(nil), obs("c"), t1) // re-created after the failed batch deleted it
	tr.requeue(got)
	if tr.len() != 0 {
		t.Fatal("failed delete + re-create should cancel out")
	}
	tr.requeue(got)
	if ch := tr.take()["c"]; ch.Current != nil || ch.Previous == nil {
		t.Fatalf("requeued change %+v", ch)
	}
}

// TestTrackerConvertsPreviousOnlyWhenNeeded: a key with a pending change
// keeps its first Previous, so the watch's handler need not convert the old
// object of a later event; update asks for it only when nothing is pending.
func TestTrackerConvertsPreviousOnlyWhenNeeded(t *testing.T) {
	tr := newTracker[string, model.Node]()
	calls := 0
	counted := func(prev *Observed[model.Node]) func() *Observed[model.Node] {
		return func() *Observed[model.Node] { calls++; return prev }
	}
	t1 := time.Unix(10, 0)
	tr.update("a", counted(obs("a")), &Observed[model.Node]{Value: &model.Node{Name: "a", Zone: "one"}}, t1)
	tr.update("a", counted(nil), &Observed[model.Node]{Value: &model.Node{Name: "a", Zone: "two"}}, t1)
	if calls != 1 {
		t.Fatalf("previous converted %d times for two updates of a pending key, want 1", calls)
	}
	if ch := tr.take()["a"]; ch.Previous == nil || ch.Previous.Value.Zone != "z-a" || ch.Current.Value.Zone != "two" {
		t.Fatalf("coalesced change %+v", ch)
	}
	tr.update("a", counted(obs("a")), nil, t1)
	if calls != 2 {
		t.Fatalf("previous not converted after take (calls %d)", calls)
	}
}
