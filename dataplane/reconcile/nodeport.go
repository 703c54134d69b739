package reconcile

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// NodePort expansion. The control plane sends NodePort virtual servers
// and SCTP NodePort set entries as markers (node_port_addresses = true,
// no address), because only the agent knows the node's addresses. The
// agent expands each marker into one virtual server (one hash:ip,port
// entry) per NodePort address of the marker's family.
//
// A resource with markers keeps its compiled explicit content and the
// markers (templates); its indexed vss/entries are the expansion over the
// current addresses. When the addresses change (settings or interfaces),
// every such resource is re-expanded and stored again like a changed
// resource, so only the differing items reach the kernel.

// templates are a resource's markers plus its explicit (unexpanded) state.
type templates struct {
	base    *resourceState // explicit vss, entries, compile problems
	vss     []desiredVS    // Key.Address zero, Key.Family set
	entries []entryKey     // entry.IP zero, set family set
}

// nodePortAddrs are the NodePort addresses of each family, sorted.
type nodePortAddrs map[kernel.Family][]netip.Addr

func (a nodePortAddrs) equal(b nodePortAddrs) bool {
	return maps.EqualFunc(a, b, func(x, y []netip.Addr) bool { return slices.Equal(x, y) })
}

// selectNodePortAddrs picks the NodePort addresses from the node's
// interface addresses: not on kube-ipvs0, not loopback, not IPv6
// link-local, of a managed family, and inside one of cidrs of that family
// when cidrs has any of that family (kube-proxy's NodePortAddresses: no
// CIDR of a family means all addresses of it).
func selectNodePortAddrs(list []kernel.InterfaceAddress, cidrs []netip.Prefix, families familySet) nodePortAddrs {
	out := nodePortAddrs{}
	for _, f := range families {
		var fc []netip.Prefix
		for _, c := range cidrs {
			if kernel.FamilyOf(c.Addr()) == f {
				fc = append(fc, c)
			}
		}
		var addrs []netip.Addr
		for _, ia := range list {
			a := ia.Prefix.Addr().Unmap()
			if ia.Interface == kernel.DummyDevice || kernel.FamilyOf(a) != f || a.IsLoopback() ||
				(a.Is6() && a.IsLinkLocalUnicast()) {
				continue
			}
			if len(fc) > 0 && !slices.ContainsFunc(fc, func(c netip.Prefix) bool { return c.Contains(a) }) {
				continue
			}
			addrs = append(addrs, a)
		}
		slices.SortFunc(addrs, netip.Addr.Compare)
		out[f] = slices.Compact(addrs)
	}
	return out
}

// compileEntryTemplate compiles a node_port_addresses entry marker.
func (c *compiler) compileEntryTemplate(set rules.Set, e *vsplanev1.IPSetEntry) (entryKey, *fieldError) {
	if set.Type() != kernel.HashIPPort {
		return entryKey{}, bad("node_port_addresses", nil, "%v: node_port_addresses entries only in hash:ip,port sets (the SCTP NodePort sets)", set)
	}
	for _, f := range []struct{ name, val string }{{"ip", e.GetIp()}, {"ip2", e.GetIp2()}, {"net", e.GetNet()}} {
		if f.val != "" {
			return entryKey{}, bad(f.name, f.val, "node_port_addresses entry must carry only a port and protocol")
		}
	}
	var fam kernel.Family
	switch e.GetFamily() {
	case vsplanev1.IPFamily_IP_FAMILY_IPV4:
		fam = kernel.FamilyIPv4
	case vsplanev1.IPFamily_IP_FAMILY_IPV6:
		fam = kernel.FamilyIPv6
	default:
		return entryKey{}, bad("family", e.GetFamily(), "node_port_addresses entry without family")
	}
	if !c.families.has(fam) {
		return entryKey{}, bad("family", e.GetFamily(), "family %v is not enabled on this agent", fam)
	}
	if err := checkPort("port", e.GetPort()); err != nil {
		return entryKey{}, err
	}
	proto, err := protocol(e.GetProtocol())
	if err != nil {
		return entryKey{}, bad("protocol", e.GetProtocol(), "%v", err)
	}
	return entryKey{set: setRef{set: set, family: fam}, entry: kernel.Entry{Protocol: proto, Port: uint16(e.GetPort())}}, nil
}

// expand returns rs expanded over addrs (rs itself when it has no
// markers), with the fwmark virtual servers of its in-cluster clients
// (marks: incluster.go). The result is a new value: stored states are
// never mutated.
func (rs *resourceState) expand(addrs nodePortAddrs, marks *inClusterMarks) *resourceState {
	tm := rs.tmpl
	if tm == nil {
		return rs
	}
	b := tm.base
	out := &resourceState{name: b.name, version: b.version, vss: slices.Clone(b.vss), entries: slices.Clone(b.entries),
		problems: slices.Clone(b.problems), tmpl: tm, health: b.health, noLocalInternal: b.noLocalInternal, noLocalExternal: b.noLocalExternal}
	expanded := map[kernel.VirtualServerKey]bool{}
	for _, t := range tm.vss {
		for _, a := range addrs[t.vs.Key.Family] {
			d := t
			d.vs.Key = kernel.AddrKey(a, t.vs.Key.Protocol, t.vs.Key.Port)
			d.nodePort = true
			if b.vss.has(d.vs.Key) || expanded[d.vs.Key] {
				// Its own ExternalIP/LB address is a node address: the
				// explicit virtual server wins.
				out.problem("NodePort virtual server %v collides with this Service's own virtual server on that address; not programmed as NodePort", d.vs.Key)
				continue
			}
			expanded[d.vs.Key] = true
			out.vss = append(out.vss, d)
		}
	}
	out.vss.sort()
	seen := make(map[entryKey]bool, len(out.entries))
	for _, e := range out.entries {
		seen[e] = true
	}
	for _, t := range tm.entries {
		for _, a := range addrs[t.set.family] {
			ek := t
			ek.entry.IP = a
			if !seen[ek] {
				seen[ek] = true
				out.entries = append(out.entries, ek)
			}
		}
	}
	marks.addInCluster(out)
	return out
}

// refreshNodePort reads the node's addresses when some resource has
// markers or a health-check node port (its servers listen on the NodePort
// addresses) and, when the NodePort addresses changed, re-expands every
// resource with markers. It returns the re-expanded resources (old and new
// state) for the caller to touch; nothing when the addresses are unchanged.
func (r *Reconciler) refreshNodePort(p *pass) (names []string, olds []*resourceState) {
	if len(r.desired.templated) == 0 && len(r.desired.checks) == 0 {
		return nil, nil
	}
	list, err := r.k.Links.LocalAddresses()
	if err != nil {
		// Keep the previous expansion (fail-static); retried.
		p.fail(slices.Sorted(maps.Keys(r.desired.templated)), "list local addresses for NodePort", err)
		return nil, nil
	}
	p.setLocal(list)
	addrs := selectNodePortAddrs(list, p.s.nodePortCIDRs, r.families)
	masq := masqFor(p.s.masqueradeBit)
	if addrs.equal(r.nodePort) && masq == r.marks.masq {
		return nil, nil
	}
	r.log.Info("NodePort addresses or masquerade bit changed; re-expanding NodePort and in-cluster services",
		zap.String("addresses", formatAddrs(addrs)), zap.Uint8("masqueradeBit", p.s.masqueradeBit))
	r.nodePort, r.marks.masq = addrs, masq
	for _, name := range slices.Sorted(maps.Keys(r.desired.templated)) {
		old := r.desired.res[name]
		r.desired.put(name, old.expand(addrs, r.marks))
		names = append(names, name)
		olds = append(olds, old)
	}
	return names, olds
}

// conflicts reports the NodePort virtual servers of rs another resource's
// virtual server wins (an explicit one always wins; between two NodePort
// ones the first resource by name).
func (s *store) conflicts(rs *resourceState) []string {
	var out []string
	for _, d := range rs.vss {
		if !d.nodePort {
			continue
		}
		key := d.vs.Key
		w := s.winner(key)
		if w == rs.name || w == "" {
			continue
		}
		if wd, _ := s.res[w].vss.get(key); wd.nodePort {
			out = append(out, fmt.Sprintf("NodePort virtual server %v is also the NodePort of %s, which is programmed (duplicate NodePort)", key, w))
		} else {
			out = append(out, fmt.Sprintf("NodePort virtual server %v collides with the virtual server of %s on that node address (same address, port and protocol); that one is programmed, not this NodePort", key, w))
		}
	}
	return out
}

func formatAddrs(a nodePortAddrs) string {
	var parts []string
	for _, f := range slices.Sorted(maps.Keys(a)) {
		for _, x := range a[f] {
			parts = append(parts, x.String())
		}
	}
	return strings.Join(parts, ",")
}
