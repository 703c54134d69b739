package translate

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/controlplane/model"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Reasons a real server was chosen (RealServer.reason).
const (
	ReasonReady               = "ready"
	ReasonTerminatingFallback = "terminating fallback"
	ReasonZoneHint            = "zone hint"
	ReasonNodeHint            = "node hint"
)

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

// chosen is an endpoint picked for a virtual server, and why.
type chosen struct {
	*endpoint
	reason string
}

// selection is what kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go)
// computes for one Service port on one node.
type selection struct {
	// cluster: ready endpoints available to this node's topology; if there
	// is none anywhere, the serving+terminating ones.
	cluster []chosen
	// local: this node's ready endpoints; if none, its serving+terminating ones.
	local []chosen
	// localReady counts the node's ready endpoints (health check answer).
	localReady int
}

type topologyMode uint8

const (
	topologyNone topologyMode = iota
	topologySameZone
	topologySameNode
)

// categorize splits eps for node. Topology hints only narrow the Cluster
// selection; Local selections are never filtered by topology (as kube-proxy).
func categorize(eps []endpoint, nodeName, zone string) selection {
	var sel selection
	mode := topologyModeOf(eps, nodeName, zone)
	for i := range eps {
		e := &eps[i]
		if !e.ready || !availableForTopology(e, mode, nodeName, zone) {
			continue
		}
		r := ReasonReady
		switch mode {
		case topologySameZone:
			r = ReasonZoneHint
		case topologySameNode:
			r = ReasonNodeHint
		}
		sel.cluster = append(sel.cluster, chosen{e, r})
	}
	if len(sel.cluster) == 0 {
		// The mode already ignores topology when no ready endpoint fits it,
		// so reaching here means no ready endpoint exists at all.
		for i := range eps {
			if e := &eps[i]; e.serving && e.terminating {
				sel.cluster = append(sel.cluster, chosen{e, ReasonTerminatingFallback})
			}
		}
	}
	for i := range eps {
		if e := &eps[i]; e.local && e.ready {
			sel.local = append(sel.local, chosen{e, ReasonReady})
		}
	}
	sel.localReady = len(sel.local)
	if len(sel.local) == 0 {
		for i := range eps {
			if e := &eps[i]; e.local && e.serving && e.terminating {
				sel.local = append(sel.local, chosen{e, ReasonTerminatingFallback})
			}
		}
	}
	return sel
}

// topologyModeOf follows kube-proxy's topologyModeFromHints: same-node when
// every ready endpoint has node hints and one names this node; otherwise
// same-zone when every ready endpoint has zone hints and one names this
// node's zone; otherwise no topology. Hints come from the EndpointSlice
// controller (trafficDistribution PreferClose/PreferSameZone/PreferSameNode
// or the topology-mode annotation); like kube-proxy we read only the hints.
func topologyModeOf(eps []endpoint, nodeName, zone string) topologyMode {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for i := range eps {
		e := &eps[i]
		if !e.ready {
			continue
		}
		anyReady = true
		if len(e.forNodes) == 0 {
			allNode = false
		} else if slices.Contains(e.forNodes, nodeName) {
			forNode = true
		}
		if len(e.forZones) == 0 {
			allZone = false
		} else if slices.Contains(e.forZones, zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNode && forNode && nodeName != "":
		return topologySameNode
	case allZone && forZone && zone != "":
		return topologySameZone
	}
	return topologyNone
}

func availableForTopology(e *endpoint, mode topologyMode, nodeName, zone string) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(e.forNodes, nodeName)
	case topologySameZone:
		return slices.Contains(e.forZones, zone)
	}
	return true
}

// realServers picks the real servers of a virtual server under policy p.
// Cluster: the cluster selection. Local: the local selection; if it is
// empty, reject (kube-proxy IPVS falls back to the cluster endpoints,
// kubernetes#97081; like the nftables proxier we do not).
func realServers(sel *selection, p model.TrafficPolicy) ([]*vsplanev1.RealServer, bool) {
	src := sel.cluster
	if p == model.PolicyLocal {
		src = sel.local
	}
	var out []*vsplanev1.RealServer
	for _, c := range src {
		out = append(out, &vsplanev1.RealServer{
			Address: c.addr.String(), Port: uint32(c.port), Weight: 1, Local: c.local,
			Ready: c.ready, Serving: c.serving, Terminating: c.terminating, Reason: c.reason,
		})
	}
	return out, p == model.PolicyLocal && len(out) == 0
}
