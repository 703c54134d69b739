package stream_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/stream/streamtest"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// writableSource is a stream.Source a test can write to.
type writableSource interface {
	stream.Source
	addNode(node string)
	removeNode(node string)
	set(node string, r *vsplanev1.Resource, trigger time.Time)
	del(node, name string)
}

type storeSource struct{ *snapshot.Store }

func (s storeSource) commit(f func(b *snapshot.Batch)) {
	var b snapshot.Batch
	f(&b)
	s.Commit(&b)
}
func (s storeSource) addNode(node string) {
	s.commit(func(b *snapshot.Batch) { b.StageNode(node, time.Time{}); b.PublishNode(node) })
}
func (s storeSource) removeNode(node string) {
	s.commit(func(b *snapshot.Batch) { b.RemoveNode(node) })
}
func (s storeSource) del(node, name string) {
	s.commit(func(b *snapshot.Batch) { b.Delete(node, name) })
}
func (s storeSource) set(node string, r *vsplanev1.Resource, trigger time.Time) {
	s.commit(func(b *snapshot.Batch) { b.Set(node, r, trigger) })
}

type fakeSource struct{ *streamtest.Source }

func (s fakeSource) addNode(node string)    { s.AddNode(node) }
func (s fakeSource) removeNode(node string) { s.RemoveNode(node) }
func (s fakeSource) del(node, name string)  { s.Delete(node, name) }
func (s fakeSource) set(node string, r *vsplanev1.Resource, trigger time.Time) {
	s.SetResource(node, r, trigger)
}

// TestSourceContract runs the stream.Source contract against the store the
// server reads in production and the fake its tests read, so the fake
// cannot drift from the store.
func TestSourceContract(t *testing.T) {
	for name, src := range map[string]func() writableSource{
		"snapshot.Store":    func() writableSource { return storeSource{snapshot.NewStore()} },
		"streamtest.Source": func() writableSource { return fakeSource{streamtest.New()} },
	} {
		t.Run(name, func(t *testing.T) { sourceContract(t, src()) })
	}
}

func sourceContract(t *testing.T, s writableSource) {
	type got struct {
		Entries []string // name@version@trigger (unix seconds; 0: none)
		Sys     string
		OK      bool
	}
	show := func(es []stream.Entry, sys string, ok bool) got {
		g := got{Sys: sys, OK: ok}
		for _, e := range es {
			var tr int64
			if !e.Trigger.IsZero() {
				tr = e.Trigger.Unix()
			}
			g.Entries = append(g.Entries, e.Resource.GetName()+"@"+e.Resource.GetVersion()+"@"+time.Unix(tr, 0).UTC().Format("150405"))
		}
		return g
	}
	check := func(what string, g, want got) {
		t.Helper()
		if diff := cmp.Diff(want, g); diff != "" {
			t.Errorf("%s (-want +got):\n%s", what, diff)
		}
	}
	at := func(sec int64) string { return time.Unix(sec, 0).UTC().Format("150405") }
	sys := func(versions map[string]string) string { return wire.SystemVersion(versions) }
	res := func(name, v string) *vsplanev1.Resource {
		return &vsplanev1.Resource{Name: name, Version: v,
			Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{DefaultScheduler: v}}}
	}

	sub := s.Subscribe("n1") // before the node exists
	defer sub.Close()
	check("unknown node List", show(s.List("n1")), got{})
	check("unknown node Lookup", show(s.Lookup("n1", []string{"a"})), got{})

	s.addNode("n1")
	check("known empty node", show(s.List("n1")), got{Sys: sys(nil), OK: true})

	s.set("n1", res("b", "1"), time.Unix(20, 0))
	s.set("n1", res("a", "1"), time.Unix(10, 0))
	s.set("n1", res("c", "1"), time.Time{})
	all := map[string]string{"a": "1", "b": "1", "c": "1"}
	check("List: sorted by name, each with its trigger", show(s.List("n1")),
		got{Entries: []string{"a@1@" + at(10), "b@1@" + at(20), "c@1@" + at(0)}, Sys: sys(all), OK: true})
	check("Lookup: the names asked for that the node has, in order", show(s.Lookup("n1", []string{"c", "x", "a"})),
		got{Entries: []string{"c@1@" + at(0), "a@1@" + at(10)}, Sys: sys(all), OK: true})
	check("Lookup of no names: the version alone", show(s.Lookup("n1", nil)), got{Sys: sys(all), OK: true})
	if d := sub.Drain(); !cmpSet(d, "a", "b", "c") {
		t.Errorf("subscription drained %v, want a, b, c", d)
	}

	// A new version comes with its own trigger; the same version again
	// keeps the trigger of the change that produced it.
	s.set("n1", res("a", "2"), time.Unix(30, 0))
	s.set("n1", res("b", "1"), time.Unix(40, 0))
	all["a"] = "2"
	check("after a change", show(s.Lookup("n1", []string{"a", "b"})),
		got{Entries: []string{"a@2@" + at(30), "b@1@" + at(20)}, Sys: sys(all), OK: true})

	s.del("n1", "c")
	delete(all, "c")
	check("after a delete", show(s.List("n1")),
		got{Entries: []string{"a@2@" + at(30), "b@1@" + at(20)}, Sys: sys(all), OK: true})

	sub.Drain()
	s.removeNode("n1")
	check("removed node", show(s.List("n1")), got{})
	if d := sub.Drain(); !cmpSet(d, "a", "b") {
		t.Errorf("subscription drained %v after the node's removal, want a, b", d)
	}
}

// cmpSet reports whether got holds exactly want, in any order.
func cmpSet(got []string, want ...string) bool {
	m := map[string]int{}
	for _, g := range got {
		m[g]++
	}
	for _, w := range want {
		m[w]--
	}
	for _, n := range m {
		if n != 0 {
			return false
		}
	}
	return true
}
