package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// modelSlot is what the reference model says a node holds for a name.
type modelSlot struct {
	version string
	trigger time.Time
}

// model is the obvious per-node map the compact holdings must behave like.
type model struct {
	published map[string]map[string]modelSlot
	staged    map[string]map[string]modelSlot
}

func (m *model) target(node string) (map[string]modelSlot, bool) {
	if st, ok := m.staged[node]; ok {
		return st, true
	}
	st, ok := m.published[node]
	return st, ok
}

// TestHoldingsMatchPerNodeModel drives the store and a plain per-node
// model with the same random batches (sets of a few values shared by many
// nodes, node-specific values, deletes, node churn, staging) and compares
// every node's List, versions, trigger times and system version after each
// Commit. The wide shape has more than 64 nodes (bitsets of several words,
// ids reused across them), big batches, Fill and staging triggers.
func TestHoldingsMatchPerNodeModel(t *testing.T) {
	for _, shape := range []struct {
		name                string
		seeds               uint64
		nodes, svcs, rounds int
		maxOps              int
		fillAndTriggers     bool
	}{
		{"narrow", 1, 8, 5, 400, 12, false},
		{"wide", 4, 150, 3, 300, 200, true},
	} {
		for _, groups := range []int{0, 1, 8} {
			t.Run(fmt.Sprintf("%s/groups=%d", shape.name, groups), func(t *testing.T) {
				defer func(was int) { maxGroups = was }(maxGroups)
				maxGroups = groups
				for seed := range shape.seeds {
					var nodes []string
					for i := range shape.nodes {
						nodes = append(nodes, fmt.Sprintf("n%03d", i))
					}
					svcs := []string{"a", "b", "c", "d", "e"}[:shape.svcs]
					holdingsModelRun(t, rand.New(rand.NewPCG(seed+1, 2)), nodes, svcs, shape.rounds, shape.maxOps, shape.fillAndTriggers)
				}
			})
		}
	}
}

func holdingsModelRun(t *testing.T, rng *rand.Rand, nodes, svcs []string, rounds, maxOps int, fillAndTriggers bool) {
	s := NewStore()
	m := &model{published: map[string]map[string]modelSlot{}, staged: map[string]map[string]modelSlot{}}
	stageTrig := map[string]time.Time{}
	values := map[string]*vsplanev1.Resource{}
	value := func(svc string, v int) *vsplanev1.Resource {
		k := fmt.Sprint(svc, v)
		if r, ok := values[k]; ok {
			return r
		}
		r := svcRes(t, svc, fmt.Sprintf("198.18.0.%d", v+1))
		values[k] = r
		return r
	}
	for round := range rounds {
		var b Batch
		for range 1 + rng.IntN(maxOps) {
			node := nodes[rng.IntN(len(nodes))]
			svc := svcs[rng.IntN(len(svcs))]
			trig := time.Unix(int64(rng.IntN(3)), 0)
			// set writes res with Set, or with Fill (the trigger the node
			// was staged with, none on a published node).
			set := func(res *vsplanev1.Resource, fill bool) {
				tr := trig
				if fill {
					b.Fill(node, res)
					tr = time.Time{}
					if _, staged := m.staged[node]; staged {
						tr = stageTrig[node]
					}
				} else {
					b.Set(node, res, trig)
				}
				if st, ok := m.target(node); ok {
					if cur, ok := st[res.Name]; !ok || cur.version != res.Version {
						st[res.Name] = modelSlot{res.Version, tr}
					}
				}
			}
			fill := fillAndTriggers && rng.IntN(3) == 0
			switch r := rng.IntN(100); {
			case r < 50: // mostly shared values
				set(value(svc, rng.IntN(2)), fill)
			case r < 62: // node-specific values
				set(value(svc, 10+rng.IntN(40)), fill)
			case r < 75:
				name := ServiceName("ns", svc)
				b.Delete(node, name)
				if st, ok := m.target(node); ok {
					delete(st, name)
				}
			case r < 80: // a new node, published empty
				_, published := m.published[node]
				if _, staged := m.staged[node]; !published && !staged {
					addNode(&b, node)
					m.published[node] = map[string]modelSlot{}
				}
			case r < 84:
				b.RemoveNode(node)
				delete(m.published, node)
				delete(m.staged, node)
			case r < 92:
				var tt time.Time
				if fillAndTriggers && rng.IntN(3) > 0 {
					tt = time.Unix(int64(5+rng.IntN(3)), 0)
				}
				b.StageNode(node, tt)
				m.staged[node] = map[string]modelSlot{}
				stageTrig[node] = tt
			default:
				b.PublishNode(node)
				if next, ok := m.staged[node]; ok {
					for name, sl := range next {
						if old, ok := m.published[node][name]; ok && old.version == sl.version {
							next[name] = old
						}
					}
					m.published[node] = next
					delete(m.staged, node)
				}
			}
		}
		s.Commit(&b)
		checkAgainstModel(t, round, s, m, nodes)
	}
	// Every node to the same values: nothing needs to be stored per node.
	var b Batch
	for _, n := range nodes {
		addNode(&b, n)
		for _, svc := range svcs {
			b.Set(n, value(svc, 7), time.Unix(99, 0))
		}
	}
	s.Commit(&b)
	if st := s.Stats(); st.Exceptions != 0 {
		t.Errorf("every node holds the same values, yet %d exceptions are stored: %+v", st.Exceptions, st)
	}
}

func checkAgainstModel(t *testing.T, round int, s *Store, m *model, nodes []string) {
	t.Helper()
	for _, n := range nodes {
		want, known := m.published[n]
		got, sys, ok := s.List(n)
		if ok != known {
			t.Fatalf("round %d: node %s known=%v, model says %v", round, n, ok, known)
		}
		if !ok {
			continue
		}
		var wantNames []string
		var x [16]byte
		for name, sl := range want {
			wantNames = append(wantNames, name)
			sum := sha256.Sum256([]byte(name + "\x00" + sl.version))
			var pair [16]byte
			copy(pair[:], sum[:16])
			for i := range x {
				x[i] ^= pair[i]
			}
		}
		slices.Sort(wantNames)
		if g := names(got); !slices.Equal(g, wantNames) {
			t.Fatalf("round %d: node %s lists %v, want %v", round, n, g, wantNames)
		}
		for _, e := range got {
			r := e.Resource
			if r.Version != want[r.Name].version {
				t.Fatalf("round %d: node %s %s version %s, want %s", round, n, r.Name, r.Version, want[r.Name].version)
			}
			if tt := e.Trigger; !tt.Equal(want[r.Name].trigger) && !(tt.IsZero() && want[r.Name].trigger.Unix() == 0) {
				t.Fatalf("round %d: node %s %s trigger %v, want %v", round, n, r.Name, tt, want[r.Name].trigger)
			}
		}
		if sys != hex.EncodeToString(x[:]) {
			t.Fatalf("round %d: node %s system version %s, want %s", round, n, sys, hex.EncodeToString(x[:]))
		}
	}
	checkHoldings(t, round, s)
	// Every value is referenced exactly by its holders (published and staged).
	refs := map[*internEntry]int{}
	for _, st := range s.states {
		if st == nil {
			continue
		}
		for name := range s.names {
			if sl, ok := s.get(st, name); ok {
				refs[sl.e]++
			}
		}
	}
	for k, e := range s.intern {
		if refs[e] != e.refs {
			t.Fatalf("round %d: %v has %d references, %d holders", round, k, e.refs, refs[e])
		}
	}
	if len(refs) != len(s.intern) {
		t.Fatalf("round %d: %d values held, %d interned", round, len(refs), len(s.intern))
	}
}

// checkHoldings checks the bookkeeping of holdings.go: the counts kept per
// name and per state match what the bitsets and exception maps hold, only
// live states hold anything, and no exception repeats the common slot.
func checkHoldings(t *testing.T, round int, s *Store) {
	t.Helper()
	held := map[int]int{}
	exc := map[int]int{}
	for name, ns := range s.names {
		follow := 0
		ns.followers.each(func(id int) {
			if id >= len(s.states) || s.states[id] == nil {
				t.Fatalf("round %d: %s followed by free state id %d", round, name, id)
			}
			follow++
			held[id]++
		})
		if follow != ns.nFollow {
			t.Fatalf("round %d: %s: %d followers in the bitset, nFollow %d", round, name, follow, ns.nFollow)
		}
		if len(ns.groups) > maxGroups {
			t.Fatalf("round %d: %s has %d groups, more than %d", round, name, len(ns.groups), maxGroups)
		}
		for i, g := range ns.groups {
			members := 0
			g.members.each(func(id int) {
				if id >= len(s.states) || s.states[id] == nil {
					t.Fatalf("round %d: %s: group %d has free state id %d", round, name, i, id)
				}
				if ns.followers.has(id) || ns.memberOf(id) != i {
					t.Fatalf("round %d: %s: state %d is in group %d and follows or is in another group", round, name, id, i)
				}
				if _, ok := ns.exc[id]; ok {
					t.Fatalf("round %d: %s: state %d is in group %d and in the exception map", round, name, id, i)
				}
				members++
				held[id]++
			})
			if members != g.n || g.n < 2 {
				t.Fatalf("round %d: %s: group %d has %d members, counts %d (a group has two or more)", round, name, i, members, g.n)
			}
			if g.sl == (slot{e: ns.common, trigger: ns.trig}) || ns.groupOf(g.sl) != i || ns.excCount[g.sl] != 0 {
				t.Fatalf("round %d: %s: group %d's value is the common one, another group's or in the exception map", round, name, i)
			}
		}
		counts := map[slot]int{}
		for id, sl := range ns.exc {
			if id >= len(s.states) || s.states[id] == nil {
				t.Fatalf("round %d: %s has an exception of free state id %d", round, name, id)
			}
			if ns.followers.has(id) {
				t.Fatalf("round %d: %s: state %d both follows and has an exception", round, name, id)
			}
			if sl == (slot{e: ns.common, trigger: ns.trig}) {
				t.Fatalf("round %d: %s: state %d holds the common slot as an exception", round, name, id)
			}
			counts[sl]++
			held[id]++
			exc[id]++
		}
		if !maps.Equal(counts, ns.excCount) && !(len(counts) == 0 && ns.excCount == nil) {
			t.Fatalf("round %d: %s: exception counts %v, kept %v", round, name, counts, ns.excCount)
		}
		if ns.holders() == 0 {
			t.Fatalf("round %d: %s is held by nobody but kept", round, name)
		}
	}
	for id, st := range s.states {
		if st == nil {
			continue
		}
		if st.held != held[id] || st.nExc != exc[id] {
			t.Fatalf("round %d: state %d counts held=%d nExc=%d, holds %d with %d exceptions", round, id, st.held, st.nExc, held[id], exc[id])
		}
	}
}
