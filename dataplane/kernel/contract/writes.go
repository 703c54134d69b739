package contract

import (
	"fmt"
	"net/netip"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// The kernel interfaces write only in batches (IPVS.Apply,
// IPSets.ApplyEntries, Links.ApplyAddresses). The suite states each op's
// semantics with one-op batches through these helpers, and the batches'
// own rules (order, one error per op, a failure does not stop the rest)
// with longer ones.

func ipvsOp(v kernel.IPVS, op kernel.IPVSOp) error { return v.Apply([]kernel.IPVSOp{op})[0] }

func addServer(v kernel.IPVS, vs kernel.VirtualServer) error {
	return ipvsOp(v, kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: vs})
}

func updateVS(v kernel.IPVS, vs kernel.VirtualServer) error {
	return ipvsOp(v, kernel.IPVSOp{Kind: kernel.UpdateVirtualServer, Server: vs})
}

func deleteVS(v kernel.IPVS, key kernel.VirtualServerKey) error {
	return ipvsOp(v, kernel.IPVSOp{Kind: kernel.DeleteVirtualServer, Server: kernel.VirtualServer{Key: key}})
}

func addDest(v kernel.IPVS, key kernel.VirtualServerKey, d kernel.Destination) error {
	return ipvsOp(v, kernel.IPVSOp{Kind: kernel.AddDestination, Server: kernel.VirtualServer{Key: key}, Destination: d})
}

func updateDest(v kernel.IPVS, key kernel.VirtualServerKey, d kernel.Destination) error {
	return ipvsOp(v, kernel.IPVSOp{Kind: kernel.UpdateDestination, Server: kernel.VirtualServer{Key: key}, Destination: d})
}

func deleteDest(v kernel.IPVS, key kernel.VirtualServerKey, dk kernel.DestinationKey) error {
	return ipvsOp(v, kernel.IPVSOp{Kind: kernel.DeleteDestination, Server: kernel.VirtualServer{Key: key},
		Destination: kernel.Destination{Address: dk.Address, Port: dk.Port}})
}

func addEntry(s kernel.IPSets, set kernel.IPSet, e kernel.Entry) error {
	return s.ApplyEntries([]kernel.EntryOp{{Kind: kernel.AddEntry, Set: set, Entry: e}})[0]
}

func delEntry(s kernel.IPSets, set kernel.IPSet, e kernel.Entry) error {
	return s.ApplyEntries([]kernel.EntryOp{{Kind: kernel.DelEntry, Set: set, Entry: e}})[0]
}

func bind(l kernel.Links, dev string, a netip.Addr) error {
	return l.ApplyAddresses(dev, []kernel.AddressOp{{Kind: kernel.BindAddress, Addr: a}})[0]
}

func unbind(l kernel.Links, dev string, a netip.Addr) error {
	return l.ApplyAddresses(dev, []kernel.AddressOp{{Kind: kernel.UnbindAddress, Addr: a}})[0]
}

// SetCleaner is what an IPSets implementation offers beyond kernel.IPSets
// for tests: the agent never destroys or flushes a set, but the suite
// checks both and cleans up with DestroySet. DestroySet and FlushSet of a
// missing set: ErrNotFound; DestroySet of a set referenced by iptables:
// ErrBusy.
type SetCleaner interface {
	DestroySet(name string) error
	FlushSet(name string) error
}

// DummyDeleter is what a Links implementation offers beyond kernel.Links
// for tests: DeleteDummy of a missing device is nil.
type DummyDeleter interface {
	DeleteDummy(name string) error
}

func destroySet(s kernel.IPSets, name string) error {
	c, ok := s.(SetCleaner)
	if !ok {
		return fmt.Errorf("%T cannot destroy a set: it must also be a contract.SetCleaner", s)
	}
	return c.DestroySet(name)
}

func flushSet(s kernel.IPSets, name string) error {
	c, ok := s.(SetCleaner)
	if !ok {
		return fmt.Errorf("%T cannot flush a set: it must also be a contract.SetCleaner", s)
	}
	return c.FlushSet(name)
}

func deleteDummy(l kernel.Links, name string) error {
	d, ok := l.(DummyDeleter)
	if !ok {
		return fmt.Errorf("%T cannot delete a dummy: it must also be a contract.DummyDeleter", l)
	}
	return d.DeleteDummy(name)
}
