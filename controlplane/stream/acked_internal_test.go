package stream

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
)

// The sent map plus acknowledged exceptions answers like two full maps,
// and keeps an exception only where the two differ.
func TestAckedOverlayMatchesTwoMaps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	st := &agentState{sent: map[string]string{"a": "1", "b": "1"}}
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
		if !maps.Equal(st.sent, sent) || !maps.Equal(st.ackedAll(), acked) {
			t.Fatalf("step %d: sent %v acked %v, want %v %v", step, st.sent, st.ackedAll(), sent, acked)
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
