package kernel

import (
	"context"
	"fmt"
	"net/netip"
)

// DummyDevice is the device kube-proxy binds service addresses to.
const DummyDevice = "kube-ipvs0"

// InterfaceAddress is one address configured on a local interface.
type InterfaceAddress struct {
	Interface string
	Index     int
	// Prefix is the address with its configured prefix length; Prefix.Addr()
	// is the address itself.
	Prefix netip.Prefix
}

// Links manages the dummy device and the addresses bound to it, and reports
// the node's local addresses.
//
// Contract:
//   - EnsureDummy creates a dummy device, left down like kube-proxy does
//     (IPVS only needs the addresses to be local); created is false when it
//     already existed. A non-dummy device of that name: ErrExist.
//   - BoundAddresses lists the addresses on dev (sorted), excluding IPv6
//     link-local ones the kernel adds itself; missing dev: ErrNotFound.
//   - LocalAddresses lists every address of every interface (all
//     families, including loopback and the dummy device), sorted by
//     interface index then address.
//   - ApplyAddresses performs a batch of binds and unbinds on dev in
//     order and returns one error per op (nil: done); a failed op does not
//     stop the ones after it. The Linux implementation sends many ops per
//     netlink round trip. A bind adds the address as a host route (/32,
//     /128); binding a bound address is nil; binds to a missing dev are
//     ErrNotFound. An unbind of an address not bound, or on a missing dev,
//     is nil.
//   - The agent never deletes the dummy device: the interface has no such
//     write (the implementations' DeleteDummy serves tests and the
//     contract suite's clean-up).
//   - Bad input (invalid or zoned address, empty name): ErrInvalid.
//   - Safe for concurrent use.
type Links interface {
	EnsureDummy(name string) (created bool, err error)
	ApplyAddresses(dev string, ops []AddressOp) []error
	BoundAddresses(dev string) ([]netip.Addr, error)
	LocalAddresses() ([]InterfaceAddress, error)
}

// AddressWatcher is what a Links may also do: report addresses removed
// from the interfaces of its network namespace as they go, so the agent
// rebinds a Service address someone deleted (`ip addr del`, kube-ipvs0
// deleted) at once instead of at its next full reconcile. Optional: without
// it drift waits for the period, as kube-proxy's does for its sync.
//
// Contract:
//   - WatchRemovedAddresses returns once the watch is established (or
//     with why it cannot be); from then until ctx ends it calls removed,
//     from one goroutine at a time, with every address removed from any
//     interface (unmapped), the agent's own unbinds included, and with the
//     zero Addr when removals may have been missed (the watch broke and was
//     established again).
//   - removed must return quickly: events are not held for it.
type AddressWatcher interface {
	WatchRemovedAddresses(ctx context.Context, removed func(netip.Addr)) error
}

// AddressOpKind names the write an AddressOp performs.
type AddressOpKind uint8

const (
	BindAddress AddressOpKind = iota + 1
	UnbindAddress
)

func (k AddressOpKind) String() string {
	switch k {
	case BindAddress:
		return "bind"
	case UnbindAddress:
		return "unbind"
	}
	return fmt.Sprintf("address op %d", uint8(k))
}

// AddressOp is one write of a Links.ApplyAddresses batch.
type AddressOp struct {
	Kind AddressOpKind
	Addr netip.Addr
}

// Validate reports an op ApplyAddresses refuses as ErrInvalid.
func (op AddressOp) Validate() error {
	if op.Kind != BindAddress && op.Kind != UnbindAddress {
		return fmt.Errorf("links: %v: %w", op.Kind, ErrInvalid)
	}
	if err := CheckAddr(op.Addr); err != nil {
		return fmt.Errorf("links: %v: %w", op.Kind, err)
	}
	return nil
}
