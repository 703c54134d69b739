package engine

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/translate"
)

// Reasons of cross-Service conflicts (per-Service conversion problems live
// in model; these need the whole cluster to decide).
const (
	ReasonNodePortConflict   model.Reason = "nodeport_conflict"
	ReasonExternalIPConflict model.Reason = "external_ip_conflict"
	ReasonVIPConflict        model.Reason = "virtual_server_conflict"
)

// portKey is a NodePort: IPVS keys NodePort virtual servers by
// address:port:protocol, so two Services may share a number across
// protocols but not within one.
type portKey struct {
	proto model.Protocol
	port  uint16
}

func (p portKey) String() string { return fmt.Sprintf("%d/%s", p.port, p.proto) }

// claimant is a Service claiming a NodePort, ordered by age then name so
// every replica picks the same owner and a newer Service can never take a
// port from one that already works.
type claimant struct {
	key     model.ServiceKey
	created int64
}

func (a claimant) compare(b claimant) int {
	return cmp.Or(cmp.Compare(a.created, b.created), cmp.Compare(a.key.Namespace, b.key.Namespace), cmp.Compare(a.key.Name, b.key.Name))
}

// conflicts tracks what Services claim that other Services may also claim:
// NodePorts (the API server's allocator normally keeps them unique, but a
// restored etcd or a repaired allocation can hand one out twice) and
// external IPs equal to a node address on a port some Service uses as its
// NodePort (both would be the same IPVS virtual server on that node).
// A loser's translation leaves out what it lost (translate.Conflicts) and
// carries a problem; the owner is untouched. Not safe for concurrent use
// (the engine holds its lock).
type conflicts struct {
	claims    map[portKey][]claimant // sorted, owner first
	claimedBy map[model.ServiceKey][]portKey
	// extIPUsers: Services with external IPs, by the (protocol, port) their
	// external-IP virtual servers use, to recheck when NodePort owners change.
	extIPUsers map[portKey]map[model.ServiceKey]struct{}
	extIPPorts map[model.ServiceKey][]portKey
	// nodeAddrs: every node's addresses -> node name.
	nodeAddrs map[netip.Addr]string
	// vips: the external/load-balancer virtual servers Services claim
	// (two Services with one external IP, or sharing a load-balancer IP, on
	// the same port and protocol), owner first, like NodePorts.
	vips     map[model.VIP][]claimant
	vipsOfSv map[model.ServiceKey][]model.VIP
}

func newConflicts() *conflicts {
	return &conflicts{
		claims:     map[portKey][]claimant{},
		claimedBy:  map[model.ServiceKey][]portKey{},
		extIPUsers: map[portKey]map[model.ServiceKey]struct{}{},
		extIPPorts: map[model.ServiceKey][]portKey{},
		nodeAddrs:  map[netip.Addr]string{},
		vips:       map[model.VIP][]claimant{},
		vipsOfSv:   map[model.ServiceKey][]model.VIP{},
	}
}

// vipsOf returns the external and load-balancer virtual servers svc asks for.
func vipsOf(svc *model.Service) []model.VIP {
	if svc == nil {
		return nil
	}
	var out []model.VIP
	for _, ips := range [][]netip.Addr{svc.ExternalIPs, svc.LoadBalancerIPs} {
		for _, ip := range ips {
			for _, p := range svc.Ports {
				if v := (model.VIP{Addr: ip, Proto: p.Protocol, Port: p.Port}); !slices.Contains(out, v) {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// nodePorts returns the NodePorts svc asks for (deduplicated).
func nodePorts(svc *model.Service) []portKey {
	var out []portKey
	if svc == nil {
		return nil
	}
	for _, p := range svc.Ports {
		if p.NodePort != 0 && !slices.Contains(out, portKey{p.Protocol, p.NodePort}) {
			out = append(out, portKey{p.Protocol, p.NodePort})
		}
	}
	return out
}

func extIPPorts(svc *model.Service) []portKey {
	if svc == nil || len(svc.ExternalIPs) == 0 {
		return nil
	}
	var out []portKey
	for _, p := range svc.Ports {
		if !slices.Contains(out, portKey{p.Protocol, p.Port}) {
			out = append(out, portKey{p.Protocol, p.Port})
		}
	}
	return out
}

// update records svc (nil: gone) as the current version of Service k and
// calls dirty for every other Service whose outcome may have changed.
func (c *conflicts) update(k model.ServiceKey, svc *model.Service, dirty func(model.ServiceKey)) {
	for _, pk := range c.claimedBy[k] {
		before := c.claims[pk]
		after := slices.DeleteFunc(slices.Clone(before), func(x claimant) bool { return x.key == k })
		c.setClaims(pk, before, after, k, dirty)
	}
	delete(c.claimedBy, k)
	for _, pk := range c.extIPPorts[k] {
		delete(c.extIPUsers[pk], k)
		if len(c.extIPUsers[pk]) == 0 {
			delete(c.extIPUsers, pk)
		}
	}
	delete(c.extIPPorts, k)
	for _, v := range c.vipsOfSv[k] {
		before := c.vips[v]
		after := slices.DeleteFunc(slices.Clone(before), func(x claimant) bool { return x.key == k })
		c.setVIPClaims(v, before, after, k, dirty)
	}
	delete(c.vipsOfSv, k)
	if svc == nil {
		return
	}
	me := claimant{key: k, created: svc.Created}
	for _, v := range vipsOf(svc) {
		before := c.vips[v]
		after := slices.Clone(before)
		i, _ := slices.BinarySearchFunc(after, me, claimant.compare)
		after = slices.Insert(after, i, me)
		c.setVIPClaims(v, before, after, k, dirty)
		c.vipsOfSv[k] = append(c.vipsOfSv[k], v)
	}
	for _, pk := range nodePorts(svc) {
		before := c.claims[pk]
		after := slices.Clone(before)
		i, _ := slices.BinarySearchFunc(after, me, claimant.compare)
		after = slices.Insert(after, i, me)
		c.setClaims(pk, before, after, k, dirty)
		c.claimedBy[k] = append(c.claimedBy[k], pk)
	}
	for _, pk := range extIPPorts(svc) {
		if c.extIPUsers[pk] == nil {
			c.extIPUsers[pk] = map[model.ServiceKey]struct{}{}
		}
		c.extIPUsers[pk][k] = struct{}{}
		c.extIPPorts[k] = append(c.extIPPorts[k], pk)
	}
}

// setClaims stores a port's new claimants; when its owner changes, its
// claimants (dirtyOnOwnerChange) and the external-IP users of that port are
// rechecked.
func (c *conflicts) setClaims(pk portKey, before, after []claimant, self model.ServiceKey, dirty func(model.ServiceKey)) {
	storeClaimants(c.claims, pk, after)
	if !dirtyOnOwnerChange(before, after, self, dirty) {
		return
	}
	for k := range c.extIPUsers[pk] {
		if k != self {
			dirty(k)
		}
	}
}

// setVIPClaims stores a virtual server's claimants; when its owner changes,
// its claimants are rechecked (dirtyOnOwnerChange).
func (c *conflicts) setVIPClaims(v model.VIP, before, after []claimant, self model.ServiceKey, dirty func(model.ServiceKey)) {
	storeClaimants(c.vips, v, after)
	dirtyOnOwnerChange(before, after, self, dirty)
}

// storeClaimants sets or, when none are left, deletes a claim list.
func storeClaimants[K comparable](m map[K][]claimant, k K, after []claimant) {
	if len(after) == 0 {
		delete(m, k)
	} else {
		m[k] = after
	}
}

// dirtyOnOwnerChange rechecks, when the owner (the first claimant)
// changed, the old owner and every remaining claimant other than self: the
// new owner takes the claim, and every other loser's problem names the
// owner. It reports whether the owner changed.
func dirtyOnOwnerChange(before, after []claimant, self model.ServiceKey, dirty func(model.ServiceKey)) bool {
	var was, is model.ServiceKey
	if len(before) > 0 {
		was = before[0].key
	}
	if len(after) > 0 {
		is = after[0].key
	}
	if was == is {
		return false
	}
	if was != (model.ServiceKey{}) && was != self {
		dirty(was)
	}
	for _, cl := range after {
		if cl.key != self && cl.key != was {
			dirty(cl.key)
		}
	}
	return true
}

// setNodeAddresses replaces the node address index; it reports whether it
// changed (then every Service with external IPs needs a recheck).
func (c *conflicts) setNodeAddresses(nodes map[string]*nodeEntry) bool {
	next := map[netip.Addr]string{}
	for name, ne := range nodes {
		for _, a := range ne.node.Addresses {
			if cur, ok := next[a]; !ok || name < cur {
				next[a] = name
			}
		}
	}
	if len(next) == len(c.nodeAddrs) {
		same := true
		for a, n := range next {
			if c.nodeAddrs[a] != n {
				same = false
				break
			}
		}
		if same {
			return false
		}
	}
	c.nodeAddrs = next
	return true
}

// extIPServices lists every Service with external IPs.
func (c *conflicts) extIPServices() []model.ServiceKey {
	out := make([]model.ServiceKey, 0, len(c.extIPPorts))
	for k := range c.extIPPorts {
		out = append(out, k)
	}
	return out
}

// resolve returns what svc loses, for the translator to leave out: the
// NodePorts another Service owns, the external IPs that would take over a
// node's NodePort and the virtual servers an older Service also claims;
// plus the problems explaining it.
func (c *conflicts) resolve(svc *model.Service) (translate.Conflicts, []model.Problem) {
	var out translate.Conflicts
	if svc == nil {
		return out, nil
	}
	var problems []model.Problem
	problem := func(r model.Reason, format string, args ...any) {
		problems = append(problems, model.Problem{Kind: "Service", Object: svc.Key.String(), Reason: r,
			Detail: fmt.Sprintf(format, args...), Dropped: true})
	}
	for i, p := range svc.Ports {
		if p.NodePort == 0 {
			continue
		}
		owner := c.claims[portKey{p.Protocol, p.NodePort}]
		if len(owner) == 0 || owner[0].key == svc.Key {
			continue
		}
		addTo(&out.NodePorts, translate.NodePort{Protocol: p.Protocol, Port: p.NodePort})
		problem(ReasonNodePortConflict, "ports[%d] (%q): nodePort %d/%s is already used by %s; NodePort not programmed",
			i, p.Name, p.NodePort, p.Protocol, owner[0].key)
	}
	for _, ip := range svc.ExternalIPs {
		node, isNode := c.nodeAddrs[ip]
		var clash []string
		if isNode {
			for _, p := range svc.Ports {
				if owner := c.claims[portKey{p.Protocol, p.Port}]; len(owner) > 0 {
					clash = append(clash, fmt.Sprintf("%d/%s (NodePort of %s)", p.Port, p.Protocol, owner[0].key))
				}
			}
		}
		if len(clash) == 0 {
			continue
		}
		addTo(&out.ExternalIPs, ip)
		problem(ReasonExternalIPConflict, "externalIPs: %s is an address of node %s and port %s; the external IP would take over that NodePort, so it is not programmed",
			ip, node, strings.Join(clash, ", "))
	}
	for _, v := range c.vipsOfSv[svc.Key] {
		owner := c.vips[v]
		if len(owner) == 0 || owner[0].key == svc.Key {
			continue
		}
		addTo(&out.VIPs, v)
		problem(ReasonVIPConflict, "virtual server %s is also claimed by the older Service %s, which keeps it; not programmed for this Service",
			v, owner[0].key)
	}
	return out, problems
}

// addTo adds k to the set *m, making it if need be.
func addTo[K comparable](m *map[K]struct{}, k K) {
	if *m == nil {
		*m = map[K]struct{}{}
	}
	(*m)[k] = struct{}{}
}
