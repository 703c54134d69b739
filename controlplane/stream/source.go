package stream

import (
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Source is the per-node desired state the stream server sends.
// *snapshot.Store satisfies it (see notes/STORE_CONTRACT.md).
type Source interface {
	// Subscribe registers interest in node's state. Subscribe BEFORE reading List so no
	// change is missed. Works for nodes the store does not know yet (they may appear later).
	Subscribe(node string) Subscription
	// List returns node's current desired resources sorted by name, plus the node's
	// system version (opaque string that changes whenever any resource changes).
	// Unknown node -> nil, "", false. Returned resources are shared and immutable.
	List(node string) (resources []*vsplanev1.Resource, systemVersion string, ok bool)
	// Get returns one resource of a node (nil,false if absent).
	Get(node, name string) (*vsplanev1.Resource, bool)
	// TriggerTime is the earliest trigger time (Service/EndpointSlice change time) of the
	// change that produced the node's current version of resource `name`; zero if unknown.
	TriggerTime(node, name string) time.Time
}

// Subscription reports which resource names of one node changed.
type Subscription interface {
	// C receives a value (coalesced, buffered 1) whenever names were added to the pending set.
	C() <-chan struct{}
	// Drain returns and clears the set of resource names changed (upserted or removed)
	// for this node since the last Drain. Never blocks.
	Drain() []string
	Close()
}
