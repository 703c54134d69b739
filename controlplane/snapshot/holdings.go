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
// state), and a node state keeps only its exceptions: the names where it
// holds another value, or the common value with another trigger time (a
// node's own trigger, from when it was staged and filled, is kept once per
// node: stageTrigger). The
// memory is O(names + exceptions), not O(names × nodes): at 10,000
// Services × 1,000 nodes the per-node maps this replaced held 10 million
// slots (630 MB).
//
// A node state holds name n with slot
//
//	st.exc[n]                         if present, else
//	{names[n].common, names[n].trig}  if names[n].followers has st.id, else
//	nothing.
//
// The common value moves to another value once more states hold that
// value than follow the current one (rebase), so a change that reaches
// every node ends with the new value common and no exceptions left.

// nodeState is one node's state, published or staged.
type nodeState struct {
	id  int             // bit index in every name's followers
	exc map[string]slot // exceptions (see above)
	sys [16]byte        // XOR of the pair hashes of all held resources
	// held is the number of names held.
	held int
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
	nExc      int
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
	st := &nodeState{id: id, exc: map[string]slot{}}
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
	if sl, ok := st.exc[name]; ok {
		return sl, true
	}
	if ns := s.names[name]; ns != nil && ns.followers.has(st.id) {
		return slot{e: ns.common, trigger: ns.trig}, true
	}
	return slot{}, false
}

// hold makes st hold sl as name (st must not hold name). It acquires
// nothing: sl.e's reference is the caller's.
func (s *Store) hold(st *nodeState, name string, sl slot) {
	ns := s.names[name]
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
	st.exc[name] = sl
	ns.nExc++
	ns.count(sl)
	if ns.excCount[sl] > ns.nFollow {
		s.rebase(name, ns, sl)
	}
}

// unhold makes st hold nothing as name and releases the value's
// reference; a no-op if st does not hold name.
func (s *Store) unhold(st *nodeState, name string, ns *nameState) {
	var e *internEntry
	if sl, ok := st.exc[name]; ok {
		delete(st.exc, name)
		ns.nExc--
		ns.uncount(sl)
		e = sl.e
	} else if ns.followers.has(st.id) {
		ns.followers.clear(st.id)
		ns.nFollow--
		e = ns.common
	} else {
		return
	}
	st.held--
	wire.XORInto(&st.sys, e.pair)
	s.release(e)
	switch {
	case ns.nFollow+ns.nExc == 0:
		delete(s.names, name)
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
		s.rebase(name, ns, best)
	}
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

// rebase makes to the common value of name: the states holding exactly
// to follow it, the old followers keep their value as an exception. No
// state's content changes. O(states).
func (s *Store) rebase(name string, ns *nameState, to slot) {
	old := slot{e: ns.common, trigger: ns.trig}
	for _, st := range s.states {
		if st == nil {
			continue
		}
		switch {
		case ns.followers.has(st.id):
			ns.followers.clear(st.id)
			ns.nFollow--
			st.exc[name] = old
			ns.nExc++
			ns.count(old)
		case st.exc[name] == to:
			delete(st.exc, name)
			ns.nExc--
			ns.uncount(to)
			ns.followers.set(st.id)
			ns.nFollow++
		}
	}
	ns.common, ns.trig = to.e, to.trigger
}
