package reconcile

import (
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
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
