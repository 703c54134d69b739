package stream

// What an agent holds, kept as one version set (versionset.go) plus the few
// names that differ.
//
// A stream tracks two views of its agent's resources: sent (what the agent
// holds or will hold once its in-flight Deltas apply; the next Delta is
// computed against it) and acknowledged (what its Acks confirmed; what
// inspection and the metrics report). They differ only in the names of
// in-flight Deltas and the NACKed ones, so the acknowledged view is stored
// as exceptions to sent: ackDiff holds a name only while its acknowledged
// version (or absence) differs from sent's. Two full maps per agent were
// the largest part of a replica's heap with 1,000 agents (e2e/fanout).
//
// Both live in agentState and are written by the stream's goroutine under
// st.mu; that goroutine reads sent without the lock (it is the only
// writer, and reads of a versionSet do not change it), the Registry reads
// both under it.

// ackedVersion is an acknowledged version, or its absence (!has).
type ackedVersion struct {
	v   string
	has bool
}

// ackedOf returns the acknowledged version of name. st.mu is held (or the
// caller is the stream's goroutine).
func (st *agentState) ackedOf(name string) (string, bool) {
	if d, ok := st.ackDiff[name]; ok {
		return d.v, d.has
	}
	return st.sent.Get(name)
}

// setAcked records name's acknowledged version (or absence). st.mu is held.
func (st *agentState) setAcked(name, v string, has bool) {
	if !has {
		v = ""
	}
	if sv, sHas := st.sent.Get(name); sHas == has && (!has || sv == v) {
		delete(st.ackDiff, name)
		if len(st.ackDiff) == 0 {
			// A Go map keeps its size when emptied: an agent in sync
			// would keep its largest in-flight window's worth.
			st.ackDiff = nil
		}
		return
	}
	if st.ackDiff == nil {
		st.ackDiff = map[string]ackedVersion{}
	}
	st.ackDiff[name] = ackedVersion{v, has}
}

// setSent records that name was sent at version v (has) or removed
// (!has), leaving its acknowledged version as it was. st.mu is held.
func (st *agentState) setSent(name, v string, has bool) {
	av, aHas := st.ackedOf(name)
	st.sent.Set(name, v, has)
	st.setAcked(name, av, aHas)
}

// ackedAll returns a copy of every acknowledged version. st.mu is held.
func (st *agentState) ackedAll() map[string]string {
	out := st.sent.Map()
	for name, d := range st.ackDiff {
		if d.has {
			out[name] = d.v
		} else {
			delete(out, name)
		}
	}
	return out
}

// ackedLen is len(ackedAll()) without the copy. st.mu is held.
func (st *agentState) ackedLen() int {
	n := st.sent.Len()
	for name, d := range st.ackDiff {
		_, inSent := st.sent.Get(name)
		switch {
		case d.has && !inSent:
			n++
		case !d.has && inSent:
			n--
		}
	}
	return n
}
