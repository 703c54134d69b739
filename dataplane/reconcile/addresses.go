package reconcile

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	"github.com/vsplane/vsplane/internal/wire"
)

// Addresses on kube-ipvs0 (the dummy device) and their KUBE-IPVS-IPS
// entries.
//
//   - Update (syncAddr, address wanted): bound when some virtual server on
//     it wants it (binding ALWAYS, or UNLESS_LOCAL while no other interface
//     holds it) and known.bound says it is not; a bind that finds
//     kube-ipvs0 gone creates it (once per pass) and binds again.
//   - Delete (syncAddr, address not wanted): unbound when bound and not
//     excluded; unbinding an absent address is fine.
//   - Prune (full pass): every wanted address and every address bound to
//     kube-ipvs0 (known.bound, reloaded by the full pass).
//   - Status: a failure is blamed on the owners of the virtual servers on
//     the address and the changed resources that touched it. known.bound
//     changes only on success, and only then is the address's
//     KUBE-IPVS-IPS entry synced (so the set holds exactly the addresses
//     bound for Services).
//
// Binds and unbinds are queued (queue.go) and sent after the IPVS writes.

// loadBound reads the addresses on kube-ipvs0 into known.bound unless
// they are known.
func (p *pass) loadBound() error {
	known := p.known
	if known.bound != nil {
		return nil
	}
	list, err := p.k.Links.BoundAddresses(kernel.DummyDevice)
	known.dummyGone = false
	switch {
	case errors.Is(err, kernel.ErrNotFound):
		known.dummyGone = true
	case err != nil:
		return err
	}
	known.bound = make(map[netip.Addr]bool, len(list))
	for _, a := range list {
		known.bound[a.Unmap()] = true
	}
	return nil
}

func (p *pass) loadLocal() error {
	if p.localElse != nil {
		return nil
	}
	list, err := p.k.Links.LocalAddresses()
	if err != nil {
		return err
	}
	p.setLocal(list)
	return nil
}

// setLocal records the addresses held by interfaces other than kube-ipvs0.
func (p *pass) setLocal(list []kernel.InterfaceAddress) {
	p.localElse = map[netip.Addr]bool{}
	for _, ia := range list {
		if ia.Interface != kernel.DummyDevice {
			p.localElse[ia.Prefix.Addr().Unmap()] = true
		}
	}
}

// bindWanted: some virtual server on addr wants it bound (ALWAYS, or
// UNLESS_LOCAL while no other interface holds it).
func (p *pass) bindWanted(addr netip.Addr) (bool, error) {
	always, unlessLocal := p.desired.bindings(addr)
	if always || !unlessLocal {
		return always, nil
	}
	if err := p.loadLocal(); err != nil {
		return false, err
	}
	return !p.localElse[addr], nil
}

// addressesToCompare are the addresses a full pass syncs: wanted or bound.
func (p *pass) addressesToCompare() map[netip.Addr][]string {
	addrs := make(map[netip.Addr][]string, len(p.desired.addrVS)) // steady state: bound = wanted
	for a := range p.desired.addrVS {
		addrs[a] = nil
	}
	for a := range p.known.bound {
		addrs[a] = nil
	}
	return addrs
}

// syncAddr binds or unbinds addr as its virtual servers want; touchers are
// the changed resources that touched it.
func (p *pass) syncAddr(addr netip.Addr, touchers []string) {
	var owners []string
	for _, c := range p.desired.addrVS[addr] {
		owners = append(owners, p.desired.vsOwners[c.key]...)
	}
	names := ownersToBlame(owners, touchers)
	if err := p.loadBound(); err != nil {
		p.fail(names, "list addresses of "+kernel.DummyDevice, err)
		return
	}
	want, err := p.bindWanted(addr)
	if err != nil {
		p.fail(names, "list local addresses", err)
		return
	}
	known := p.known
	// KUBE-IPVS-IPS holds exactly the addresses bound for services: its
	// entry follows a bind or unbind once that succeeded.
	entry := func() {
		if fam := kernel.FamilyOf(addr); p.families.has(fam) {
			p.syncEntry(entryKey{set: setRef{rules.SetIPVSIPs, fam}, entry: kernel.Entry{IP: addr}}, names)
		}
	}
	switch {
	case want && !known.bound[addr]:
		if known.dummyGone {
			p.count(wire.OpCreateDummy)
			if _, err := p.k.Links.EnsureDummy(kernel.DummyDevice); err != nil {
				p.fail(names, "create "+kernel.DummyDevice, err)
				return
			}
			known.dummyGone = false
		}
		p.count(wire.OpBind)
		p.queueAddr(kernel.AddressOp{Kind: kernel.BindAddress, Addr: addr}, p.bindDone(addr, names, entry, true))
	case !want && known.bound[addr] && !p.excluded(addr):
		p.count(wire.OpUnbind)
		p.queueAddr(kernel.AddressOp{Kind: kernel.UnbindAddress, Addr: addr}, func(err error) {
			if err != nil {
				p.fail(names, fmt.Sprintf("unbind %v from %s", addr, kernel.DummyDevice), err)
				return
			}
			delete(p.known.bound, addr)
			entry()
		})
	default:
		entry()
	}
}

// bindDone handles the outcome of a queued bind of addr: on success it
// records the address as bound and runs then (the KUBE-IPVS-IPS entry).
// ErrNotFound means kube-ipvs0 was deleted behind our back: with retry,
// the dummy is created again (once per pass: the binds of the same batch
// all find it missing) and the bind queued once more.
func (p *pass) bindDone(addr netip.Addr, names []string, then func(), retry bool) func(error) {
	return func(err error) {
		if retry && errors.Is(err, kernel.ErrNotFound) {
			if !p.dummyMade {
				p.count(wire.OpCreateDummy)
				if _, err = p.k.Links.EnsureDummy(kernel.DummyDevice); err == nil {
					p.dummyMade = true
				}
			}
			if p.dummyMade {
				p.queueAddr(kernel.AddressOp{Kind: kernel.BindAddress, Addr: addr}, p.bindDone(addr, names, then, false))
				return
			}
		}
		if err != nil {
			p.fail(names, fmt.Sprintf("bind %v to %s", addr, kernel.DummyDevice), err)
			return
		}
		if p.known.bound != nil {
			p.known.bound[addr] = true
		}
		then()
	}
}
