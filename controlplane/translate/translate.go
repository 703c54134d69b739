// Package translate computes a node's desired state from the cluster model.
// Everything here is a pure function of its arguments: no clients, no clock,
// no globals. Output is deterministic (sorted), so equal inputs give equal
// encodings and equal content-hash versions.
//
// Semantics follow kube-proxy's IPVS proxier (pkg/proxy/ipvs/proxier.go)
// unless a comment says we deliberately differ.
package translate

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/controlplane/model"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Input is one Service and what belongs to it.
type Input struct {
	Service *model.Service
	// Slices of the Service, any order, any family.
	Slices []*model.EndpointSlice
	// Problems found while converting the Service and its slices; copied to
	// ServiceState.problems so the inspection API shows them.
	Problems []string
}

// Variants tells which nodes get identical ServiceStates for one Input, so
// the caller translates once per distinct key instead of once per node.
// Nodes with equal Key(node) get equal output from Service(in, node, cfg).
type Variants struct {
	endpointNodes map[string]struct{}
}

// VariantsOf computes the variants of in.
func VariantsOf(in Input) Variants {
	v := Variants{}
	for _, s := range in.Slices {
		for i := range s.Endpoints {
			if n := s.Endpoints[i].NodeName; n != "" {
				if v.endpointNodes == nil {
					v.endpointNodes = map[string]struct{}{}
				}
				v.endpointNodes[n] = struct{}{}
			}
		}
	}
	return v
}

// Key returns node's variant key; "" is the variant of every node that hosts
// none of the Service's endpoints. (Topology-aware routing will add zone
// keys here; nodes hosting endpoints stay per node.)
func (v Variants) Key(node *model.Node) string {
	if _, ok := v.endpointNodes[node.Name]; ok {
		return "node/" + node.Name
	}
	return ""
}

// PerNode returns the names of the nodes that have their own variant.
func (v Variants) PerNode() []string {
	out := make([]string, 0, len(v.endpointNodes))
	for n := range v.endpointNodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Service returns what in.Service asks of node. A nil Service gives nil.
func Service(in Input, node *model.Node, cfg Config) *vsplanev1.ServiceState {
	svc := in.Service
	if svc == nil {
		return nil
	}
	st := &vsplanev1.ServiceState{
		Namespace: svc.Key.Namespace,
		Name:      svc.Key.Name,
		Problems:  slices.Clone(in.Problems),
	}
	var sets ipsetBuilder
	localReady := map[netip.Addr]struct{}{}
	for _, clusterIP := range svc.ClusterIPs {
		fam := model.FamilyOf(clusterIP)
		for _, sp := range svc.Ports {
			eps := endpointsFor(in.Slices, fam, sp, node.Name)
			for i := range eps {
				if eps[i].local && eps[i].ready {
					localReady[eps[i].addr] = struct{}{}
				}
			}
			// Hairpin: a local endpoint reaching itself through the
			// Service is masqueraded. kube-proxy adds every local endpoint
			// of the port, whatever its conditions.
			for i := range eps {
				if eps[i].local {
					sets.add(&vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_LOOP_BACK, Family: family(fam),
						Ip: eps[i].addr.String(), Port: uint32(eps[i].port), Protocol: protocol(sp.Protocol), Ip2: eps[i].addr.String()})
				}
			}
			sets.add(&vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP, Family: family(fam),
				Ip: clusterIP.String(), Port: uint32(sp.Port), Protocol: protocol(sp.Protocol)})

			vs := newVirtualServer(svc, sp, fam)
			vs.Kind = vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP
			vs.Address = clusterIP.String()
			vs.Binding = vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS
			vs.TrafficPolicy = policy(svc.InternalTrafficPolicy)
			vs.RealServers, vs.Reject = pick(eps, svc.InternalTrafficPolicy)
			st.VirtualServers = append(st.VirtualServers, vs)
		}
	}
	st.IpsetEntries = sets.sorted()
	st.LocalEndpoints = uint32(len(localReady))
	return st
}

// newVirtualServer fills what every kind of virtual server of a port shares.
func newVirtualServer(svc *model.Service, sp model.ServicePort, fam model.Family) *vsplanev1.VirtualServer {
	vs := &vsplanev1.VirtualServer{
		Family:   family(fam),
		Port:     uint32(sp.Port),
		Protocol: protocol(sp.Protocol),
		PortName: sp.Name,
		// Scheduler stays "": the node default from NodeSettings. The agent
		// adds the mh-port flag when the effective scheduler is "mh".
	}
	if svc.Sticky {
		vs.Flags = append(vs.Flags, vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT)
		vs.PersistenceTimeoutSeconds = svc.StickyTimeoutSeconds
	}
	return vs
}

// pick chooses the real servers for a virtual server under policy p.
// Cluster: the ready endpoints. Local: the local ready endpoints; if there is
// none, reject (kube-proxy IPVS falls back to all endpoints, kubernetes#97081;
// like the nftables proxier we do not).
func pick(eps []endpoint, p model.TrafficPolicy) ([]*vsplanev1.RealServer, bool) {
	var out []*vsplanev1.RealServer
	for i := range eps {
		e := &eps[i]
		if !e.ready || (p == model.PolicyLocal && !e.local) {
			continue
		}
		out = append(out, &vsplanev1.RealServer{
			Address: e.addr.String(), Port: uint32(e.port), Weight: 1, Local: e.local,
			Ready: e.ready, Serving: e.serving, Terminating: e.terminating, Reason: "ready",
		})
	}
	reject := p == model.PolicyLocal && len(out) == 0
	return out, reject
}

// endpoint is one endpoint of one Service port.
type endpoint struct {
	addr                        netip.Addr
	port                        uint16
	ready, serving, terminating bool
	local                       bool
	nodeName, zone              string
	forZones, forNodes          []string
}

// endpointsFor returns the endpoints of port sp in family fam, deduplicated by
// address:port and sorted. Slices are visited in name order; a duplicate
// replaces an earlier one unless it is terminating (kube-proxy prefers the
// non-terminating copy of an endpoint seen in two slices).
func endpointsFor(sl []*model.EndpointSlice, fam model.Family, sp model.ServicePort, nodeName string) []endpoint {
	ordered := make([]*model.EndpointSlice, 0, len(sl))
	for _, s := range sl {
		if s.Family == fam {
			ordered = append(ordered, s)
		}
	}
	slices.SortFunc(ordered, func(a, b *model.EndpointSlice) int { return cmp.Compare(a.Key.Name, b.Key.Name) })
	type ap struct {
		a netip.Addr
		p uint16
	}
	idx := map[ap]int{}
	var out []endpoint
	for _, s := range ordered {
		for _, p := range s.Ports {
			if p.Name != sp.Name || p.Protocol != sp.Protocol {
				continue
			}
			for i := range s.Endpoints {
				e := &s.Endpoints[i]
				ep := endpoint{addr: e.Address, port: p.Port, ready: e.Ready, serving: e.Serving, terminating: e.Terminating,
					local: nodeName != "" && e.NodeName == nodeName, nodeName: e.NodeName, zone: e.Zone,
					forZones: e.ForZones, forNodes: e.ForNodes}
				k := ap{e.Address, p.Port}
				if j, dup := idx[k]; dup {
					if !ep.terminating {
						out[j] = ep
					}
					continue
				}
				idx[k] = len(out)
				out = append(out, ep)
			}
		}
	}
	slices.SortFunc(out, func(a, b endpoint) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		return cmp.Compare(a.port, b.port)
	})
	return out
}

// ipsetBuilder collects ipset entries without duplicates.
type ipsetBuilder struct {
	entries []*vsplanev1.IPSetEntry
}

func (b *ipsetBuilder) add(e *vsplanev1.IPSetEntry) { b.entries = append(b.entries, e) }

func (b *ipsetBuilder) sorted() []*vsplanev1.IPSetEntry {
	slices.SortFunc(b.entries, compareEntry)
	return slices.CompactFunc(b.entries, func(x, y *vsplanev1.IPSetEntry) bool { return compareEntry(x, y) == 0 })
}

func compareEntry(x, y *vsplanev1.IPSetEntry) int {
	return cmp.Or(
		cmp.Compare(x.Set, y.Set),
		cmp.Compare(x.Family, y.Family),
		compareIP(x.Ip, y.Ip),
		cmp.Compare(x.Port, y.Port),
		cmp.Compare(x.Protocol, y.Protocol),
		compareIP(x.Ip2, y.Ip2),
		cmp.Compare(x.Net, y.Net),
		compareBool(x.NodePortAddresses, y.NodePortAddresses),
	)
}

func compareIP(a, b string) int {
	pa, ea := netip.ParseAddr(a)
	pb, eb := netip.ParseAddr(b)
	if ea == nil && eb == nil {
		return pa.Compare(pb)
	}
	return cmp.Compare(a, b)
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func family(f model.Family) vsplanev1.IPFamily {
	switch f {
	case model.IPv4:
		return vsplanev1.IPFamily_IP_FAMILY_IPV4
	case model.IPv6:
		return vsplanev1.IPFamily_IP_FAMILY_IPV6
	}
	return vsplanev1.IPFamily_IP_FAMILY_UNSPECIFIED
}

func protocol(p model.Protocol) vsplanev1.Protocol {
	switch p {
	case model.TCP:
		return vsplanev1.Protocol_PROTOCOL_TCP
	case model.UDP:
		return vsplanev1.Protocol_PROTOCOL_UDP
	case model.SCTP:
		return vsplanev1.Protocol_PROTOCOL_SCTP
	}
	return vsplanev1.Protocol_PROTOCOL_UNSPECIFIED
}

func policy(p model.TrafficPolicy) vsplanev1.TrafficPolicy {
	if p == model.PolicyLocal {
		return vsplanev1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	return vsplanev1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
}
