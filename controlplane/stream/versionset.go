package stream

import (
	"cmp"
	"maps"
	"slices"
	"unique"
)

// versionSet is a name -> version map held per agent (what the agent holds
// once its Deltas apply), stored as a sorted slice plus a small map of the
// names changed since the slice was built. A Go map of 1,000 names takes
// ~80 B per name (its table is sized in powers of two), and one per agent
// was the largest part of a replica's live heap with 1,000 agents x 1k
// Services (e2e/fanout heap profiles: 84 of 194 MB at the cold start's
// peak). The slice holds one 8-byte handle per name: every agent holds
// the same few (name, version) pairs, so each pair is stored once for the
// process (package unique) and the agents share it (two string headers per
// name, 32 B, were ~25% of the live heap after a cold start of 1,000
// agents). Not safe for concurrent use (the agentState's mu guards it).
type versionSet struct {
	base []pair // sorted by name, no duplicates
	// changed holds the names whose entry differs from base's: has=false
	// for a name removed (or never in base).
	changed map[string]ackedVersion
	n       int // names held
}

type nameVersion struct{ name, version string }

// pair is the process-wide unique copy of a nameVersion.
type pair = unique.Handle[nameVersion]

func pairOf(name, version string) pair { return unique.Make(nameVersion{name, version}) }

func nameOf(p pair) string { return p.Value().name }

// minCompact is the number of changes below which the set is never
// rebuilt; above it, once they exceed 1/compactFraction of the base.
const (
	minCompact      = 32
	compactFraction = 8
)

// newVersionSet returns a set holding m's names (m is not kept).
func newVersionSet(m map[string]string) *versionSet {
	vs := &versionSet{base: make([]pair, 0, len(m))}
	for name, v := range m {
		vs.base = append(vs.base, pairOf(name, v))
	}
	slices.SortFunc(vs.base, func(a, b pair) int { return cmp.Compare(nameOf(a), nameOf(b)) })
	vs.n = len(vs.base)
	return vs
}

// versionSetOf returns a set holding entries, which are sorted by name (as
// Source.List returns them).
func versionSetOf(entries []Entry) *versionSet {
	vs := &versionSet{base: make([]pair, len(entries)), n: len(entries)}
	for i, e := range entries {
		vs.base[i] = pairOf(e.Resource.GetName(), e.Resource.GetVersion())
	}
	return vs
}

// fromBase looks name up in base.
func (vs *versionSet) fromBase(name string) (string, bool) {
	i, ok := slices.BinarySearchFunc(vs.base, name, func(e pair, n string) int { return cmp.Compare(nameOf(e), n) })
	if !ok {
		return "", false
	}
	return vs.base[i].Value().version, true
}

// Get returns name's version.
func (vs *versionSet) Get(name string) (string, bool) {
	if c, ok := vs.changed[name]; ok {
		return c.v, c.has
	}
	return vs.fromBase(name)
}

// Len is the number of names held.
func (vs *versionSet) Len() int { return vs.n }

// Set records name at version v (has) or its removal (!has).
func (vs *versionSet) Set(name, v string, has bool) {
	if !has {
		v = ""
	}
	cur, curHas := vs.Get(name)
	if cur == v && curHas == has {
		return
	}
	switch {
	case has && !curHas:
		vs.n++
	case !has && curHas:
		vs.n--
	}
	if bv, bHas := vs.fromBase(name); bv == v && bHas == has {
		delete(vs.changed, name) // back to what base says
		return
	}
	if vs.changed == nil {
		vs.changed = map[string]ackedVersion{}
	}
	vs.changed[name] = ackedVersion{v, has}
	if len(vs.changed) > minCompact && len(vs.changed) > len(vs.base)/compactFraction {
		vs.compact()
	}
}

// compact folds the changes into a new base: a merge of base with the
// sorted changes, O(base + changes x log changes).
func (vs *versionSet) compact() {
	names := slices.Sorted(maps.Keys(vs.changed))
	base := make([]pair, 0, vs.n)
	i := 0
	for _, name := range names {
		for ; i < len(vs.base) && nameOf(vs.base[i]) < name; i++ {
			base = append(base, vs.base[i])
		}
		if i < len(vs.base) && nameOf(vs.base[i]) == name {
			i++ // replaced or removed by the change
		}
		if c := vs.changed[name]; c.has {
			base = append(base, pairOf(name, c.v))
		}
	}
	base = append(base, vs.base[i:]...)
	vs.base, vs.changed = base, nil // a fresh map next time: an emptied one keeps its size
}

// All yields every name held with its version, in no particular order.
func (vs *versionSet) All() func(yield func(name, version string) bool) {
	return func(yield func(string, string) bool) {
		for _, p := range vs.base {
			e := p.Value()
			if _, ok := vs.changed[e.name]; ok {
				continue
			}
			if !yield(e.name, e.version) {
				return
			}
		}
		for name, c := range vs.changed {
			if c.has && !yield(name, c.v) {
				return
			}
		}
	}
}

// Map returns a copy as a map.
func (vs *versionSet) Map() map[string]string {
	out := make(map[string]string, vs.n)
	maps.Insert(out, vs.All())
	return out
}
