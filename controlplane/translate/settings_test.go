package translate

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/controlplane/model"
)

// TestServiceReadsOnlyNodePortAddresses checks the contract of
// UsesNodePortAddresses: changing every other Config field never changes
// a Service's translation, and NodePortAddresses only for the Services it
// names.
func TestServiceReadsOnlyNodePortAddresses(t *testing.T) {
	node := &model.Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("198.19.0.11")}}
	base := Config{}.WithDefaults()
	others := Config{DefaultScheduler: "wlc", TCPTimeout: time.Minute, TCPFinTimeout: time.Second, UDPTimeout: time.Second,
		StrictARP: true, MasqueradeAll: true, MasqueradeBit: 3, ReconcilePeriod: time.Minute,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16")}, ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.200.0/24")}}
	npa := base
	npa.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("198.19.9.0/24")}
	svc := func(lb bool) *model.Service {
		s := &model.Service{Key: model.ServiceKey{Namespace: "ns", Name: "s"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10")},
			Ports: []model.ServicePort{{Name: "p", Protocol: model.TCP, Port: 30080, NodePort: 30080}}}
		if lb {
			s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.19.0.11")}
		}
		return s
	}
	for _, lb := range []bool{false, true} {
		in := Input{Service: svc(lb)}
		ref := Service(in, node, base)
		if got := Service(in, node, others); !proto.Equal(ref, got) {
			t.Errorf("lb=%v: fields other than NodePortAddresses changed the translation", lb)
		}
		changed := !proto.Equal(ref, Service(in, node, npa))
		if uses := UsesNodePortAddresses(in.Service); changed && !uses || uses != lb {
			t.Errorf("lb=%v: NodePortAddresses changed output %v, UsesNodePortAddresses %v", lb, changed, uses)
		}
		if lb && !changed {
			t.Errorf("fixture: NodePortAddresses did not matter for the load-balancer IP on a node address")
		}
	}
}

// TestNodePortPrimary: "primary" adds each node's first address of each
// family to the node's NodePort CIDRs, and an external IP is a NodePort
// address when it is in a CIDR of its family, or its family has none.
func TestNodePortPrimary(t *testing.T) {
	cfg := Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.18.240.0/24")}, NodePortPrimary: true}
	node := &model.Node{Name: "n1", Addresses: []netip.Addr{
		netip.MustParseAddr("198.19.0.11"), netip.MustParseAddr("198.19.0.99"), netip.MustParseAddr("2001:2:0:100::11")}}
	got := NodeSettings(node, cfg).GetNodePortAddresses()
	if want := []string{"198.18.240.0/24", "198.19.0.11/32", "2001:2:0:100::11/128"}; !slices.Equal(got, want) {
		t.Errorf("node settings: %v, want %v", got, want)
	}
	if got := NodeSettings(&model.Node{Name: "bare"}, cfg).GetNodePortAddresses(); !slices.Equal(got, []string{"198.18.240.0/24"}) {
		t.Errorf("node without addresses: %v, want only the configured CIDR", got)
	}
	tr := &translation{node: node, cfg: cfg}
	for addr, want := range map[string]bool{"198.19.0.11": true, "198.19.0.99": false, "2001:2:0:100::11": true} {
		if got := tr.isNodePortAddress(netip.MustParseAddr(addr)); got != want {
			t.Errorf("isNodePortAddress(%s) = %v, want %v", addr, got, want)
		}
	}
	v4only := &translation{node: node, cfg: Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.19.0.99/32")}}}
	for addr, want := range map[string]bool{"198.19.0.11": false, "198.19.0.99": true, "2001:2:0:100::11": true} {
		if got := v4only.isNodePortAddress(netip.MustParseAddr(addr)); got != want {
			t.Errorf("IPv4 CIDR only: isNodePortAddress(%s) = %v, want %v (no CIDR of a family: all of it)", addr, got, want)
		}
	}
	if NodePortSelectionEqual(cfg, Config{NodePortAddresses: cfg.NodePortAddresses}) {
		t.Error("NodePortSelectionEqual ignores NodePortPrimary")
	}
}
