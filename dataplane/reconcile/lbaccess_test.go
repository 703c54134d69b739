package reconcile

import (
	"slices"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// lbWithSourceRanges is an LB Service resource with loadBalancerSourceRanges
// as the control plane sends it; allowFromNode adds the SOURCE-IP entry that
// says one of the ranges contains the node's IP.
func lbWithSourceRanges(allowFromNode bool) *vsplanev1.Resource {
	const lb = "198.18.200.1"
	entry := func(set vsplanev1.IPSet) *vsplanev1.IPSetEntry {
		return &vsplanev1.IPSetEntry{Set: set, Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Ip: lb, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP}
	}
	cidr := entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR)
	cidr.Net = "198.19.0.200/29"
	entries := []*vsplanev1.IPSetEntry{entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER), entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_FW), cidr}
	if allowFromNode {
		src := entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_IP)
		src.Ip2 = lb
		entries = append(entries, src)
	}
	r := tcp("lb", lb, 80, be("198.19.1.2", 8080)).resource()
	st := r.GetService()
	st.VirtualServers[0].Kind = vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER
	st.VirtualServers[0].Binding = vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL
	st.VirtualServers[0].SourceRanges = []string{"198.19.0.200/29"}
	st.IpsetEntries = entries
	if allowFromNode {
		r.Version += "-allow"
	}
	return r
}

// The node's own connections to a source-restricted LB IP are scheduled by
// IPVS in OUTPUT, where the INPUT firewall never sees them: kube-proxy
// drops them in KUBE-IPVS-OUT-FILTER unless a range contains the node IP.
func TestLoadBalancerNoNodeAccessRules(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	drop := "-s 198.18.200.1/32 -m ipvs --vproto 6 --vaddr 198.18.200.1 --vport 80 -j DROP"

	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), lbWithSourceRanges(false))))
	if got := chainRules(t, mk, kernel.TableFilter, "KUBE-IPVS-OUT-FILTER"); !slices.Contains(got, drop) {
		t.Fatalf("KUBE-IPVS-OUT-FILTER = %q, want the node's access dropped: %q", got, drop)
	}

	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), lbWithSourceRanges(true))))
	if got := chainRules(t, mk, kernel.TableFilter, "KUBE-IPVS-OUT-FILTER"); len(got) != 0 {
		t.Fatalf("KUBE-IPVS-OUT-FILTER = %q, want empty when a range allows the node", got)
	}
}
