package kernel

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"net/netip"
	"time"
)

// ServiceFlags are the IPVS virtual-server flags (IP_VS_SVC_F_*).
type ServiceFlags uint32

const (
	FlagPersistent ServiceFlags = 0x1
	// FlagHashed is kernel-internal (set on every service in the table).
	// It is ignored on write and never returned on read.
	FlagHashed    ServiceFlags = 0x2
	FlagOnePacket ServiceFlags = 0x4
	// FlagSched1..3 are scheduler-specific; sh and mh give them names.
	FlagSched1 ServiceFlags = 0x8
	FlagSched2 ServiceFlags = 0x10
	FlagSched3 ServiceFlags = 0x20

	FlagSHFallback = FlagSched1
	FlagSHPort     = FlagSched2
	FlagMHFallback = FlagSched1
	FlagMHPort     = FlagSched2

	// flagsKnown is every flag a caller may set.
	flagsKnown = FlagPersistent | FlagHashed | FlagOnePacket | FlagSched1 | FlagSched2 | FlagSched3
)

// VirtualServerKey identifies an IPVS virtual server: either by
// (Address, Protocol, Port) or, when FWMark is non-zero, by (FWMark, Family).
// Build keys with AddrKey or FWMarkKey; the struct is comparable and
// usable as a map key once normalized.
type VirtualServerKey struct {
	Family   Family
	Address  netip.Addr
	Protocol Protocol
	Port     uint16
	FWMark   uint32
}

// AddrKey is the key of an address-based virtual server.
func AddrKey(addr netip.Addr, proto Protocol, port uint16) VirtualServerKey {
	addr = addr.Unmap()
	return VirtualServerKey{Family: FamilyOf(addr), Address: addr, Protocol: proto, Port: port}
}

// FWMarkKey is the key of a firewall-mark virtual server.
func FWMarkKey(family Family, mark uint32) VirtualServerKey {
	return VirtualServerKey{Family: family, FWMark: mark}
}

// Normalize fills Family from Address and clears the address fields of
// firewall-mark keys, so equal servers have equal keys.
func (k VirtualServerKey) Normalize() VirtualServerKey {
	if k.FWMark != 0 {
		return VirtualServerKey{Family: k.Family, FWMark: k.FWMark}
	}
	k.Address = k.Address.Unmap()
	if k.Family == FamilyUnspecified {
		k.Family = FamilyOf(k.Address)
	}
	return k
}

// Validate reports a key the kernel would reject, wrapping ErrInvalid.
func (k VirtualServerKey) Validate() error {
	if k.FWMark != 0 {
		if !k.Family.Valid() {
			return fmt.Errorf("ipvs key %v: fwmark service needs family inet or inet6: %w", k, ErrInvalid)
		}
		return nil
	}
	if !k.Address.IsValid() {
		return fmt.Errorf("ipvs key %v: no address and no fwmark: %w", k, ErrInvalid)
	}
	if err := CheckAddr(k.Address); err != nil {
		return fmt.Errorf("ipvs key: %w", err)
	}
	if k.Family != FamilyUnspecified && k.Family != FamilyOf(k.Address.Unmap()) {
		return fmt.Errorf("ipvs key %v: family %v does not match address: %w", k, k.Family, ErrInvalid)
	}
	if !k.Protocol.Valid() {
		return fmt.Errorf("ipvs key %v: protocol must be tcp, udp or sctp: %w", k, ErrInvalid)
	}
	return nil
}

// Compare orders keys the way List methods return them: address servers
// before fwmark servers, then by family, address, protocol, port and mark.
//
// It returns at the first field that differs (cmp.Or would evaluate every
// comparison first): the reads sort the whole table by it, 2,000 servers
// per drift probe at 1k Services.
func (k VirtualServerKey) Compare(o VirtualServerKey) int {
	if c := cmp.Compare(boolInt(k.FWMark != 0), boolInt(o.FWMark != 0)); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Family, o.Family); c != 0 {
		return c
	}
	if c := k.Address.Compare(o.Address); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Protocol, o.Protocol); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Port, o.Port); c != 0 {
		return c
	}
	return cmp.Compare(k.FWMark, o.FWMark)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// String is "tcp/198.18.0.1:80", "tcp/[2001:2::1]:80" or "fwmark/inet/0x10".
func (k VirtualServerKey) String() string {
	if k.FWMark != 0 {
		return fmt.Sprintf("fwmark/%v/%#x", k.Family, k.FWMark)
	}
	return fmt.Sprintf("%v/%v", k.Protocol, netip.AddrPortFrom(k.Address, k.Port))
}

// VirtualServer is one IPVS service.
type VirtualServer struct {
	Key       VirtualServerKey
	Scheduler string // "rr", "wrr", "sh", "mh", ...; required
	Flags     ServiceFlags
	// Timeout is the persistence timeout in seconds (used with FlagPersistent).
	Timeout uint32
	// Netmask is the persistence granularity as a prefix length; 0 means
	// the full address (32 or 128), which is what kube-proxy uses.
	Netmask uint8
}

// Normalize returns vs the way implementations return it from reads:
// normalized key, FlagHashed cleared, Netmask 0 replaced by the full length.
// Compare desired and actual servers after normalizing both.
func (vs VirtualServer) Normalize() VirtualServer {
	vs.Key = vs.Key.Normalize()
	vs.Flags &^= FlagHashed
	if vs.Netmask == 0 {
		vs.Netmask = vs.Key.Family.fullBits()
	}
	return vs
}

// Validate reports a server the kernel would reject, wrapping ErrInvalid.
func (vs VirtualServer) Validate() error {
	if err := vs.Key.Validate(); err != nil {
		return err
	}
	if vs.Scheduler == "" || len(vs.Scheduler) > 15 {
		return fmt.Errorf("virtual server %v: scheduler %q must be 1..15 characters: %w", vs.Key, vs.Scheduler, ErrInvalid)
	}
	if vs.Flags&^flagsKnown != 0 {
		return fmt.Errorf("virtual server %v: unknown flags %#x: %w", vs.Key, uint32(vs.Flags&^flagsKnown), ErrInvalid)
	}
	fam := vs.Key.Normalize().Family
	if vs.Netmask > fam.fullBits() {
		return fmt.Errorf("virtual server %v: netmask /%d too long for %v: %w", vs.Key, vs.Netmask, fam, ErrInvalid)
	}
	return nil
}

func (f Family) fullBits() uint8 {
	if f == FamilyIPv6 {
		return 128
	}
	return 32
}

// ForwardMethod is how IPVS reaches a destination (IP_VS_CONN_F_FWD_MASK).
type ForwardMethod uint8

const (
	ForwardMasq        ForwardMethod = 0 // NAT; what kube-proxy uses
	ForwardLocal       ForwardMethod = 1
	ForwardTunnel      ForwardMethod = 2
	ForwardDirectRoute ForwardMethod = 3
)

// DestinationKey identifies a destination within one virtual server.
type DestinationKey struct {
	Address netip.Addr
	Port    uint16
}

// Compare orders destinations by address, then port.
func (k DestinationKey) Compare(o DestinationKey) int {
	if c := k.Address.Compare(o.Address); c != 0 {
		return c
	}
	return cmp.Compare(k.Port, o.Port)
}

func (k DestinationKey) String() string { return netip.AddrPortFrom(k.Address, k.Port).String() }

// Destination is one IPVS real server.
type Destination struct {
	Address netip.Addr
	Port    uint16
	Weight  int // >= 0; 0 keeps existing connections but takes no new ones
	Forward ForwardMethod
	// ActiveConn and InactiveConn are read back from the kernel; ignored on
	// write.
	ActiveConn   uint32
	InactiveConn uint32
}

// Key returns the destination's identity.
func (d Destination) Key() DestinationKey {
	return DestinationKey{Address: d.Address.Unmap(), Port: d.Port}
}

// Validate reports a destination the kernel would reject for a server of
// the given family, wrapping ErrInvalid.
func (d Destination) Validate(family Family) error {
	if !d.Address.IsValid() {
		return fmt.Errorf("destination %v: no address: %w", d.Key(), ErrInvalid)
	}
	if err := CheckAddr(d.Address); err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	if FamilyOf(d.Address.Unmap()) != family {
		return fmt.Errorf("destination %v: family differs from virtual server (%v): %w", d.Key(), family, ErrInvalid)
	}
	if d.Weight < 0 || d.Weight > 1<<31-1 {
		return fmt.Errorf("destination %v: weight %d out of range: %w", d.Key(), d.Weight, ErrInvalid)
	}
	if d.Forward > ForwardDirectRoute {
		return fmt.Errorf("destination %v: unknown forward method %d: %w", d.Key(), d.Forward, ErrInvalid)
	}
	return nil
}

// Timeouts are the IPVS connection timeouts (ipvsadm --set). On write, a
// zero field leaves the kernel's value unchanged; values must be whole
// seconds. Kernel defaults: TCP 900s, TCPFin 120s, UDP 300s.
type Timeouts struct {
	TCP    time.Duration
	TCPFin time.Duration
	UDP    time.Duration
}

// Validate rejects negative and sub-second values.
func (t Timeouts) Validate() error {
	for _, d := range []time.Duration{t.TCP, t.TCPFin, t.UDP} {
		if d < 0 || d%time.Second != 0 || d/time.Second > 1<<31-1 {
			return fmt.Errorf("ipvs timeout %v: must be whole seconds >= 0: %w", d, ErrInvalid)
		}
	}
	return nil
}

// IPVS manages the IPVS table of one network namespace. Its writes are
// batches (Apply); the agent has no other way to change the table.
//
// Contract (the contract suite checks each point against both the memory
// and the Linux implementation):
//   - Reads return normalized values (see VirtualServer.Normalize) sorted by
//     key; ListDestinations sorted by (address, port).
//   - Apply performs ops in order and returns one error per op (nil: done).
//     AddVirtualServer of an existing key: ErrExist. Update/Delete of a
//     missing key, and GetVirtualServer of one: ErrNotFound. Add/Update with
//     a scheduler the kernel does not have: ErrUnsupported. Deleting a
//     server deletes its destinations.
//   - AddDestination to a missing server: ErrNotFound; of an existing
//     destination: ErrExist. Update/Delete of a missing destination:
//     ErrNotFound.
//   - A failed op does not stop the ones after it; an op that depended on
//     it fails by itself (a destination of a server whose add failed:
//     ErrNotFound).
//   - SetTimeouts: zero fields are left unchanged.
//   - Bad input (including addresses with an IPv6 zone, see CheckAddr):
//     ErrInvalid, the kernel is not called.
//   - Safe for concurrent use.
type IPVS interface {
	ListVirtualServers() ([]VirtualServer, error)
	GetVirtualServer(key VirtualServerKey) (VirtualServer, error)
	ListDestinations(key VirtualServerKey) ([]Destination, error)

	// Apply performs ops in order (see the contract above). The Linux
	// implementation sends many ops per netlink round trip; that is the
	// point of it (issue: one syscall per real server made bursts slow).
	Apply(ops []IPVSOp) []error

	SetTimeouts(t Timeouts) error
	Timeouts() (Timeouts, error)

	// Schedulers lists the scheduler names this kernel can use (sorted),
	// an agent capability.
	Schedulers() ([]string, error)
}

// VirtualServerDigester is an optional IPVS capability: a digest of the
// whole virtual-server table in one read, without building, sorting or
// comparing a list. The drift probe reads it every 5 s: when it equals the
// digest of a listing the probe found right and the agent wrote nothing
// since, the table is as it was. Listing, sorting and comparing 2,000
// servers at every probe was half of its cost, and the probe most of a
// quiet agent's CPU at 1k Services (#27).
//
// Contract (the contract suite checks it against both implementations):
//   - DigestVirtualServers equals DigestOf(ListVirtualServers()) when
//     nothing changes meanwhile, and differs when a server is added,
//     deleted or changed (but for a 64-bit hash collision).
//   - Unavailable: ErrUnsupported; the caller lists.
type VirtualServerDigester interface {
	DigestVirtualServers() (uint64, error)
}

// digestSeed makes digests comparable within one process only: they are
// never stored or sent.
var digestSeed = maphash.MakeSeed()

// DigestOf is the digest of a table listed as list, in any order: the sum
// of each normalized server's hash.
func DigestOf(list []VirtualServer) uint64 {
	var d uint64
	for _, vs := range list {
		d += vs.Digest()
	}
	return d
}

// Digest is vs's term of DigestOf (vs as reads return it: normalized).
func (vs VirtualServer) Digest() uint64 { return maphash.Comparable(digestSeed, vs) }

// DestinationDumper is an optional IPVS capability: the destinations of
// every address-based virtual server in one read of the kernel. A periodic
// full pass otherwise calls ListDestinations once per server, 2,000 round
// trips at 1k Services, which was most of what a quiet agent spent its CPU
// on (#27).
//
// Contract (the contract suite checks it against both implementations):
//   - Each list equals what ListDestinations returns for that server when
//     nothing changes meanwhile: the same fields, sorted by key.
//   - A server may be missing from the map: firewall-mark servers always are
//     (the kernel's dump does not say their family), and a server changed
//     while the dump was read may be. Callers read a missing server with
//     ListDestinations; servers in the map may be ones no longer listed.
//   - Unavailable (e.g. no procfs): ErrUnsupported; the caller falls back.
type DestinationDumper interface {
	DumpDestinations() (map[VirtualServerKey][]Destination, error)
}

// IPVSOpKind names the write an IPVSOp performs. UpdateVirtualServer
// changes scheduler, flags, timeout and netmask; UpdateDestination weight
// and forward method.
type IPVSOpKind uint8

const (
	AddVirtualServer IPVSOpKind = iota + 1
	UpdateVirtualServer
	DeleteVirtualServer
	AddDestination
	UpdateDestination
	DeleteDestination
)

func (k IPVSOpKind) String() string {
	switch k {
	case AddVirtualServer:
		return "add virtual server"
	case UpdateVirtualServer:
		return "update virtual server"
	case DeleteVirtualServer:
		return "delete virtual server"
	case AddDestination:
		return "add destination"
	case UpdateDestination:
		return "update destination"
	case DeleteDestination:
		return "delete destination"
	}
	return fmt.Sprintf("ipvs op %d", uint8(k))
}

// IPVSOp is one write of an IPVS.Apply batch.
type IPVSOp struct {
	Kind IPVSOpKind
	// Server is the whole server for Add/UpdateVirtualServer; the other
	// kinds use only Server.Key.
	Server VirtualServer
	// Destination is used by the destination kinds (Delete: its key only).
	Destination Destination
}
