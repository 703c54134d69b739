package agent

import (
	"context"
	"net/netip"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

// --ipv6 auto: IPv6 is managed when, and only when, the node has a global
// IPv6 address on a real interface; Capabilities says what was decided.
func TestIPv6Detection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs map[string][]string
		want  bool
	}{
		{"IPv4 only", map[string][]string{"eth0": {"198.19.0.11/24"}}, false},
		{"link-local and loopback IPv6 only", map[string][]string{"eth0": {"198.19.0.11/24", "fe80::1/64"}, "lo": {"::1/128"}}, false},
		{"only on kube-ipvs0 (a Service address)", map[string][]string{"eth0": {"198.19.0.11/24"}, "kube-ipvs0": {"2001:2::10/128"}}, false},
		{"a global IPv6 address", map[string][]string{"eth0": {"198.19.0.11/24", "2001:2:0:100::11/64"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.New()
			for dev, addrs := range tc.addrs {
				var ps []netip.Prefix
				for _, a := range addrs {
					ps = append(ps, netip.MustParsePrefix(a))
				}
				mem.AddInterface(dev, "veth", ps...)
			}
			k := mem.Kernel()
			a, err := New(context.Background(), Config{ControlPlane: []string{"127.0.0.1:1"}, NodeName: "n1", Kernel: &k,
				DetectIPv6: true, Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			if got := a.capabilities().GetIpv6(); got != tc.want {
				t.Fatalf("ipv6 = %v, want %v", got, tc.want)
			}
		})
	}
}
