package stream

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The sent map plus acknowledged exceptions answers like two full maps,
// and keeps an exception only where the two differ.
func TestAckedOverlayMatchesTwoMaps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	st := &agentState{sent: newVersionSet(map[string]string{"a": "1", "b": "1"})}
	sent, acked := map[string]string{"a": "1", "b": "1"}, map[string]string{"a": "1", "b": "1"}
	for step := range 20000 {
		name := fmt.Sprintf("r%d", rng.IntN(8))
		v := fmt.Sprintf("v%d", rng.IntN(3))
		has := rng.IntN(4) != 0
		if rng.IntN(2) == 0 {
			st.setSent(name, v, has)
			if has {
				sent[name] = v
			} else {
				delete(sent, name)
			}
		} else {
			st.setAcked(name, v, has)
			if has {
				acked[name] = v
			} else {
				delete(acked, name)
			}
		}
		if !maps.Equal(st.sent.Map(), sent) || !maps.Equal(st.ackedAll(), acked) {
			t.Fatalf("step %d: sent %v acked %v, want %v %v", step, st.sent.Map(), st.ackedAll(), sent, acked)
		}
		if n := st.ackedLen(); n != len(acked) {
			t.Fatalf("step %d: ackedLen %d, want %d", step, n, len(acked))
		}
		for n, d := range st.ackDiff {
			if sv, ok := sent[n]; ok == d.has && (!ok || sv == d.v) {
				t.Fatalf("step %d: exception %s=%+v equals sent", step, n, d)
			}
		}
		for n := range 8 {
			name := fmt.Sprintf("r%d", n)
			v, ok := st.ackedOf(name)
			if wv, wok := acked[name]; v != wv || ok != wok {
				t.Fatalf("step %d: ackedOf(%s) = %q %v, want %q %v", step, name, v, ok, wv, wok)
			}
		}
	}
}

// A versionSet answers like a map through every mix of sets, removals and
// the rebuilds they trigger, keeps its base sorted and its changes to names
// that differ from the base.
func TestVersionSetMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, names := range []int{5, 300, 3000} {
		start := map[string]string{}
		for i := range names / 2 {
			start[fmt.Sprintf("r%05d", rng.IntN(names))] = fmt.Sprintf("v%d", i%3)
		}
		vs, want := newVersionSet(start), maps.Clone(start)
		for step := range 20 * names {
			name := fmt.Sprintf("r%05d", rng.IntN(names))
			v, has := fmt.Sprintf("v%d", rng.IntN(3)), rng.IntN(3) != 0
			vs.Set(name, v, has)
			if has {
				want[name] = v
			} else {
				delete(want, name)
			}
			if got, ok := vs.Get(name); got != want[name] || ok != has {
				t.Fatalf("%d names, step %d: Get(%s) = %q %v, want %q %v", names, step, name, got, ok, want[name], has)
			}
			if vs.Len() != len(want) {
				t.Fatalf("%d names, step %d: Len %d, want %d", names, step, vs.Len(), len(want))
			}
			if step%97 == 0 || step == 20*names-1 {
				if got := vs.Map(); !maps.Equal(got, want) {
					t.Fatalf("%d names, step %d: Map differs from the model", names, step)
				}
				if !slices.IsSortedFunc(vs.base, func(a, b pair) int { return strings.Compare(nameOf(a), nameOf(b)) }) {
					t.Fatalf("%d names, step %d: base not sorted", names, step)
				}
				for n, c := range vs.changed {
					if bv, bHas := vs.fromBase(n); bv == c.v && bHas == c.has {
						t.Fatalf("%d names, step %d: change %s=%+v equals the base", names, step, n, c)
					}
				}
				if len(vs.changed) > minCompact && len(vs.changed) > len(vs.base)/compactFraction {
					t.Fatalf("%d names, step %d: %d changes over a base of %d not folded", names, step, len(vs.changed), len(vs.base))
				}
			}
		}
	}
}
