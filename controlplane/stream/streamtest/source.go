// Package streamtest provides an in-memory stream.Source for tests of the
// agent stream (server side, agent client, integration tests).
package streamtest

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Source is a goroutine-safe in-memory stream.Source. Resources carry a
// NodeSettings body whose default_scheduler is the version, so bodies differ
// when versions do.
type Source struct {
	mu       sync.Mutex
	nodes    map[string]map[string]*vsplanev1.Resource
	triggers map[string]map[string]time.Time
	subs     map[string][]*sub
	lookups  map[string]int
	lists    map[string]int
}

var _ stream.Source = (*Source)(nil)

// New returns an empty Source (no node known).
func New() *Source {
	return &Source{
		nodes:    map[string]map[string]*vsplanev1.Resource{},
		triggers: map[string]map[string]time.Time{},
		subs:     map[string][]*sub{},
		lookups:  map[string]int{},
		lists:    map[string]int{},
	}
}

// systemVersion is the content-based version the real store keeps
// (internal/wire.SystemVersion), so agents can resume by it.
func systemVersion(m map[string]*vsplanev1.Resource) string {
	var sys [16]byte
	for _, r := range m {
		wire.XORInto(&sys, wire.PairHash(r.GetName(), r.GetVersion()))
	}
	return wire.FormatSystemVersion(sys)
}

// Resource builds the resource the Source stores for name@version.
func Resource(name, version string) *vsplanev1.Resource {
	return &vsplanev1.Resource{Name: name, Version: version,
		Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{DefaultScheduler: version}}}
}

// AddNode makes node known (with no resources) and notifies nothing: a
// known node with zero resources has no names to report.
func (s *Source) AddNode(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.nodes[node]; !ok {
		s.nodes[node] = map[string]*vsplanev1.Resource{}
	}
}

// RemoveNode forgets node and notifies subscribers with every name it had.
func (s *Source) RemoveNode(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.nodes[node]))
	for n := range s.nodes[node] {
		names = append(names, n)
	}
	delete(s.nodes, node)
	delete(s.triggers, node)
	s.notify(node, names...)
}

// Set upserts name@version for node (making the node known) with trigger
// time trigger (zero: none; see SetResource) and notifies subscribers.
func (s *Source) Set(node, name, version string, trigger time.Time) {
	s.SetResource(node, Resource(name, version), trigger)
}

// SetResource upserts res for node (making the node known) and notifies
// subscribers. trigger (zero: none) becomes the resource's trigger time if
// its version changes; the same version keeps the trigger of the change
// that produced it, as in the store.
func (s *Source) SetResource(node string, res *vsplanev1.Resource, trigger time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[node] == nil {
		s.nodes[node] = map[string]*vsplanev1.Resource{}
	}
	old, had := s.nodes[node][res.GetName()]
	s.nodes[node][res.GetName()] = res
	if s.triggers[node] == nil {
		s.triggers[node] = map[string]time.Time{}
	}
	if !had || old.GetVersion() != res.GetVersion() {
		s.triggers[node][res.GetName()] = trigger
	}
	s.notify(node, res.GetName())
}

// Delete removes name from node and notifies subscribers.
func (s *Source) Delete(node, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.nodes[node][name]; !ok {
		return
	}
	delete(s.nodes[node], name)
	delete(s.triggers[node], name)
	s.notify(node, name)
}

// Subscribers is the number of open subscriptions for node.
func (s *Source) Subscribers(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs[node])
}

func (s *Source) notify(node string, names ...string) {
	for _, sb := range s.subs[node] {
		sb.add(names)
	}
}

// Subscribe implements stream.Source.
func (s *Source) Subscribe(node string) stream.Subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := &sub{src: s, node: node, ch: make(chan struct{}, 1), pending: map[string]struct{}{}}
	s.subs[node] = append(s.subs[node], sb)
	return sb
}

// Pending is the number of changed names not yet drained by node's
// subscribers (summed), so tests can wait until a stream has seen changes.
func (s *Source) Pending(node string) int {
	s.mu.Lock()
	subs := slices.Clone(s.subs[node])
	s.mu.Unlock()
	n := 0
	for _, b := range subs {
		b.mu.Lock()
		n += len(b.pending)
		b.mu.Unlock()
	}
	return n
}

// Lookups counts List and Lookup calls for node, so tests can wait
// until a stream has looked at the node's state.
func (s *Source) Lookups(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups[node]
}

// Lists counts List calls for node (reads of its whole state).
func (s *Source) Lists(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists[node]
}

// List implements stream.Source.
func (s *Source) List(node string) ([]stream.Entry, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups[node]++
	s.lists[node]++
	m, ok := s.nodes[node]
	if !ok {
		return nil, "", false
	}
	out := make([]stream.Entry, 0, len(m))
	for name, r := range m {
		out = append(out, stream.Entry{Resource: r, Trigger: s.triggers[node][name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Resource.GetName() < out[j].Resource.GetName() })
	return out, systemVersion(m), true
}

// Get returns one resource of node.
func (s *Source) Get(node, name string) (*vsplanev1.Resource, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.nodes[node][name]
	return r, ok
}

// Has reports whether node is known.
func (s *Source) Has(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.nodes[node]
	return ok
}

// Lookup implements stream.Source.
func (s *Source) Lookup(node string, names []string) ([]stream.Entry, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups[node]++
	m, ok := s.nodes[node]
	if !ok {
		return nil, "", false
	}
	var out []stream.Entry
	for _, n := range names {
		if r, ok := m[n]; ok {
			out = append(out, stream.Entry{Resource: r, Trigger: s.triggers[node][n]})
		}
	}
	return out, systemVersion(m), true
}

// TriggerTime returns the trigger time node's resource name was set with
// (zero: none or no such resource), for tests; it is not counted by
// Lookups.
func (s *Source) TriggerTime(node, name string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.triggers[node][name]
}

type sub struct {
	src  *Source
	node string
	ch   chan struct{}

	mu      sync.Mutex
	pending map[string]struct{}
	closed  bool
}

func (b *sub) add(names []string) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	for _, n := range names {
		b.pending[n] = struct{}{}
	}
	b.mu.Unlock()
	select {
	case b.ch <- struct{}{}:
	default:
	}
}

func (b *sub) C() <-chan struct{} { return b.ch }

func (b *sub) Drain() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.pending))
	for n := range b.pending {
		out = append(out, n)
	}
	clear(b.pending)
	return out
}

func (b *sub) Close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.src.mu.Lock()
	defer b.src.mu.Unlock()
	b.src.subs[b.node] = slices.DeleteFunc(b.src.subs[b.node], func(x *sub) bool { return x == b })
}
