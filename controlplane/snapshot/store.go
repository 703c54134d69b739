// Package snapshot is the per-node versioned store of desired state.
//
// Each known node has a map name -> *vsplanev1.Resource. Resource versions are
// content hashes of the body (deterministic proto encoding, sha256), so equal
// content has an equal version on every replica. Identical resources are one
// value in memory: the store interns them by (name, version) with reference
// counts, and drops an entry when no node holds it any more.
//
// The engine writes through Commit (one lock per batch); the stream server
// reads through Subscribe/List/Get/TriggerTime (the contract in
// notes/STORE_CONTRACT.md).
package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// NodeSettingsName is the name of the node-wide settings resource.
const NodeSettingsName = "node/settings"

// ServiceName returns the resource name of a Service.
func ServiceName(namespace, name string) string { return "service/" + namespace + "/" + name }

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
	// pair is hash(name, version), XORed into the system version of every
	// node holding this entry; computed once per distinct value.
	pair [16]byte
}

// slot is one resource of one node.
type slot struct {
	e       *internEntry
	trigger int64 // unix nanoseconds; 0 = unknown
}

type nodeState struct {
	res map[string]slot
	sys [16]byte // XOR of the pair hashes of all resources
}

// Store is the per-node desired state. All methods are safe for concurrent use.
type Store struct {
	mu     sync.RWMutex
	intern map[internKey]*internEntry
	nodes  map[string]*nodeState
	subs   map[string]map[*subscription]struct{}
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		intern: map[internKey]*internEntry{},
		nodes:  map[string]*nodeState{},
		subs:   map[string]map[*subscription]struct{}{},
	}
}

type opKind uint8

const (
	opSet opKind = iota
	opDelete
	opAddNode
	opRemoveNode
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

// AddNode makes node known (no-op if it is). A known node with no resources
// still lists, with an empty set.
func (b *Batch) AddNode(node string) { b.ops = append(b.ops, op{kind: opAddNode, node: node}) }

// RemoveNode forgets node and all its resources; subscribers see every name as changed.
func (b *Batch) RemoveNode(node string) { b.ops = append(b.ops, op{kind: opRemoveNode, node: node}) }

// Set puts res (built by New*Resource, never modified afterwards) as node's
// resource res.Name. trigger is the earliest change time behind it; it is
// recorded only if the node's version of the resource changes. Set on an
// unknown node is ignored.
func (b *Batch) Set(node string, res *vsplanev1.Resource, trigger time.Time) {
	b.ops = append(b.ops, op{kind: opSet, node: node, res: res, trigger: trigger})
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
// subscribers of the nodes whose resources changed. The batch may be reused
// after Commit returns.
func (s *Store) Commit(b *Batch) CommitStats {
	var st CommitStats
	changed := map[string][]string{} // node -> names
	s.mu.Lock()
	for i := range b.ops {
		o := &b.ops[i]
		switch o.kind {
		case opAddNode:
			if _, ok := s.nodes[o.node]; !ok {
				s.nodes[o.node] = &nodeState{res: map[string]slot{}}
			}
		case opRemoveNode:
			ns, ok := s.nodes[o.node]
			if !ok {
				continue
			}
			for name, sl := range ns.res {
				s.release(sl.e)
				changed[o.node] = append(changed[o.node], name)
			}
			delete(s.nodes, o.node)
			st.Changed += len(ns.res)
		case opSet:
			ns, ok := s.nodes[o.node]
			if !ok || o.res == nil {
				continue
			}
			name := o.res.GetName()
			old, had := ns.res[name]
			if had && old.e.res.GetVersion() == o.res.GetVersion() {
				continue
			}
			e := s.acquire(o.res)
			if had {
				xor(&ns.sys, &old.e.pair)
				s.release(old.e)
			}
			xor(&ns.sys, &e.pair)
			var trig int64
			if !o.trigger.IsZero() {
				trig = o.trigger.UnixNano()
			}
			ns.res[e.res.Name] = slot{e: e, trigger: trig}
			changed[o.node] = append(changed[o.node], name)
			st.Changed++
		case opDelete:
			ns, ok := s.nodes[o.node]
			if !ok {
				continue
			}
			old, had := ns.res[o.name]
			if !had {
				continue
			}
			xor(&ns.sys, &old.e.pair)
			s.release(old.e)
			delete(ns.res, o.name)
			changed[o.node] = append(changed[o.node], o.name)
			st.Changed++
		}
	}
	for node, names := range changed {
		for sub := range s.subs[node] {
			sub.add(names)
		}
	}
	s.mu.Unlock()
	st.NodesChanged = len(changed)
	return st
}

// acquire returns the shared entry for res, creating it (with res itself as
// the shared value) if absent. Caller holds s.mu.
func (s *Store) acquire(res *vsplanev1.Resource) *internEntry {
	k := internKey{res.GetName(), res.GetVersion()}
	e, ok := s.intern[k]
	if !ok {
		e = &internEntry{res: res}
		sum := sha256.Sum256([]byte(k.name + "\x00" + k.version))
		copy(e.pair[:], sum[:16])
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

func xor(dst, src *[16]byte) {
	for i := range dst {
		dst[i] ^= src[i]
	}
}

// List returns node's resources sorted by name and its system version, or
// ok=false for an unknown node. The resources are shared: never modify them.
func (s *Store) List(node string) ([]*vsplanev1.Resource, string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ns, ok := s.nodes[node]
	if !ok {
		return nil, "", false
	}
	out := make([]*vsplanev1.Resource, 0, len(ns.res))
	for _, sl := range ns.res {
		out = append(out, sl.e.res)
	}
	slices.SortFunc(out, func(a, b *vsplanev1.Resource) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out, hex.EncodeToString(ns.sys[:]), true
}

// Get returns node's resource name.
func (s *Store) Get(node, name string) (*vsplanev1.Resource, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if ns, ok := s.nodes[node]; ok {
		if sl, ok := ns.res[name]; ok {
			return sl.e.res, true
		}
	}
	return nil, false
}

// TriggerTime returns the trigger time recorded when node's current version
// of name was set; zero if unknown.
func (s *Store) TriggerTime(node, name string) time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if ns, ok := s.nodes[node]; ok {
		if sl, ok := ns.res[name]; ok && sl.trigger != 0 {
			return time.Unix(0, sl.trigger)
		}
	}
	return time.Time{}
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
}

// Stats returns the store's size.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := Stats{Nodes: len(s.nodes), Distinct: len(s.intern)}
	for _, ns := range s.nodes {
		st.Slots += len(ns.res)
	}
	return st
}
