package snapshot

import (
	"math/bits"

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
// it was staged and filled, is kept once per node: stageTrigger). The
// memory is O(names + exceptions), not O(names × nodes): at 10,000
// Services × 1,000 nodes the per-node maps this replaced held 10 million
// slots (630 MB).
//
// A node state st holds name n with slot
//
//	names[n].exc[st.id]                if present, else
//	{names[n].common, names[n].trig}   if names[n].followers has st.id, else
//	nothing.
//
// The common value moves to another value once more states hold that
// value than follow the current one (rebase), so a change that reaches
// every node ends with the new value common and no exceptions left. The
// exceptions are kept by name, keyed by state id, so a rebase touches only
// that name's holders: a rollout step reaching the middle of the fleet
// rebases every selected Service (BenchmarkRolloutStep).

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

// nameState is the sharing of one resource name.
type nameState struct {
	common    *internEntry
	trig      int64 // trigger time of the followers' slot
	followers bitset
	nFollow   int
	// exc holds the exceptions by state id (nil while there is none).
	exc map[int]slot
	// excCount counts the states holding each exception value (nil while
	// there is none): the common value moves to one held by more states
	// than follow it.
	excCount map[slot]int
}

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
	sl, ok := ns.exc[st.id]
	return sl, ok
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
		// Nobody follows the common value: this one becomes it.
		ns.common, ns.trig = sl.e, sl.trigger
	}
	st.held++
	wire.XORInto(&st.sys, sl.e.pair)
	if sl.e == ns.common && sl.trigger == ns.trig {
		ns.followers.set(st.id)
		ns.nFollow++
		return
	}
	if ns.exc == nil {
		ns.exc = map[int]slot{}
	}
	ns.exc[st.id] = sl
	st.nExc++
	ns.count(sl)
	if ns.excCount[sl] > ns.nFollow {
		ns.rebase(sl, s.states)
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
	} else if sl, ok := ns.exc[st.id]; ok {
		delete(ns.exc, st.id)
		st.nExc--
		ns.uncount(sl)
		e = sl.e
	} else {
		return false
	}
	st.held--
	wire.XORInto(&st.sys, e.pair)
	s.release(e)
	switch {
	case ns.nFollow+len(ns.exc) == 0:
		delete(s.names, name)
		return true
	case ns.nFollow == 0:
		// The common value lost its last follower: the most held
		// exception takes its place (and the old value is not kept
		// alive by this name).
		var best slot
		for sl, n := range ns.excCount {
			if best.e == nil || n > ns.excCount[best] {
				best = sl
			}
		}
		ns.rebase(best, s.states)
	}
	return false
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

// rebase makes to the common value of the name: the states holding
// exactly to follow it, the old followers keep their value as an
// exception. No state's content changes. O(holders of the name); states
// gives the holders' states by id.
func (ns *nameState) rebase(to slot, states []*nodeState) {
	old := slot{e: ns.common, trigger: ns.trig}
	oldFollowers, moved := ns.followers, ns.nFollow
	ns.followers, ns.nFollow = make(bitset, len(oldFollowers)), 0
	for id, sl := range ns.exc {
		if sl == to {
			delete(ns.exc, id)
			states[id].nExc--
			ns.followers.set(id)
			ns.nFollow++
		}
	}
	delete(ns.excCount, to)
	if moved > 0 {
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
	if len(ns.exc) == 0 {
		ns.exc, ns.excCount = nil, nil
	}
	ns.common, ns.trig = to.e, to.trigger
}
