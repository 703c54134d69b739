// Package inspect serves the agent's local, read-only inspection endpoint
// (vsplane.v1.AgentInspectService): what the kernel holds against what the
// desired state wants (IPVS, kube-ipvs0 addresses, ipsets, iptables), and
// the drain list.
//
// Read-only by construction: the server only holds the read methods of the
// kernel interfaces (Readers), so it cannot program the kernel even by
// mistake. It reads the kernel without the reconciler's lock,
// so a response taken while a pass is running may show differences that the
// pass is about to repair.
package inspect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Source is the desired side: *reconcile.Reconciler implements it.
type Source interface {
	// Desired returns the desired virtual servers and kube-ipvs0 addresses.
	Desired() ([]reconcile.DesiredVirtualServer, []reconcile.DesiredAddress)
	// Versions returns the applied resource versions.
	Versions() map[string]string
	// Failed returns the failed resources with their errors.
	Failed() map[string]string
	// Status returns last full reconcile, kernel errors and drains.
	Status() *vsplanev1.AgentStatus
	// Draining returns the draining real servers.
	Draining() []reconcile.Drain
	// DesiredIPSets returns the managed ipsets and their wanted entries.
	DesiredIPSets() []reconcile.DesiredSet
	// DesiredRules returns the iptables rules rendered from the desired
	// state, per family.
	DesiredRules() []rules.Ruleset
}

// IPVSReader is the read half of kernel.IPVS.
type IPVSReader interface {
	ListVirtualServers() ([]kernel.VirtualServer, error)
	ListDestinations(key kernel.VirtualServerKey) ([]kernel.Destination, error)
}

// LinksReader is the read half of kernel.Links.
type LinksReader interface {
	BoundAddresses(dev string) ([]netip.Addr, error)
	LocalAddresses() ([]kernel.InterfaceAddress, error)
}

// IPSetsReader is the read half of kernel.IPSets.
type IPSetsReader interface {
	ListSets() ([]kernel.IPSet, error)
	ListEntries(name string) ([]kernel.Entry, error)
}

// IPTablesReader is the read half of kernel.IPTables.
type IPTablesReader interface {
	Save(ctx context.Context, family kernel.Family, table kernel.Table) ([]byte, error)
}

// Readers are the kernel's read methods the server compares with; all are
// required.
type Readers struct {
	IPVS     IPVSReader
	Links    LinksReader
	IPSets   IPSetsReader
	IPTables IPTablesReader
}

// Server implements vsplanev1.AgentInspectServiceServer.
type Server struct {
	vsplanev1.UnimplementedAgentInspectServiceServer
	src Source
	k   Readers
}

// New returns a Server over the desired state src and the kernel readers.
func New(src Source, k Readers) (*Server, error) {
	if src == nil || k.IPVS == nil || k.Links == nil || k.IPSets == nil || k.IPTables == nil {
		return nil, errors.New("inspect: source and the IPVS, links, ipsets and iptables readers are required")
	}
	return &Server{src: src, k: k}, nil
}

// ListDrains implements AgentInspectService.
func (s *Server) ListDrains(context.Context, *vsplanev1.ListDrainsRequest) (*vsplanev1.ListDrainsResponse, error) {
	return &vsplanev1.ListDrainsResponse{Draining: s.src.Status().GetDraining()}, nil
}

// GetKernelState implements AgentInspectService. Kernel read errors do not
// fail the call: they are listed in read_errors and the comparison covers
// what could be read.
func (s *Server) GetKernelState(ctx context.Context, _ *vsplanev1.GetKernelStateRequest) (*vsplanev1.GetKernelStateResponse, error) {
	desiredVS, desiredAddrs := s.src.Desired()
	st := s.src.Status()
	resp := &vsplanev1.GetKernelStateResponse{
		Versions:          s.src.Versions(),
		Failed:            s.src.Failed(),
		LastFullReconcile: st.GetLastFullReconcile(),
		KernelErrors:      st.GetKernelErrors(),
	}
	drains := map[kernel.VirtualServerKey]map[kernel.DestinationKey]bool{}
	for _, d := range s.src.Draining() {
		if drains[d.VirtualServer] == nil {
			drains[d.VirtualServer] = map[kernel.DestinationKey]bool{}
		}
		drains[d.VirtualServer][d.RealServer] = true
	}
	s.compareVirtualServers(resp, desiredVS, drains)
	heldElsewhere := s.heldElsewhere(resp)
	s.compareAddresses(resp, desiredAddrs, heldElsewhere)
	s.compareIPSets(resp, s.src.DesiredIPSets(), heldElsewhere)
	s.compareRules(ctx, resp, s.src.DesiredRules())
	return resp, nil
}

func (s *Server) compareVirtualServers(resp *vsplanev1.GetKernelStateResponse, desired []reconcile.DesiredVirtualServer,
	drains map[kernel.VirtualServerKey]map[kernel.DestinationKey]bool) {
	want := make(map[kernel.VirtualServerKey]reconcile.DesiredVirtualServer, len(desired))
	for _, d := range desired {
		want[d.VirtualServer.Key.Normalize()] = d
	}
	have := map[kernel.VirtualServerKey]kernel.VirtualServer{}
	list, err := s.k.IPVS.ListVirtualServers()
	if err != nil {
		resp.ReadErrors = append(resp.ReadErrors, fmt.Sprintf("list IPVS virtual servers: %v", err))
	}
	for _, vs := range list {
		vs = vs.Normalize()
		have[vs.Key] = vs
	}
	keys := make([]kernel.VirtualServerKey, 0, len(want)+len(have))
	for k := range want {
		keys = append(keys, k)
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, kernel.VirtualServerKey.Compare)
	for _, key := range keys {
		d, wanted := want[key]
		cur, held := have[key]
		out := &vsplanev1.VirtualServerState{
			Key: key.String(), Protocol: key.Protocol.String(), Port: uint32(key.Port), Fwmark: key.FWMark,
		}
		if key.Address.IsValid() {
			out.Address = key.Address.String()
		}
		if key.FWMark != 0 {
			out.Protocol = ""
		}
		var kernelDests []kernel.Destination
		if held {
			out.Kernel = vsConfig(cur)
			if kernelDests, err = s.k.IPVS.ListDestinations(key); err != nil {
				resp.ReadErrors = append(resp.ReadErrors, fmt.Sprintf("list IPVS destinations of %v: %v", key, err))
			}
		}
		if wanted {
			out.Desired = vsConfig(d.VirtualServer.Normalize())
			out.Resources = d.Resources
			out.Reject, out.NodePort = d.Reject, d.NodePort
		}
		rsDiffer := compareRealServers(resp, out, d.Destinations, kernelDests, drains[key])
		switch {
		case !held:
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL
		case !wanted:
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_EXTRA_IN_KERNEL
		case cur != d.VirtualServer.Normalize() || rsDiffer:
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS
		default:
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC
		}
		if out.Status != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			resp.Differences++
		}
		resp.VirtualServers = append(resp.VirtualServers, out)
	}
}

// compareRealServers fills out.RealServers and reports whether any
// non-draining real server is out of sync (those are counted in resp).
func compareRealServers(resp *vsplanev1.GetKernelStateResponse, out *vsplanev1.VirtualServerState,
	want, have []kernel.Destination, draining map[kernel.DestinationKey]bool) bool {
	w := make(map[kernel.DestinationKey]kernel.Destination, len(want))
	for _, d := range want {
		w[d.Key()] = d
	}
	h := make(map[kernel.DestinationKey]kernel.Destination, len(have))
	for _, d := range have {
		h[d.Key()] = d
	}
	keys := make([]kernel.DestinationKey, 0, len(w)+len(h))
	for k := range w {
		keys = append(keys, k)
	}
	for k := range h {
		if _, ok := w[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, kernel.DestinationKey.Compare)
	differ := false
	for _, k := range keys {
		dw, wanted := w[k]
		dh, held := h[k]
		rs := &vsplanev1.RealServerState{Address: k.Address.String(), Port: uint32(k.Port), KernelWeight: -1, DesiredWeight: -1}
		if held {
			rs.KernelWeight = int64(dh.Weight)
			rs.ActiveConnections, rs.InactiveConnections = dh.ActiveConn, dh.InactiveConn
		}
		if wanted {
			rs.DesiredWeight = int64(dw.Weight)
		}
		switch {
		case !held:
			rs.Status = vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL
		case !wanted:
			rs.Status = vsplanev1.ItemStatus_ITEM_STATUS_EXTRA_IN_KERNEL
			rs.Draining = draining[k]
		case dh.Weight != dw.Weight || dh.Forward != dw.Forward:
			rs.Status = vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS
		default:
			rs.Status = vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC
		}
		if rs.Status != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC && !rs.Draining {
			differ = true
			resp.Differences++
		}
		out.RealServers = append(out.RealServers, rs)
	}
	return differ
}

func (s *Server) compareAddresses(resp *vsplanev1.GetKernelStateResponse, desired []reconcile.DesiredAddress, heldElsewhere func(netip.Addr) bool) {
	bound := map[netip.Addr]bool{}
	list, err := s.k.Links.BoundAddresses(kernel.DummyDevice)
	switch {
	case errors.Is(err, kernel.ErrNotFound): // no kube-ipvs0: nothing bound
	case err != nil:
		resp.ReadErrors = append(resp.ReadErrors, fmt.Sprintf("list addresses of %s: %v", kernel.DummyDevice, err))
	}
	for _, a := range list {
		bound[a.Unmap()] = true
	}
	want := map[netip.Addr]bool{}
	for _, d := range desired {
		if d.UnlessLocal && heldElsewhere(d.Address) {
			continue
		}
		want[d.Address.Unmap()] = true
	}
	addrs := make([]netip.Addr, 0, len(want)+len(bound))
	for a := range want {
		addrs = append(addrs, a)
	}
	for a := range bound {
		if !want[a] {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		st := &vsplanev1.AddressState{Address: a.String(), Bound: bound[a], Desired: want[a]}
		switch {
		case st.Bound && st.Desired:
			st.Status = vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC
		case st.Desired:
			st.Status = vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL
		default:
			st.Status = vsplanev1.ItemStatus_ITEM_STATUS_EXTRA_IN_KERNEL
		}
		if st.Status != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			resp.Differences++
		}
		resp.Addresses = append(resp.Addresses, st)
	}
}

// heldElsewhere returns a lookup of whether an interface other than
// kube-ipvs0 holds an address (an UnlessLocal binding or KUBE-IPVS-IPS
// entry is then not wanted). The node's addresses are read once, on the
// first lookup; a read error is listed in resp.
func (s *Server) heldElsewhere(resp *vsplanev1.GetKernelStateResponse) func(netip.Addr) bool {
	var elsewhere map[netip.Addr]bool
	return func(addr netip.Addr) bool {
		if elsewhere == nil {
			elsewhere = map[netip.Addr]bool{}
			local, err := s.k.Links.LocalAddresses()
			if err != nil {
				resp.ReadErrors = append(resp.ReadErrors, fmt.Sprintf("list local addresses: %v", err))
			}
			for _, ia := range local {
				if ia.Interface != kernel.DummyDevice {
					elsewhere[ia.Prefix.Addr().Unmap()] = true
				}
			}
		}
		return elsewhere[addr.Unmap()]
	}
}

// vsConfig renders one side of a virtual server.
func vsConfig(vs kernel.VirtualServer) *vsplanev1.VirtualServerConfig {
	return &vsplanev1.VirtualServerConfig{
		Scheduler: vs.Scheduler, Flags: flagNames(vs.Flags),
		PersistenceTimeoutSeconds: vs.Timeout, Netmask: uint32(vs.Netmask),
	}
}

// flagNames spells IPVS service flags like ipvsadm does.
func flagNames(f kernel.ServiceFlags) []string {
	names := []struct {
		flag kernel.ServiceFlags
		name string
	}{
		{kernel.FlagPersistent, "persistent"}, {kernel.FlagHashed, "hashed"}, {kernel.FlagOnePacket, "one-packet"},
		{kernel.FlagSched1, "sched-flag-1"}, {kernel.FlagSched2, "sched-flag-2"}, {kernel.FlagSched3, "sched-flag-3"},
	}
	var out []string
	for _, n := range names {
		if f&n.flag != 0 {
			out = append(out, n.name)
			f &^= n.flag
		}
	}
	if f != 0 {
		out = append(out, fmt.Sprintf("%#x", uint32(f)))
	}
	return out
}
