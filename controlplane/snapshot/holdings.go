package snapshot

import (
	"math/bits"
	"slices"

	"github.com/vsplane/vsplane/internal/wire"
)

// Who holds what, stored by resource name rather than by node.
//
// Most nodes get the same value of most resources (a Service's state is
// node-specific only where a node hosts its endpoints, has its own
// addresses, or a Local policy applies). So each name keeps one common
// value and the set of node states that hold it (a bitset, a bit per
// state), and its exceptions: the states holding another value, or the
// common value with another trigger time (a node's own trigger, from when
// it was staged and filled, is kept once per node: stageTrigger). An
// exception value several states hold (a rollout's new scheduler on the
// nodes it reached) is a group with a bitset of its own, up to maxGroups
// per name; the others are kept by state id in a map. The memory is
// O(names + exceptions), not O(names × nodes): at 10,000 Services × 1,000
// nodes the per-node maps this replaced held 10 million slots (630 MB).
//
// A node state st holds name n with slot
//
//	{names[n].common, names[n].trig}   if names[n].followers has st.id, else
//	names[n].groups[i].sl              if names[n].groups[i].members has st.id, else
//	names[n].exc[st.id]                if present, else
//	nothing.
//
// The common value moves to another value once more states hold that
// value than follow the current one (rebase), so a change that reaches
// every node ends with the new value common and no exceptions left. A
// rebase to a group's value swaps the two bitsets; one to a value of the
// map touches only that name's holders. A rollout step moves a tenth of
// the fleet from one value to another for every selected Service, and the
// one that reaches the middle rebases them all (BenchmarkRolloutStep): with
// groups both are bit operations, not map writes per node.

// nodeState is one node's state, published or staged.
type nodeState struct {
	id  int      // bit index in every name's followers, key of its exceptions
	sys [16]byte // XOR of the pair hashes of all held resources
	// held is the number of names held, nExc how many of them as
	// exceptions.
	held, nExc int
	// stageTrig is the trigger the state was staged with (unix
	// nanoseconds, 0: none), which slots with trigger stageTrigger stand for.
	stageTrig int64
}

// nameState is the sharing of one resource name. A holder is in exactly
// one of followers, one group's members and exc.
type nameState struct {
	common    *internEntry
	trig      int64 // trigger time of the followers' slot
	followers bitset
	nFollow   int
	// groups are the exception values held by two states or more (at most
	// maxGroups of them), a bitset each: a rollout step moves a tenth of
	// the fleet to a new value, and a bit per node is what a follower
	// costs too. A rebase to a group's value swaps two bitsets.
	groups []group
	// exc holds the other exceptions by state id (nil while there is
	// none): values held by one state (a node's own endpoints), and any
	// value once the groups are taken.
	exc map[int]slot
	// excCount counts the states holding each value of exc (nil while
	// there is none).
	excCount map[slot]int
}

// group is an exception value and the states holding it (n of them, two
// or more).
type group struct {
	sl      slot
	members bitset
	n       int
}

// maxGroups bounds a name's groups: slotOf tries each group's bit before
// the exception map. A variable for the tests.
var maxGroups = 8

type bitset []uint64

func (b bitset) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }

func (b *bitset) set(i int) {
	for i/64 >= len(*b) {
		*b = append(*b, 0)
	}
	(*b)[i/64] |= 1 << (i % 64)
}

func (b bitset) clear(i int) {
	if i/64 < len(b) {
		b[i/64] &^= 1 << (i % 64)
	}
}

// first returns the lowest set bit (-1 if none).
func (b bitset) first() int {
	for w, word := range b {
		if word != 0 {
			return w*64 + bits.TrailingZeros64(word)
		}
	}
	return -1
}

// each calls f for every set bit.
func (b bitset) each(f func(i int)) {
	for w, word := range b {
		for word != 0 {
			t := bits.TrailingZeros64(word)
			f(w*64 + t)
			word &^= 1 << t
		}
	}
}

// newState returns an empty node state with a free id. Caller holds s.mu.
func (s *Store) newState() *nodeState {
	var id int
	if n := len(s.freeIDs); n > 0 {
		id, s.freeIDs = s.freeIDs[n-1], s.freeIDs[:n-1]
	} else {
		id = len(s.states)
		s.states = append(s.states, nil)
	}
	st := &nodeState{id: id}
	s.states[id] = st
	return st
}

// dropState releases everything st holds and frees its id.
func (s *Store) dropState(st *nodeState) {
	if st.held > 0 {
		for name, ns := range s.names {
			s.unhold(st, name, ns)
		}
	}
	s.states[st.id] = nil
	s.freeIDs = append(s.freeIDs, st.id)
}

// get returns st's slot of name.
func (s *Store) get(st *nodeState, name string) (slot, bool) {
	if ns := s.names[name]; ns != nil {
		return ns.slotOf(st)
	}
	return slot{}, false
}

// slotOf returns st's slot of this name. The bit first: most holders
// follow, and a state never both follows and has an exception.
func (ns *nameState) slotOf(st *nodeState) (slot, bool) {
	if ns.followers.has(st.id) {
		return slot{e: ns.common, trigger: ns.trig}, true
	}
	for i := range ns.groups {
		if ns.groups[i].members.has(st.id) {
			return ns.groups[i].sl, true
		}
	}
	sl, ok := ns.exc[st.id]
	return sl, ok
}

// holders is the number of states holding the name.
func (ns *nameState) holders() int {
	n := ns.nFollow + len(ns.exc)
	for i := range ns.groups {
		n += ns.groups[i].n
	}
	return n
}

// groupOf returns the index of sl's group, -1 if it has none.
func (ns *nameState) groupOf(sl slot) int {
	for i := range ns.groups {
		if ns.groups[i].sl == sl {
			return i
		}
	}
	return -1
}

// hold makes st hold sl as name (st must not hold name); ns is the name's
// state, nil if the name is held by nobody. It acquires nothing: sl.e's
// reference is the caller's.
func (s *Store) hold(st *nodeState, name string, ns *nameState, sl slot) {
	if ns == nil {
		ns = &nameState{}
		s.names[name] = ns
	}
	if ns.nFollow == 0 {
		// Nobody follows the common value (so nobody holds the name):
		// this one becomes it.
		ns.common, ns.trig = sl.e, sl.trigger
	}
	st.held++
	wire.XORInto(&st.sys, sl.e.pair)
	if sl.e == ns.common && sl.trigger == ns.trig {
		ns.followers.set(st.id)
		ns.nFollow++
		return
	}
	if gi := ns.groupOf(sl); gi >= 0 {
		g := &ns.groups[gi]
		g.members.set(st.id)
		g.n++
		if g.n > ns.nFollow {
			ns.rebase(sl, s.states)
		}
		return
	}
	if ns.exc == nil {
		ns.exc = map[int]slot{}
	}
	ns.exc[st.id] = sl
	st.nExc++
	ns.count(sl)
	if ns.excCount[sl] >= 2 && len(ns.groups) < maxGroups {
		ns.promote(sl, s.states)
	}
	if ns.countOf(sl) > ns.nFollow {
		ns.rebase(sl, s.states)
	}
}

// countOf is the number of states holding sl as an exception.
func (ns *nameState) countOf(sl slot) int {
	if gi := ns.groupOf(sl); gi >= 0 {
		return ns.groups[gi].n
	}
	return ns.excCount[sl]
}

// promote moves the exceptions holding sl from exc into a new group.
// O(exceptions in exc).
func (ns *nameState) promote(sl slot, states []*nodeState) {
	members, n := ns.takeFromExc(sl, states, 0)
	ns.groups = append(ns.groups, group{sl: sl, members: members, n: n})
}

// takeFromExc removes the states holding sl from exc and returns them as
// a bitset (of at least words words) and their number.
func (ns *nameState) takeFromExc(sl slot, states []*nodeState, words int) (bitset, int) {
	taken, n := make(bitset, words), 0
	for id, v := range ns.exc {
		if v == sl {
			delete(ns.exc, id)
			states[id].nExc--
			taken.set(id)
			n++
		}
	}
	ns.uncountAll(sl)
	return taken, n
}

// ungroup removes group gi; its last member, if any, goes back to exc.
func (ns *nameState) ungroup(gi int, states []*nodeState) {
	g := ns.groups[gi]
	ns.groups = slices.Delete(ns.groups, gi, gi+1)
	if len(ns.groups) == 0 {
		ns.groups = nil
	}
	if g.n == 1 {
		id := g.members.first()
		if ns.exc == nil {
			ns.exc = map[int]slot{}
		}
		ns.exc[id] = g.sl
		states[id].nExc++
		ns.count(g.sl)
	}
}

// unhold makes st hold nothing as name and releases the value's
// reference; a no-op if st does not hold name. It reports whether name is
// now held by nobody (and so gone from s.names).
func (s *Store) unhold(st *nodeState, name string, ns *nameState) (gone bool) {
	var e *internEntry
	if ns.followers.has(st.id) {
		ns.followers.clear(st.id)
		ns.nFollow--
		e = ns.common
	} else if gi := ns.memberOf(st.id); gi >= 0 {
		g := &ns.groups[gi]
		g.members.clear(st.id)
		g.n--
		e = g.sl.e
		if g.n < 2 {
			ns.ungroup(gi, s.states)
		}
	} else if sl, ok := ns.exc[st.id]; ok {
		delete(ns.exc, st.id)
		st.nExc--
		ns.uncount(sl)
		e = sl.e
		if len(ns.exc) == 0 {
			ns.exc = nil
		}
	} else {
		return false
	}
	st.held--
	wire.XORInto(&st.sys, e.pair)
	s.release(e)
	switch {
	case ns.holders() == 0:
		delete(s.names, name)
		return true
	case ns.nFollow == 0:
		// The common value lost its last follower: the most held
		// exception takes its place (and the old value is not kept
		// alive by this name).
		var best slot
		most := 0
		for i := range ns.groups {
			if ns.groups[i].n > most {
				best, most = ns.groups[i].sl, ns.groups[i].n
			}
		}
		for sl, n := range ns.excCount {
			if n > most {
				best, most = sl, n
			}
		}
		ns.rebase(best, s.states)
	}
	return false
}

// memberOf returns the index of the group id is a member of, -1 if none.
func (ns *nameState) memberOf(id int) int {
	for i := range ns.groups {
		if ns.groups[i].members.has(id) {
			return i
		}
	}
	return -1
}

func (ns *nameState) count(sl slot) {
	if ns.excCount == nil {
		ns.excCount = map[slot]int{}
	}
	ns.excCount[sl]++
}

func (ns *nameState) uncount(sl slot) {
	if ns.excCount[sl]--; ns.excCount[sl] <= 0 {
		delete(ns.excCount, sl)
	}
	if len(ns.excCount) == 0 {
		ns.excCount = nil
	}
}

// uncountAll forgets sl's count (its holders left exc).
func (ns *nameState) uncountAll(sl slot) {
	delete(ns.excCount, sl)
	if len(ns.excCount) == 0 {
		ns.excCount = nil
	}
	if len(ns.exc) == 0 {
		ns.exc = nil
	}
}

// rebase makes to the common value of the name: the states holding
// exactly to follow it, the old followers keep their value as an
// exception (a group of their own if there is room). No state's content
// changes. To a group's value it swaps bitsets: O(1) but for the
// bookkeeping of a follower left alone; to a value of exc it is O(holders
// in exc and old followers).
func (ns *nameState) rebase(to slot, states []*nodeState) {
	old := slot{e: ns.common, trigger: ns.trig}
	oldFollowers, moved := ns.followers, ns.nFollow
	if gi := ns.groupOf(to); gi >= 0 {
		g := &ns.groups[gi]
		ns.followers, ns.nFollow = g.members, g.n
		g.sl, g.members, g.n = old, oldFollowers, moved
		if moved < 2 {
			ns.ungroup(gi, states)
		}
	} else {
		ns.followers, ns.nFollow = ns.takeFromExc(to, states, len(oldFollowers))
		switch {
		case moved >= 2 && len(ns.groups) < maxGroups:
			ns.groups = append(ns.groups, group{sl: old, members: oldFollowers, n: moved})
		case moved > 0:
			if ns.exc == nil {
				ns.exc = map[int]slot{}
			}
			oldFollowers.each(func(id int) {
				ns.exc[id] = old
				states[id].nExc++
			})
			if ns.excCount == nil {
				ns.excCount = map[slot]int{}
			}
			ns.excCount[old] += moved
		}
	}
	ns.common, ns.trig = to.e, to.trigger
}
