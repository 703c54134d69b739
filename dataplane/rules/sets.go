package rules

import (
	"fmt"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Set is one of the ipsets kube-proxy's IPVS proxier maintains. The same
// Set exists once per family: IPv6 names carry the "KUBE-6-" prefix.
type Set uint8

// The sets, in the order kube-proxy declares them (ipsetInfo).
const (
	SetLoopBack Set = iota + 1
	SetClusterIP
	SetExternalIP
	SetExternalIPLocal
	SetLoadBalancer
	SetLoadBalancerLocal
	SetLoadBalancerFW
	SetLoadBalancerSourceIP
	SetLoadBalancerSourceCIDR
	SetNodePortTCP
	SetNodePortLocalTCP
	SetNodePortUDP
	SetNodePortLocalUDP
	SetNodePortSCTP
	SetNodePortLocalSCTP
	SetHealthCheckNodePort
	SetIPVSIPs
	setEnd
)

type setInfo struct {
	name    string
	typ     kernel.SetType
	comment string
}

// setInfos mirrors kube-proxy's ipsetInfo: names, types and the comments
// its iptables rules carry.
var setInfos = [setEnd]setInfo{
	SetLoopBack:               {"KUBE-LOOP-BACK", kernel.HashIPPortIP, "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
	SetClusterIP:              {"KUBE-CLUSTER-IP", kernel.HashIPPort, "Kubernetes service cluster ip + port for masquerade purpose"},
	SetExternalIP:             {"KUBE-EXTERNAL-IP", kernel.HashIPPort, "Kubernetes service external ip + port for masquerade and filter purpose"},
	SetExternalIPLocal:        {"KUBE-EXTERNAL-IP-LOCAL", kernel.HashIPPort, "Kubernetes service external ip + port with externalTrafficPolicy=local"},
	SetLoadBalancer:           {"KUBE-LOAD-BALANCER", kernel.HashIPPort, "Kubernetes service lb portal"},
	SetLoadBalancerLocal:      {"KUBE-LOAD-BALANCER-LOCAL", kernel.HashIPPort, "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
	SetLoadBalancerFW:         {"KUBE-LOAD-BALANCER-FW", kernel.HashIPPort, "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
	SetLoadBalancerSourceIP:   {"KUBE-LOAD-BALANCER-SOURCE-IP", kernel.HashIPPortIP, "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
	SetLoadBalancerSourceCIDR: {"KUBE-LOAD-BALANCER-SOURCE-CIDR", kernel.HashIPPortNet, "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
	SetNodePortTCP:            {"KUBE-NODE-PORT-TCP", kernel.BitmapPort, "Kubernetes nodeport TCP port for masquerade purpose"},
	SetNodePortLocalTCP:       {"KUBE-NODE-PORT-LOCAL-TCP", kernel.BitmapPort, "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
	SetNodePortUDP:            {"KUBE-NODE-PORT-UDP", kernel.BitmapPort, "Kubernetes nodeport UDP port for masquerade purpose"},
	SetNodePortLocalUDP:       {"KUBE-NODE-PORT-LOCAL-UDP", kernel.BitmapPort, "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
	SetNodePortSCTP:           {"KUBE-NODE-PORT-SCTP-HASH", kernel.HashIPPort, "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
	SetNodePortLocalSCTP:      {"KUBE-NODE-PORT-LOCAL-SCTP-HASH", kernel.HashIPPort, "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
	SetHealthCheckNodePort:    {"KUBE-HEALTH-CHECK-NODE-PORT", kernel.BitmapPort, "Kubernetes health check node port"},
	SetIPVSIPs:                {"KUBE-IPVS-IPS", kernel.HashIP, "Addresses on the ipvs interface"},
}

// AllSets lists every Set in kube-proxy's order.
func AllSets() []Set {
	out := make([]Set, 0, setEnd-1)
	for s := Set(1); s < setEnd; s++ {
		out = append(out, s)
	}
	return out
}

// Valid reports whether s names a known set.
func (s Set) Valid() bool { return s > 0 && s < setEnd }

// Type is the ipset type of s.
func (s Set) Type() kernel.SetType {
	if !s.Valid() {
		return ""
	}
	return setInfos[s].typ
}

// Comment is the comment kube-proxy puts on the iptables rules matching s.
func (s Set) Comment() string {
	if !s.Valid() {
		return ""
	}
	return setInfos[s].comment
}

// Name is the set's name for family f ("KUBE-6-" prefix for IPv6).
func (s Set) Name(f kernel.Family) string {
	if !s.Valid() {
		return fmt.Sprintf("invalid-set-%d", uint8(s))
	}
	if f == kernel.FamilyIPv6 {
		// Like kube-proxy: replace the prefix, truncate to the kernel's limit
		// (KUBE-6-LOAD-BALANCER-SOURCE-CIDR becomes ...-SOURCE-CID).
		name := "KUBE-6-" + setInfos[s].name[len("KUBE-"):]
		return name[:min(len(name), kernel.MaxSetNameLen)]
	}
	return setInfos[s].name
}

func (s Set) String() string { return s.Name(kernel.FamilyIPv4) }

// Spec is the set header to create for family f, with kube-proxy's
// parameters: hashsize 1024 and maxelem 65536 for hash sets, range 0-65535
// for bitmap:port sets (which carry no family).
func (s Set) Spec(f kernel.Family) kernel.IPSet {
	spec := kernel.IPSet{Name: s.Name(f), Type: s.Type()}
	if spec.Type == kernel.BitmapPort {
		spec.PortFrom, spec.PortTo = 0, 65535
		return spec
	}
	spec.Family = f
	spec.HashSize = kernel.DefaultHashSize
	spec.MaxElem = kernel.DefaultMaxElem
	return spec
}

// SetMask is a set of Sets, e.g. the ones that currently have entries.
type SetMask uint32

// With returns m with s added.
func (m SetMask) With(s Set) SetMask { return m | 1<<s }

// Has reports whether s is in m.
func (m SetMask) Has(s Set) bool { return m&(1<<s) != 0 }
