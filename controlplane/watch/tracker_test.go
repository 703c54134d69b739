package watch

import (
	"testing"
	"time"

	"github.com/vsplane/vsplane/controlplane/model"
)

func obs(node string) *Observed[model.Node] {
	return &Observed[model.Node]{Value: &model.Node{Name: node, Zone: "z-" + node}}
}

func TestTrackerCancelsOut(t *testing.T) {
	tr := newTracker[string, model.Node]()
	t1, t2 := time.Unix(10, 0), time.Unix(5, 0)

	// add then delete = nothing
	if !tr.update("a", nil, obs("a"), t1) {
		t.Fatal("add not pending")
	}
	if tr.update("a", obs("a"), nil, t1) {
		t.Fatal("add+delete still pending")
	}
	// update then back to the same content = nothing
	before := obs("b")
	after := &Observed[model.Node]{Value: &model.Node{Name: "b", Zone: "other"}}
	tr.update("b", before, after, t1)
	if tr.update("b", after, obs("b"), t1) {
		t.Fatal("update back to same still pending")
	}
	if n := tr.len(); n != 0 {
		t.Fatalf("%d pending", n)
	}

	// Coalescing keeps the first previous, the last current, the earliest trigger.
	tr.update("c", obs("c"), after, t1)
	tr.update("c", after, nil, t2)
	got := tr.take()
	ch, ok := got["c"]
	if !ok || ch.Previous == nil || ch.Previous.Value.Zone != "z-c" || ch.Current != nil || !ch.Trigger.Equal(t2) {
		t.Fatalf("coalesced change %+v", ch)
	}
	if tr.len() != 0 {
		t.Fatal("take did not clear")
	}

	// requeue lays a failed batch under newer changes.
	tr.update("c", nil, obs("c"), t1) // re-created after the failed batch deleted it
	tr.requeue(got)
	if tr.len() != 0 {
		t.Fatal("failed delete + re-create should cancel out")
	}
	tr.requeue(got)
	if ch := tr.take()["c"]; ch.Current != nil || ch.Previous == nil {
		t.Fatalf("requeued change %+v", ch)
	}
}
