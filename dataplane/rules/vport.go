package rules

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// VirtualPort is a virtual server's address, port and protocol.
type VirtualPort struct {
	IP       netip.Addr
	Port     uint16
	Protocol kernel.Protocol
}

func (v VirtualPort) String() string {
	return fmt.Sprintf("%s/%d", netip.AddrPortFrom(v.IP, v.Port), v.Protocol) // e.g. 198.18.200.1:80/6
}

func (v VirtualPort) validate(f kernel.Family) error {
	switch {
	case kernel.CheckAddr(v.IP) != nil:
		// A zone would be written verbatim into the rule.
		return fmt.Errorf("rules: load balancer address %q: %w", v.IP.String(), kernel.CheckAddr(v.IP))
	case kernel.FamilyOf(v.IP.Unmap()) != f:
		return fmt.Errorf("rules: load balancer address %v is not %v: %w", v.IP, f, kernel.ErrInvalid)
	case v.Port == 0:
		return fmt.Errorf("rules: load balancer %v has port 0: %w", v.IP, kernel.ErrInvalid)
	case !v.Protocol.Valid():
		return fmt.Errorf("rules: load balancer %v has protocol %v: %w", v.IP, v.Protocol, kernel.ErrInvalid)
	}
	return nil
}

func compareVirtualPorts(a, b VirtualPort) int {
	return cmp.Or(a.IP.Compare(b.IP), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}

// NoNodeAccess returns Input.LoadBalancerNoNodeAccess from the entries of
// KUBE-LOAD-BALANCER-FW (fw: ip,port,proto of each LB with source ranges)
// and KUBE-LOAD-BALANCER-SOURCE-IP (sourceIP: ip,port,proto,ip2, present
// exactly when one of the ranges contains the node IP, kube-proxy's
// allowFromNode): the fw entries without a sourceIP entry, sorted, once.
func NoNodeAccess(fw, sourceIP []kernel.Entry) []VirtualPort {
	allowed := map[VirtualPort]bool{}
	for _, e := range sourceIP {
		allowed[VirtualPort{e.IP.Unmap(), e.Port, e.Protocol}] = true
	}
	var out []VirtualPort
	for _, e := range fw {
		vp := VirtualPort{e.IP.Unmap(), e.Port, e.Protocol}
		if !allowed[vp] {
			out = append(out, vp)
		}
	}
	sortCompact(&out)
	return out
}

func sortCompact(vps *[]VirtualPort) {
	slices.SortFunc(*vps, compareVirtualPorts)
	*vps = slices.Compact(*vps)
}
