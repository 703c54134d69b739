package cluster

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestKubeProxyCIDRs(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{"198.19.1.0/24"}, []string{"198.19.1.0/24"}},
		{[]string{"198.19.1.0/24", "198.19.2.0/24"}, []string{"198.19.0.0/22"}},
		{[]string{"198.19.2.0/24", "198.19.3.0/24"}, []string{"198.19.2.0/23"}},
		{[]string{"198.19.1.0/24", "198.19.0.0/16"}, []string{"198.19.0.0/16"}},
		{[]string{"198.19.1.0/24", "2001:2:0:101::/64", "198.19.2.0/24", "2001:2:0:102::/64"},
			[]string{"198.19.0.0/22", "2001:2:0:100::/62"}},
	} {
		var in []netip.Prefix
		for _, s := range tc.in {
			in = append(in, netip.MustParsePrefix(s))
		}
		if diff := cmp.Diff(tc.want, kubeProxyCIDRs(in)); diff != "" {
			t.Errorf("kubeProxyCIDRs(%v) (-want +got):\n%s", tc.in, diff)
		}
	}
}
