package reconcile

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// In-cluster clients of Local external policy. An external virtual server
// (load-balancer IP, external IP, NodePort) of a Service with
// externalTrafficPolicy Local serves external clients from this node's
// endpoints only. Clients inside the cluster get Cluster semantics instead:
// the control plane sends their real servers (in_cluster_real_servers), and
// the agent serves them through one firewall-mark virtual server per
// Service port (resource, family, protocol, port): rules.InClusterMarks
// marks their connections to each of the port's addresses, and IPVS looks
// fwmark services up before address ones.
//
// The marks are the agent's own, from rules.InClusterMarkMask, allocated
// here: a port keeps its mark while its resource wants it, so an endpoint
// change touches only the fwmark server's real servers. A new port takes a
// hash of its identity as its mark (probing on collision), so a restarted
// agent mostly finds its marks in the kernel again. The fwmark virtual
// server's mark carries the masquerade bit as the rule sets it.

// markKey identifies the fwmark virtual server of one Service port.
type markKey struct {
	resource string
	family   kernel.Family
	protocol kernel.Protocol
	port     uint16
}

// inClusterMarks allocates marks; it lives as long as the Reconciler.
type inClusterMarks struct {
	// masq is the masquerade bit (1<<masqueradeBit) marks are written
	// with; 0 when that bit lies in rules.InClusterMarkMask (the feature
	// is then off: in-cluster clients get the Local semantics).
	masq  uint32
	byKey map[markKey]uint32 // value in rules.InClusterMarkMask
	used  map[uint32]markKey
	owned map[string][]markKey
}

func newInClusterMarks(masqueradeBit uint8) *inClusterMarks {
	m := &inClusterMarks{byKey: map[markKey]uint32{}, used: map[uint32]markKey{}, owned: map[string][]markKey{}}
	m.masq = masqFor(masqueradeBit)
	return m
}

// masqFor is the masquerade bit marks carry, 0 when it collides with the
// mark field.
func masqFor(bit uint8) uint32 {
	if b := uint32(1) << bit; b&rules.InClusterMarkMask == 0 {
		return b
	}
	return 0
}

// isOurs reports whether fwmark could be one of our fwmark servers' marks
// under the current masquerade bit: a full pass deletes such servers when
// nobody wants them (left by an earlier process with other marks).
func (m *inClusterMarks) isOurs(fwmark uint32) bool {
	return m.masq != 0 && fwmark&^rules.InClusterMarkMask == m.masq && fwmark&rules.InClusterMarkMask != 0
}

// get returns k's mark value (without the masquerade bit), allocating one;
// 0 when every value is taken.
func (m *inClusterMarks) get(k markKey) uint32 {
	if v, ok := m.byKey[k]; ok {
		return v
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d/%d/%d", k.resource, k.family, k.protocol, k.port)
	size := rules.InClusterMarkMask // values 1..mask
	start := h.Sum32() % size
	for i := range size {
		v := (start+i)%size + 1
		if _, taken := m.used[v]; !taken {
			m.byKey[k], m.used[v] = v, k
			m.owned[k.resource] = append(m.owned[k.resource], k)
			return v
		}
	}
	return 0
}

// keep releases the marks of resource name other than those in keys.
func (m *inClusterMarks) keep(name string, keys []markKey) {
	owned := m.owned[name]
	kept := owned[:0]
	for _, k := range owned {
		if slices.Contains(keys, k) {
			kept = append(kept, k)
			continue
		}
		delete(m.used, m.byKey[k])
		delete(m.byKey, k)
	}
	if len(kept) == 0 {
		delete(m.owned, name)
	} else {
		m.owned[name] = kept
	}
}

// addInCluster gives out (an expanded resource state, not yet stored) the
// fwmark virtual servers of its in-cluster clients and records each
// external server's mark (desiredVS.inClusterMark). Every external server
// of one port shares the port's server, which takes its scheduler, flags
// and persistence from the first of them (they are the same: one Service
// port). The marks of ports out no longer has are released.
func (m *inClusterMarks) addInCluster(out *resourceState) {
	var keys []markKey
	var fw vsList
	for i := range out.vss {
		d := &out.vss[i]
		if len(d.inCluster) == 0 || d.vs.Key.FWMark != 0 {
			continue
		}
		if m.masq == 0 {
			continue // reported on node/settings
		}
		k := markKey{resource: out.name, family: d.vs.Key.Family, protocol: d.vs.Key.Protocol, port: d.vs.Key.Port}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
		v := m.get(k)
		if v == 0 {
			out.problem("%v: no in-cluster mark left (all %d in use); in-cluster clients get the Local policy", d.vs.Key, rules.InClusterMarkMask)
			continue
		}
		d.inClusterMark = v | m.masq
		key := kernel.FWMarkKey(d.vs.Key.Family, d.inClusterMark)
		if fw.has(key) {
			continue
		}
		vs := d.vs
		vs.Key = key
		fw = append(fw, desiredVS{vs: vs, dests: d.inCluster, binding: vsplanev1.AddressBinding_ADDRESS_BINDING_NONE})
		fw.sort()
	}
	m.keep(out.name, keys)
	if len(fw) > 0 {
		out.vss = append(out.vss, fw...)
		out.vss.sort()
	}
}

// inClusterMarksOf returns the rules' in-cluster marks of family fam: one
// per external virtual server with a mark that its resource wins.
func (s *store) inClusterMarksOf(fam kernel.Family) []rules.InClusterMark {
	var out []rules.InClusterMark
	for name := range s.inCluster {
		for _, d := range s.res[name].vss {
			k := d.vs.Key
			if d.inClusterMark == 0 || k.Family != fam || s.winner(k) != name {
				continue
			}
			out = append(out, rules.InClusterMark{Dest: rules.VirtualPort{IP: k.Address, Port: k.Port, Protocol: k.Protocol}, Mark: d.inClusterMark})
		}
	}
	// Sorted, so that an unchanged state renders from the memo.
	slices.SortFunc(out, func(a, b rules.InClusterMark) int {
		return cmp.Or(a.Dest.IP.Compare(b.Dest.IP), cmp.Compare(a.Dest.Port, b.Dest.Port),
			cmp.Compare(a.Dest.Protocol, b.Dest.Protocol), cmp.Compare(a.Mark, b.Mark))
	})
	return out
}
