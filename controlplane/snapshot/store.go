// Package snapshot is the per-node versioned store of desired state.
//
// Each known node holds a set of resources by name. Resource versions are
// content hashes of the body (deterministic proto encoding, sha256), so equal
// content has an equal version on every replica. Identical resources are one
// value in memory: the store interns them by (name, version) with reference
// counts, and drops an entry when no node holds it any more. Who holds what is
// kept per name, not per node (holdings.go): one common value and a bitset of
// the nodes holding it, plus per-node exceptions, so memory grows with
// Services + exceptions, not Services × nodes.
//
// The engine writes through Commit (one lock per batch); the stream server
// reads through Subscribe/List/Lookup (stream.Source states that contract),
// each resource with its trigger time, read under the same lock.
//
// # Consistency: readers only ever see complete node states
//
// A node's state is published as a whole. A writer that fills a node with
// many resources (a node joining, every node at a replica's initial sync, a
// node whose zone or addresses changed) stages it first (Batch.StageNode):
// its writes go to a staged copy that readers and subscribers do not see,
// across as many Commits as the filling takes, and Batch.PublishNode swaps
// the staged copy in under one lock, notifying subscribers of exactly the
// names that differ. So List never returns a node that has only part of its
// Services, whatever the batch size, and a stream that diffs an agent's
// state against List never computes removals from a half-filled node.
package snapshot

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// NodeSettingsName is the name of the node-wide settings resource.
const NodeSettingsName = wire.NodeSettingsResource

// ServiceName returns the resource name of a Service.
func ServiceName(namespace, name string) string { return wire.ServiceResource(namespace, name) }

// NewServiceResource builds a versioned resource for a ServiceState. The
// result must not be modified afterwards.
func NewServiceResource(st *vsplanev1.ServiceState) (*vsplanev1.Resource, error) {
	v, err := hashBody(st)
	if err != nil {
		return nil, err
	}
	return &vsplanev1.Resource{Name: ServiceName(st.GetNamespace(), st.GetName()), Version: v,
		Body: &vsplanev1.Resource_Service{Service: st}}, nil
}

// NewNodeSettingsResource builds the versioned "node/settings" resource.
func NewNodeSettingsResource(ns *vsplanev1.NodeSettings) (*vsplanev1.Resource, error) {
	v, err := hashBody(ns)
	if err != nil {
		return nil, err
	}
	return &vsplanev1.Resource{Name: NodeSettingsName, Version: v,
		Body: &vsplanev1.Resource_NodeSettings{NodeSettings: ns}}, nil
}

// hashBody returns the hex sha256 (first 16 bytes) of m's deterministic encoding.
func hashBody(m proto.Message) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("snapshot: encoding resource body: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

type internKey struct{ name, version string }

// internEntry is one shared resource value.
type internEntry struct {
	res  *vsplanev1.Resource
	refs int
	// pair is wire.PairHash(name, version), XORed into the system version
	// of every node holding this entry; computed once per distinct value.
	pair [16]byte
}

// slot is one resource of one node.
type slot struct {
	e       *internEntry
	trigger int64 // unix nanoseconds; 0 = unknown; stageTrigger: the holder's
}

// stageTrigger as a slot's trigger stands for the trigger its node state
// was staged with (Batch.Fill): a node filled with every Service then
// shares each Service's common slot instead of holding all of them as
// exceptions that differ only in the node's own trigger time.
const stageTrigger int64 = -1

// triggerOf resolves sl's trigger as held by st (unix nanoseconds; 0:
// unknown).
func triggerOf(st *nodeState, sl slot) int64 {
	if sl.trigger == stageTrigger {
		return st.stageTrig
	}
	return sl.trigger
}

// Store is the per-node desired state. All methods are safe for concurrent use.
type Store struct {
	mu     sync.RWMutex
	intern map[internKey]*internEntry
	// names, states and freeIDs store who holds what (holdings.go).
	names   map[string]*nameState
	states  []*nodeState // by id; nil: free
	freeIDs []int
	nodes   map[string]*nodeState
	// staged holds the states being filled for nodes (see StageNode); never read by readers.
	staged map[string]*nodeState
	subs   map[string]map[*subscription]struct{}
	opts   Options
}

// Options configure a Store; the zero value is fine.
type Options struct {
	// AfterCommit, if set, is called at the end of every Commit, after the
	// lock is released and subscribers were notified (tests use it to check
	// what readers can see between commits).
	AfterCommit func(CommitStats)
}

// NewStore returns an empty store.
func NewStore() *Store { return NewStoreWithOptions(Options{}) }

// NewStoreWithOptions returns an empty store configured by opts.
func NewStoreWithOptions(opts Options) *Store {
	return &Store{
		intern: map[internKey]*internEntry{},
		names:  map[string]*nameState{},
		nodes:  map[string]*nodeState{},
		staged: map[string]*nodeState{},
		subs:   map[string]map[*subscription]struct{}{},
		opts:   opts,
	}
}

type opKind uint8

const (
	opSet opKind = iota
	opDelete
	opRemoveNode
	opStageNode
	opPublishNode
	opFill
)

type op struct {
	kind    opKind
	node    string
	name    string
	res     *vsplanev1.Resource
	trigger time.Time
}

// Batch collects writes applied together by Commit. Not safe for concurrent use.
type Batch struct{ ops []op }

// Reset empties the batch, keeping its capacity.
func (b *Batch) Reset() {
	clear(b.ops)
	b.ops = b.ops[:0]
}

// Len returns the number of queued writes.
func (b *Batch) Len() int { return len(b.ops) }

// RemoveNode forgets node and all its resources, published and staged;
// subscribers see every published name as changed.
func (b *Batch) RemoveNode(node string) { b.ops = append(b.ops, op{kind: opRemoveNode, node: node}) }

// StageNode starts a new, empty staged state for node (dropping any staged
// one): until PublishNode, Set, Fill and Delete for node write to it, while
// readers keep seeing the published state (or no node at all, for a new
// one) and subscribers hear nothing. The staged state may span several
// Commits. trigger is the node's change that asked for it: Fill's trigger.
func (b *Batch) StageNode(node string, trigger time.Time) {
	b.ops = append(b.ops, op{kind: opStageNode, node: node, trigger: trigger})
}

// PublishNode makes node's staged state its published state in one step
// (the node becomes known if it was not) and notifies subscribers of the
// names whose version differs. No-op if node has no staged state.
func (b *Batch) PublishNode(node string) { b.ops = append(b.ops, op{kind: opPublishNode, node: node}) }

// Set puts res (built by New*Resource, never modified afterwards) as node's
// resource res.Name. trigger is the earliest change time behind it; it is
// recorded only if the node's version of the resource changes. Set on an
// unknown node (neither published nor staged) is ignored.
func (b *Batch) Set(node string, res *vsplanev1.Resource, trigger time.Time) {
	b.ops = append(b.ops, op{kind: opSet, node: node, res: res, trigger: trigger})
}

// Fill is Set with the trigger StageNode gave node's staged state (zero
// if node is not staged): how a node that appeared gets every Service. The
// trigger is kept once per node, so a filled node shares each resource
// with the other nodes instead of holding it as its own exception.
func (b *Batch) Fill(node string, res *vsplanev1.Resource) {
	b.ops = append(b.ops, op{kind: opFill, node: node, res: res})
}

// Delete removes node's resource name (no-op if absent).
func (b *Batch) Delete(node, name string) {
	b.ops = append(b.ops, op{kind: opDelete, node: node, name: name})
}

// CommitStats says what a Commit changed.
type CommitStats struct {
	Changed      int // (node, name) pairs whose version changed or that were removed
	NodesChanged int
}

// Commit applies the batch atomically with respect to readers, then notifies
// subscribers of the nodes whose published resources changed. The batch may
// be reused after Commit returns.
func (s *Store) Commit(b *Batch) CommitStats {
	var st CommitStats
	changed := s.newChanges()
	s.mu.Lock()
	for i := range b.ops {
		o := &b.ops[i]
		switch o.kind {
		case opRemoveNode:
			if ns, ok := s.staged[o.node]; ok {
				s.dropState(ns)
				delete(s.staged, o.node)
			}
			ns, ok := s.nodes[o.node]
			if !ok {
				continue
			}
			held := s.heldNames(ns)
			changed.add(o.node, held...)
			s.dropState(ns)
			delete(s.nodes, o.node)
			st.Changed += len(held)
		case opStageNode:
			if ns, ok := s.staged[o.node]; ok {
				s.dropState(ns)
			}
			ns := s.newState()
			if !o.trigger.IsZero() {
				ns.stageTrig = o.trigger.UnixNano()
			}
			s.staged[o.node] = ns
		case opPublishNode:
			n := s.publish(o.node, changed)
			st.Changed += n
		case opSet, opFill:
			ns, published := s.target(o.node)
			if ns == nil || o.res == nil {
				continue
			}
			var trig int64
			switch {
			case o.kind == opFill && !published:
				trig = stageTrigger
			case !o.trigger.IsZero():
				trig = o.trigger.UnixNano()
			}
			if s.set(ns, o.res, trig) && published {
				changed.add(o.node, o.res.GetName())
				st.Changed++
			}
		case opDelete:
			ns, published := s.target(o.node)
			if ns == nil {
				continue
			}
			if s.delete(ns, o.name) && published {
				changed.add(o.node, o.name)
				st.Changed++
			}
		}
	}
	changed.notify()
	s.mu.Unlock()
	st.NodesChanged = len(changed.nodes)
	if s.opts.AfterCommit != nil {
		s.opts.AfterCommit(st)
	}
	return st
}

// target is the state writes for node go to: the staged one if the node is
// being staged, else the published one (published=true), else nil.
func (s *Store) target(node string) (ns *nodeState, published bool) {
	if ns, ok := s.staged[node]; ok {
		return ns, false
	}
	ns, ok := s.nodes[node]
	if !ok {
		return nil, false
	}
	return ns, true
}

// set makes res ns's resource res.Name with trigger trig (a slot's
// trigger); reports whether the version changed.
func (s *Store) set(st *nodeState, res *vsplanev1.Resource, trig int64) bool {
	name := res.GetName()
	ns := s.names[name]
	if ns != nil {
		old, had := ns.slotOf(st)
		if had && old.e.res.GetVersion() == res.GetVersion() {
			return false
		}
		if had && s.unhold(st, name, ns) {
			ns = nil // st was its last holder
		}
	}
	s.hold(st, name, ns, slot{e: s.acquire(res), trigger: trig})
	return true
}

// delete removes st's resource name; reports whether it was there.
func (s *Store) delete(st *nodeState, name string) bool {
	ns := s.names[name]
	if ns == nil {
		return false
	}
	if _, had := ns.slotOf(st); !had {
		return false
	}
	s.unhold(st, name, ns)
	return true
}

// heldNames returns the names ns holds (unsorted). O(names).
func (s *Store) heldNames(ns *nodeState) []string {
	out := make([]string, 0, ns.held)
	for name, n := range s.names {
		if _, ok := n.slotOf(ns); ok {
			out = append(out, name)
		}
	}
	return out
}

// publish swaps node's staged state in, records the names that differ from
// the previously published state in changed, and returns their number.
// A resource whose version did not change keeps its old trigger time: the
// agent already has it, so it is no news.
func (s *Store) publish(node string, changed *changes) int {
	next, ok := s.staged[node]
	if !ok {
		return 0
	}
	delete(s.staged, node)
	prev := s.nodes[node]
	s.nodes[node] = next
	if prev == nil {
		held := s.heldNames(next)
		changed.add(node, held...)
		return len(held)
	}
	n := 0
	// Neither unhold nor hold below adds or removes a name (prev keeps
	// holding it), so the map can be ranged over directly.
	for name, ns := range s.names {
		was, had := ns.slotOf(prev)
		now, has := ns.slotOf(next)
		if had && has && was.e == now.e {
			if old := triggerOf(prev, was); triggerOf(next, now) != old {
				now.e.refs++             // kept by prev meanwhile; hold takes it over
				s.unhold(next, name, ns) // prev holds it too: the name stays
				s.hold(next, name, ns, slot{e: now.e, trigger: old})
			}
			continue
		}
		if had || has {
			changed.add(node, name)
			n++
		}
	}
	s.dropState(prev)
	return n
}

// acquire returns the shared entry for res, creating it (with res itself as
// the shared value) if absent. Caller holds s.mu.
func (s *Store) acquire(res *vsplanev1.Resource) *internEntry {
	k := internKey{res.GetName(), res.GetVersion()}
	e, ok := s.intern[k]
	if !ok {
		e = &internEntry{res: res}
		e.pair = wire.PairHash(k.name, k.version)
		s.intern[k] = e
	}
	e.refs++
	return e
}

func (s *Store) release(e *internEntry) {
	e.refs--
	if e.refs == 0 {
		delete(s.intern, internKey{e.res.GetName(), e.res.GetVersion()})
	}
}

// Entry is one resource of a node with its trigger time: the earliest
// change time (Service/EndpointSlice) behind the node's current version of
// it; zero if unknown. Resource is shared: never modify it.
type Entry struct {
	Resource *vsplanev1.Resource
	Trigger  time.Time
}

// Resources returns the entries' resources, in their order.
func Resources(entries []Entry) []*vsplanev1.Resource {
	out := make([]*vsplanev1.Resource, len(entries))
	for i, e := range entries {
		out[i] = e.Resource
	}
	return out
}

// entry is sl as held by ns. Caller holds s.mu.
func entry(ns *nodeState, sl slot) Entry {
	e := Entry{Resource: sl.e.res}
	if t := triggerOf(ns, sl); t != 0 {
		e.Trigger = time.Unix(0, t)
	}
	return e
}

// List returns node's resources with their trigger times, sorted by name,
// and its system version, all read under one lock; ok=false for an unknown
// node.
func (s *Store) List(node string) ([]Entry, string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ns, ok := s.nodes[node]
	if !ok {
		return nil, "", false
	}
	out := make([]Entry, 0, ns.held)
	for _, n := range s.names {
		if sl, ok := n.slotOf(ns); ok {
			out = append(out, entry(ns, sl))
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Resource.Name, b.Resource.Name) })
	return out, wire.FormatSystemVersion(ns.sys), true
}

// Lookup returns node's resources among names (absent names are left out)
// with their trigger times, and its system version, all read under one
// lock; ok=false for an unknown node.
func (s *Store) Lookup(node string, names []string) ([]Entry, string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ns, ok := s.nodes[node]
	if !ok {
		return nil, "", false
	}
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		if sl, ok := s.get(ns, n); ok {
			out = append(out, entry(ns, sl))
		}
	}
	return out, wire.FormatSystemVersion(ns.sys), true
}

// Has reports whether node is published (known).
func (s *Store) Has(node string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.nodes[node]
	return ok
}

// Get returns node's resource name.
func (s *Store) Get(node, name string) (*vsplanev1.Resource, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if ns, ok := s.nodes[node]; ok {
		if sl, ok := s.get(ns, name); ok {
			return sl.e.res, true
		}
	}
	return nil, false
}

// Nodes returns the known nodes, sorted.
func (s *Store) Nodes() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.nodes))
	for n := range s.nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Stats describe the store's size.
type Stats struct {
	Nodes int
	// Slots is the number of (node, resource) pairs.
	Slots int
	// Distinct is the number of distinct shared resource values.
	Distinct int
	// Exceptions is the number of (node, resource) pairs stored per node
	// because the node holds a value no other node's exception shares
	// (holdings.go); the other Slots, of the common value or of a group,
	// cost a bit each.
	Exceptions int
}

// Stats returns the store's size.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := Stats{Nodes: len(s.nodes), Distinct: len(s.intern)}
	for _, ns := range s.nodes {
		st.Slots += ns.held
		st.Exceptions += ns.nExc
	}
	return st
}
