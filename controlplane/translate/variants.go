package translate

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/controlplane/model"
)

// Variants tells which nodes get identical ServiceStates for one Input, so
// the caller translates once per distinct key instead of once per node.
//
// Contract: nodes with equal Key(node) get equal output from
// Service(in, node, cfg) for the same in and cfg. Key "" is the variant of
// every node the Service treats alike (no local endpoints, no topology
// hint for its zone, no address that matters to the Service).
type Variants struct {
	// Nodes hosting endpoints or named in node hints: their own variant.
	perNode map[string]struct{}
	// Zones named in zone hints: one variant per such zone (its key part).
	zones map[string]string
	// LB source ranges (non-zero, of families with LB IPs): a node with an
	// address inside one allows itself (LOAD_BALANCER_SOURCE_IP entries).
	ranges []netip.Prefix
	// External/LB IPs whose port equals one of the Service's NodePorts: a
	// node holding such an address has a per-node collision to report.
	claimed map[netip.Addr]struct{}
	// rollouts: the SchedulerRollouts selecting the Service (nodes a rollout
	// reached share one variant per rollout that decides their scheduler),
	// and their key parts. Key parts are built here, once, not per node:
	// a rollout step asks a key of every Service on every node it reaches.
	rollouts    []*Rollout
	rolloutKeys []string
}

// lbSourceKeys are the key parts of nodes allowed by LB source ranges.
var lbSourceKeys = map[model.Family]string{
	model.IPv4: "lb-source/" + model.IPv4.String(),
	model.IPv6: "lb-source/" + model.IPv6.String(),
}

// VariantsOf computes the variants of in.
func VariantsOf(in Input) Variants {
	v := Variants{}
	add := func(m *map[string]struct{}, k string) {
		if k == "" {
			return
		}
		if *m == nil {
			*m = map[string]struct{}{}
		}
		(*m)[k] = struct{}{}
	}
	for _, s := range in.Slices {
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			add(&v.perNode, e.NodeName)
			for _, n := range e.ForNodes {
				add(&v.perNode, n)
			}
			for _, z := range e.ForZones {
				if z == "" {
					continue
				}
				if v.zones == nil {
					v.zones = map[string]string{}
				}
				v.zones[z] = "zone/" + z
			}
		}
	}
	svc := in.Service
	if svc == nil {
		return v
	}
	if svc.Scheduler == "" {
		v.rollouts = in.Rollouts
		for _, r := range in.Rollouts {
			v.rolloutKeys = append(v.rolloutKeys, "rollout/"+r.Name)
		}
	}
	for _, f := range []model.Family{model.IPv4, model.IPv6} {
		if ranges, _ := sourceRanges(svc, f); len(ranges) > 0 && slices.ContainsFunc(svc.LoadBalancerIPs, isFamily(f)) {
			v.ranges = append(v.ranges, ranges...)
		}
	}
	if slices.ContainsFunc(svc.Ports, func(sp model.ServicePort) bool {
		_, ok := nodePortClaiming(svc, in.Conflicts, sp.Port, sp.Protocol)
		return ok
	}) {
		v.claimed = map[netip.Addr]struct{}{}
		for _, ip := range svc.ExternalIPs {
			if in.Conflicts.keepsExternalIP(ip) {
				v.claimed[ip] = struct{}{}
			}
		}
		for _, ip := range svc.LoadBalancerIPs {
			v.claimed[ip] = struct{}{}
		}
	}
	return v
}

// perNodePrefix starts the keys only one node has (see Shared).
const perNodePrefix = "node/"

// Shared reports whether key (from Key) can be shared by several nodes, so
// caching its output is worth it; per-node keys are not.
func Shared(key string) bool { return !strings.HasPrefix(key, perNodePrefix) }

// Key returns node's variant key.
func (v Variants) Key(node *model.Node) string {
	if _, ok := v.perNode[node.Name]; ok {
		return perNodePrefix + node.Name
	}
	for _, a := range node.Addresses {
		if _, ok := v.claimed[a]; ok {
			return perNodePrefix + node.Name
		}
	}
	var buf [4]string // the most parts a key has: no allocation for one part
	parts := buf[:0]
	if z, ok := v.zones[node.Zone]; ok {
		parts = append(parts, z)
	}
	for _, f := range []model.Family{model.IPv4, model.IPv6} {
		if allowFromNode(v.ranges, node, f) {
			parts = append(parts, lbSourceKeys[f])
		}
	}
	for i, r := range v.rollouts {
		if _, ok := r.Nodes[node.Name]; ok {
			parts = append(parts, v.rolloutKeys[i])
			break
		}
	}
	return strings.Join(parts, ";")
}

func isFamily(f model.Family) func(netip.Addr) bool {
	return func(a netip.Addr) bool { return model.FamilyOf(a) == f }
}

// sourceRanges returns the Service's loadBalancerSourceRanges of family f.
// A zero-length prefix allows everyone, like no ranges at all (kube-proxy).
func sourceRanges(svc *model.Service, f model.Family) (out []netip.Prefix, allowAll bool) {
	for _, p := range svc.LoadBalancerSourceRanges {
		if model.FamilyOf(p.Addr()) != f {
			continue
		}
		if p.Bits() == 0 {
			return nil, true
		}
		out = append(out, p)
	}
	return out, false
}

// allowFromNode reports whether one of node's addresses of family f lies in
// one of ranges (kube-proxy checks its node IP; we check every address the
// Node reports).
func allowFromNode(ranges []netip.Prefix, node *model.Node, f model.Family) bool {
	for _, a := range node.Addresses {
		if model.FamilyOf(a) != f {
			continue
		}
		for _, r := range ranges {
			if r.Contains(a) {
				return true
			}
		}
	}
	return false
}

// nodePortClaiming returns the port of svc whose NodePort (not lost to
// another Service: c) is port/proto: an external virtual server on
// port/proto at an address that is also a NodePort address of the node
// would be that NodePort's IPVS virtual server.
func nodePortClaiming(svc *model.Service, c Conflicts, port uint16, proto model.Protocol) (model.ServicePort, bool) {
	for _, np := range svc.Ports {
		np = c.port(np)
		if np.NodePort != 0 && np.NodePort == port && np.Protocol == proto {
			return np, true
		}
	}
	return model.ServicePort{}, false
}
