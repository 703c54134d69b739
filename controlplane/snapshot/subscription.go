package snapshot

import (
	"slices"
	"sync"
)

// Subscription reports which resource names of one node changed. It has the
// method set stream.Subscription aliases.
type Subscription interface {
	// C receives a value (coalesced, buffered 1) whenever names were added to the pending set.
	C() <-chan struct{}
	// Drain returns (sorted) and clears the names changed since the last Drain. Never blocks.
	Drain() []string
	// Close stops the subscription; further changes are not recorded.
	Close()
}

type subscription struct {
	store   *Store
	node    string
	c       chan struct{}
	mu      sync.Mutex
	pending map[string]struct{}
}

// Subscribe registers interest in node's changes, including nodes the store
// does not know yet. Subscribe before List so no change is missed.
func (s *Store) Subscribe(node string) Subscription {
	sub := &subscription{store: s, node: node, c: make(chan struct{}, 1), pending: map[string]struct{}{}}
	s.mu.Lock()
	m := s.subs[node]
	if m == nil {
		m = map[*subscription]struct{}{}
		s.subs[node] = m
	}
	m[sub] = struct{}{}
	s.mu.Unlock()
	return sub
}

// changes hands what a Commit changes to the changed nodes' subscriptions
// as it goes: names go straight into their pending sets, and each is
// signalled once at the end (notify). No list of names per node is built:
// a rollout step changing a million (node, name) pairs built lists as long
// only to copy them into the pending sets, or to drop them for nodes no
// stream subscribed to. Used with the store lock held.
type changes struct {
	s     *Store
	nodes map[string][]*subscription // changed published node -> its subscriptions
}

func (s *Store) newChanges() *changes { return &changes{s: s, nodes: map[string][]*subscription{}} }

// add records that names of node changed.
func (c *changes) add(node string, names ...string) {
	subs, ok := c.nodes[node]
	if !ok {
		for sub := range c.s.subs[node] {
			subs = append(subs, sub)
		}
		c.nodes[node] = subs
	}
	for _, sub := range subs {
		sub.mu.Lock()
		for _, n := range names {
			sub.pending[n] = struct{}{}
		}
		sub.mu.Unlock()
	}
}

// notify signals every subscription that got names.
func (c *changes) notify() {
	for _, subs := range c.nodes {
		for _, sub := range subs {
			select {
			case sub.c <- struct{}{}:
			default:
			}
		}
	}
}

func (sub *subscription) C() <-chan struct{} { return sub.c }

func (sub *subscription) Drain() []string {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if len(sub.pending) == 0 {
		return nil
	}
	out := make([]string, 0, len(sub.pending))
	for n := range sub.pending {
		out = append(out, n)
	}
	// A fresh map rather than clear: a map keeps the capacity it once grew
	// to (a burst naming every resource), and iterating or clearing it
	// would cost that capacity at every later Drain.
	sub.pending = map[string]struct{}{}
	slices.Sort(out)
	return out
}

func (sub *subscription) Close() {
	s := sub.store
	s.mu.Lock()
	if m := s.subs[sub.node]; m != nil {
		delete(m, sub)
		if len(m) == 0 {
			delete(s.subs, sub.node)
		}
	}
	s.mu.Unlock()
}
