package reconcile

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
)

// DesiredVirtualServer is one virtual server the desired state asks for.
type DesiredVirtualServer struct {
	// VirtualServer is what would be programmed (normalized, the node's
	// default scheduler filled in).
	VirtualServer kernel.VirtualServer
	// Destinations sorted by key.
	Destinations []kernel.Destination
	// Resources asking for it, sorted. The programmed one is the first
	// explicit one, else the first (see NodePort).
	Resources []string
	// NodePort: expanded from a NodePort marker onto a node address.
	NodePort bool
	// Reject: a Local traffic policy without local endpoints; programmed
	// without destinations so IPVS answers with ICMP port unreachable.
	Reject bool
}

// DesiredAddress is one address a virtual server wants on kube-ipvs0.
type DesiredAddress struct {
	Address netip.Addr
	// UnlessLocal: wanted only while no other interface holds the address.
	UnlessLocal bool
}

// Desired returns a copy of the desired virtual servers (sorted by key) and
// the addresses they want bound (sorted). It reads no kernel state; callers
// such as the inspection endpoint compare it with the kernel themselves.
func (r *Reconciler) Desired() ([]DesiredVirtualServer, []DesiredAddress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sched := r.desired.settings().defaultScheduler
	var vss []DesiredVirtualServer
	for _, key := range sortedKeys(r.desired.vsOwners, kernel.VirtualServerKey.Compare) {
		d, ok := r.desired.wantVS(key)
		if !ok {
			continue
		}
		vss = append(vss, DesiredVirtualServer{
			VirtualServer: d.kernelVS(sched),
			Destinations:  kernelDests(d.dests),
			Resources:     slices.Clone(r.desired.vsOwners[key]),
			NodePort:      d.nodePort,
			Reject:        d.reject,
		})
	}
	var addrs []DesiredAddress
	for _, a := range sortedKeys(r.desired.addrVS, netip.Addr.Compare) {
		always, unlessLocal := r.desired.bindings(a)
		switch {
		case always:
			addrs = append(addrs, DesiredAddress{Address: a})
		case unlessLocal:
			addrs = append(addrs, DesiredAddress{Address: a, UnlessLocal: true})
		}
	}
	return vss, addrs
}

// DesiredSet is one managed ipset and the entries the desired state wants
// in it.
type DesiredSet struct {
	// Set is the set as the agent creates it (normalized).
	Set kernel.IPSet
	// Entries sorted (by address, protocol, port, second address, net).
	Entries []DesiredEntry
}

// DesiredEntry is one ipset entry the desired state wants.
type DesiredEntry struct {
	Entry kernel.Entry
	// UnlessLocal: a KUBE-IPVS-IPS address wanted only while no interface
	// other than kube-ipvs0 holds it (as its binding, DesiredAddress).
	UnlessLocal bool
}

// DesiredIPSets returns every set the agent manages (kube-proxy's, per
// family; sorted by name) with the entries the desired state wants in it:
// those admitted under the set's maxelem (maxelem.go) and, in KUBE-IPVS-IPS,
// the addresses to be bound on kube-ipvs0 (addresses.go). It reads
// no kernel state. Nil before the first Delta: the sets are created by the
// first Apply.
func (r *Reconciler) DesiredIPSets() []DesiredSet {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full.synced {
		return nil
	}
	refs := r.families.managedSets()
	out := make([]DesiredSet, len(refs))
	index := make(map[setRef]int, len(refs))
	for i, ref := range refs {
		out[i].Set = ref.spec().Normalize()
		index[ref] = i
	}
	for _, ek := range sortedKeys(r.desired.entryRefs, compareEntryKeys) {
		if i, managed := index[ek.set]; managed && r.admission.admitted(ek, r.desired.entryRefs[ek]) {
			out[i].Entries = append(out[i].Entries, DesiredEntry{Entry: ek.entry})
		}
	}
	// KUBE-IPVS-IPS holds the addresses bound for services (addresses.go).
	for _, a := range sortedKeys(r.desired.addrVS, netip.Addr.Compare) {
		i, managed := index[setRef{rules.SetIPVSIPs, kernel.FamilyOf(a)}]
		always, unlessLocal := r.desired.bindings(a)
		if managed && (always || unlessLocal) {
			out[i].Entries = append(out[i].Entries, DesiredEntry{Entry: kernel.Entry{IP: a}, UnlessLocal: !always})
		}
	}
	slices.SortFunc(out, func(a, b DesiredSet) int { return strings.Compare(a.Set.Name, b.Set.Name) })
	return out
}

// DesiredRules returns the iptables rules of each family as last rendered
// from the desired state. Every Apply and every full reconcile renders them
// (iptables.go), so they follow the desired state; a family whose last
// rendering failed (or that nothing rendered yet: before the first Apply)
// is left out. The returned rulesets must not be modified.
func (r *Reconciler) DesiredRules() []rules.Ruleset {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []rules.Ruleset
	for _, fam := range r.families {
		if rr, ok := r.rendered[fam]; ok {
			out = append(out, rr.rs)
		}
	}
	return out
}

// kernelDests returns the kernel destinations of ds.
func kernelDests(ds []desiredDest) []kernel.Destination {
	if ds == nil {
		return nil
	}
	out := make([]kernel.Destination, len(ds))
	for i, d := range ds {
		out[i] = d.kernel()
	}
	return out
}
