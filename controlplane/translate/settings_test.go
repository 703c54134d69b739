package translate

import (
	"net/netip"
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
