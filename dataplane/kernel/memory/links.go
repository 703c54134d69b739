package memory

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

type linkState struct {
	byName    map[string]*iface
	nextIndex int
}

type iface struct {
	index int
	kind  string // "dummy", "veth", ...
	addrs []netip.Prefix
}

func (s *linkState) init() {
	s.byName = map[string]*iface{}
	s.nextIndex = 1
}

// Links is the kernel.Links view of a memory Kernel.
type Links Kernel

var _ kernel.Links = (*Links)(nil)

func (m *Links) k() *Kernel { return (*Kernel)(m) }

// AddInterface adds a device (kind like "veth", "dummy", "loopback") with
// addresses, to model a node's interfaces. An existing device gets the
// addresses added.
func (k *Kernel) AddInterface(name, kind string, addrs ...netip.Prefix) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ifc := k.links.byName[name]
	if ifc == nil {
		ifc = &iface{index: k.links.nextIndex, kind: kind}
		k.links.nextIndex++
		k.links.byName[name] = ifc
	}
	for _, a := range addrs {
		a = netip.PrefixFrom(a.Addr().Unmap(), a.Bits())
		if !slices.ContainsFunc(ifc.addrs, func(p netip.Prefix) bool { return p.Addr() == a.Addr() }) {
			ifc.addrs = append(ifc.addrs, a)
		}
	}
}

func validDev(name string) error {
	if name == "" || len(name) > 15 {
		return fmt.Errorf("device name %q must be 1..15 bytes: %w", name, kernel.ErrInvalid)
	}
	return nil
}

func validBindAddr(a netip.Addr) error {
	if err := kernel.CheckAddr(a); err != nil {
		return fmt.Errorf("bind address: %w", err)
	}
	return nil
}

func hostPrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

func (m *Links) EnsureDummy(name string) (bool, error) {
	if err := validDev(name); err != nil {
		return false, err
	}
	k := m.k()
	if err := k.begin("link.EnsureDummy"); err != nil {
		return false, err
	}
	defer k.mu.Unlock()
	if ifc, ok := k.links.byName[name]; ok {
		if ifc.kind != "dummy" {
			return false, fmt.Errorf("device %s exists with type %s: %w", name, ifc.kind, kernel.ErrExist)
		}
		return false, nil
	}
	k.links.byName[name] = &iface{index: k.links.nextIndex, kind: "dummy"}
	k.links.nextIndex++
	return true, nil
}

// DeleteDummy deletes a dummy device (a missing one is nil): for tests
// (drift) and the contract suite; the agent never deletes it, kernel.Links
// has no such write. A device of another kind: ErrInvalid.
func (m *Links) DeleteDummy(name string) error {
	if err := validDev(name); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("link.DeleteDummy"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	ifc, ok := k.links.byName[name]
	if !ok {
		return nil
	}
	if ifc.kind != "dummy" {
		return fmt.Errorf("device %s has type %s, not dummy: %w", name, ifc.kind, kernel.ErrInvalid)
	}
	delete(k.links.byName, name)
	for _, p := range ifc.addrs {
		k.notifyRemoved(p.Addr())
	}
	return nil
}

func (m *Links) bindAddress(dev string, addr netip.Addr) (bool, error) {
	if err := validDev(dev); err != nil {
		return false, err
	}
	if err := validBindAddr(addr); err != nil {
		return false, err
	}
	k := m.k()
	if err := k.begin("link.BindAddress"); err != nil {
		return false, err
	}
	defer k.mu.Unlock()
	ifc, ok := k.links.byName[dev]
	if !ok {
		return false, fmt.Errorf("bind %v to %s: %w", addr, dev, kernel.ErrNotFound)
	}
	p := hostPrefix(addr)
	if slices.ContainsFunc(ifc.addrs, func(q netip.Prefix) bool { return q.Addr() == p.Addr() }) {
		return false, nil
	}
	ifc.addrs = append(ifc.addrs, p)
	return true, nil
}

func (m *Links) unbindAddress(dev string, addr netip.Addr) error {
	if err := validDev(dev); err != nil {
		return err
	}
	if err := validBindAddr(addr); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("link.UnbindAddress"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	ifc, ok := k.links.byName[dev]
	if !ok {
		return nil
	}
	a := addr.Unmap()
	kept := slices.DeleteFunc(ifc.addrs, func(q netip.Prefix) bool { return q.Addr() == a })
	if len(kept) < len(ifc.addrs) {
		k.notifyRemoved(a)
	}
	ifc.addrs = kept
	return nil
}

// ApplyAddresses performs ops one by one (see kernel.Links.ApplyAddresses),
// so fault hooks and call counters see every op ("link.BindAddress",
// "link.UnbindAddress").
func (m *Links) ApplyAddresses(dev string, ops []kernel.AddressOp) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		switch op.Kind {
		case kernel.BindAddress:
			_, errs[i] = m.bindAddress(dev, op.Addr)
		case kernel.UnbindAddress:
			errs[i] = m.unbindAddress(dev, op.Addr)
		default:
			errs[i] = op.Validate()
		}
	}
	return errs
}

func (m *Links) BoundAddresses(dev string) ([]netip.Addr, error) {
	if err := validDev(dev); err != nil {
		return nil, err
	}
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	ifc, ok := k.links.byName[dev]
	if !ok {
		return nil, fmt.Errorf("addresses of %s: %w", dev, kernel.ErrNotFound)
	}
	out := []netip.Addr{}
	for _, p := range ifc.addrs {
		if p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
			continue
		}
		out = append(out, p.Addr())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func (m *Links) LocalAddresses() ([]kernel.InterfaceAddress, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []kernel.InterfaceAddress
	for name, ifc := range k.links.byName {
		for _, p := range ifc.addrs {
			out = append(out, kernel.InterfaceAddress{Interface: name, Index: ifc.index, Prefix: p})
		}
	}
	slices.SortFunc(out, func(a, b kernel.InterfaceAddress) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), a.Prefix.Addr().Compare(b.Prefix.Addr()))
	})
	return out, nil
}
