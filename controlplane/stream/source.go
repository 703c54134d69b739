package stream

import (
	"github.com/vsplane/vsplane/controlplane/snapshot"
)

// Source is the per-node desired state the stream server sends.
// *snapshot.Store satisfies it; streamtest.Source is an in-memory one.
//
// Contract: a node is either unknown or known with its complete state (the
// store publishes nodes whole, see package snapshot); every read below sees
// one committed state of the node.
type Source interface {
	// Subscribe registers interest in node's state. Subscribe BEFORE reading
	// List so no change is missed. Works for nodes the store does not know
	// yet (they may appear later).
	Subscribe(node string) Subscription
	// List returns node's current desired resources sorted by name, each
	// with its trigger time (Entry), plus the node's system version:
	// internal/wire.SystemVersion of those resources, so equal versions
	// mean equal resources, and an agent that reports the node's system
	// version in its Hello holds exactly them. Unknown node -> nil, "",
	// false. Returned resources are shared and immutable.
	List(node string) (entries []Entry, systemVersion string, ok bool)
	// Lookup returns node's current resources among names (names the node
	// does not have are left out), each with its trigger time, and its
	// system version, all read at once; ok=false for an unknown node. It
	// costs O(len(names)), so Deltas after the first are O(changes), not
	// O(node size), and a Lookup of no names reads the version alone.
	Lookup(node string, names []string) (found []Entry, systemVersion string, ok bool)
}

// Entry is a resource with its trigger time: the earliest trigger time
// (Service/EndpointSlice change time) of the change that produced the
// node's current version of it; zero if unknown. Read with the resource,
// so it is never a newer version's (see snapshot.Entry).
type Entry = snapshot.Entry

// Subscription reports which resource names of one node changed (see
// snapshot.Subscription).
type Subscription = snapshot.Subscription

var _ Source = (*snapshot.Store)(nil)
