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

// SystemVersioner is optionally implemented by a Source. With it, deltas after
// the first cost O(changed names) (Get per name) instead of a List of the
// whole node per Delta. ok=false means the node is unknown.
type SystemVersioner interface {
	SystemVersion(node string) (version string, ok bool)
}

// store is a Source whose Subscribe returns its own subscription type T
// (Go method sets need identical result types, so *snapshot.Store, whose
// Subscribe returns snapshot.Subscription, is not a Source by itself).
type store[T Subscription] interface {
	Subscribe(node string) T
	List(node string) ([]*vsplanev1.Resource, string, bool)
	Get(node, name string) (*vsplanev1.Resource, bool)
	TriggerTime(node, name string) time.Time
}

// Adapt turns a store with its own Subscription type into a Source:
//
//	src := stream.Adapt[snapshot.Subscription](store)
//
// SystemVersion is forwarded when the store has it.
func Adapt[T Subscription](s store[T]) Source {
	if sv, ok := s.(SystemVersioner); ok {
		return adaptedVersioned[T]{adapted[T]{s}, sv}
	}
	return adapted[T]{s}
}

type adapted[T Subscription] struct{ s store[T] }

func (a adapted[T]) Subscribe(node string) Subscription { return a.s.Subscribe(node) }
func (a adapted[T]) List(node string) ([]*vsplanev1.Resource, string, bool) {
	return a.s.List(node)
}
func (a adapted[T]) Get(node, name string) (*vsplanev1.Resource, bool) { return a.s.Get(node, name) }
func (a adapted[T]) TriggerTime(node, name string) time.Time           { return a.s.TriggerTime(node, name) }

type adaptedVersioned[T Subscription] struct {
	adapted[T]
	sv SystemVersioner
}

func (a adaptedVersioned[T]) SystemVersion(node string) (string, bool) {
	return a.sv.SystemVersion(node)
}
