package kernel

import "net/netip"

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
//   - DeleteDummy of a missing device is nil.
//   - BindAddress adds addr as a host route (/32, /128) to dev; added is
//     false when it was already bound (not an error). Missing dev:
//     ErrNotFound.
//   - UnbindAddress of an address not bound, or on a missing dev, is nil.
//   - BoundAddresses lists the addresses on dev (sorted), excluding IPv6
//     link-local ones the kernel adds itself; missing dev: ErrNotFound.
//   - LocalAddresses lists every address of every interface (all
//     families, including loopback and the dummy device), sorted by
//     interface index then address.
//   - Bad input (invalid or zoned address, empty name): ErrInvalid.
//   - Safe for concurrent use.
type Links interface {
	EnsureDummy(name string) (created bool, err error)
	DeleteDummy(name string) error
	BindAddress(dev string, addr netip.Addr) (added bool, err error)
	UnbindAddress(dev string, addr netip.Addr) error
	BoundAddresses(dev string) ([]netip.Addr, error)
	LocalAddresses() ([]InterfaceAddress, error)
}
