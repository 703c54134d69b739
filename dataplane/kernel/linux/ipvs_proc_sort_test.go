package linux

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// sortDestinations takes the reverse-order fast path and the general sort;
// both must end in key order.
func TestSortDestinations(t *testing.T) {
	var want []kernel.Destination
	for i := range 12 {
		want = append(want, kernel.Destination{Address: netip.AddrFrom4([4]byte{198, 19, byte(i / 4), byte(i)}), Port: uint16(8080 + i%2), Weight: 1})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	cases := map[string][]kernel.Destination{
		"sorted":   slices.Clone(want),
		"reversed": slices.Clone(want),
		"empty":    nil,
		"one":      slices.Clone(want[:1]),
	}
	slices.Reverse(cases["reversed"])
	for i := range 20 {
		s := slices.Clone(want)
		rng.Shuffle(len(s), func(a, b int) { s[a], s[b] = s[b], s[a] })
		cases["shuffled-"+string(rune('a'+i))] = s
	}
	for name, ds := range cases {
		sortDestinations(ds)
		if !slices.Equal(ds, want[:len(ds)]) {
			t.Errorf("%s: got %v", name, ds)
		}
	}
}
