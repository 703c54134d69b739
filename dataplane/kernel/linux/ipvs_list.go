package linux

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// The virtual servers and a server's real servers are read on the
// batcher's reads socket with in-place dumps (nldump.go) rather than moby's
// GetServices and GetDestinations, which built a struct with statistics
// and slices per object (20k servers per full pass at 10k Services; the
// real servers of each server /proc/net/ip_vs left out, and of each
// draining one every few seconds). They read the attributes moby read, the
// same way.

const (
	ipvsCmdGetService = 4
	ipvsSvcAttrStats  = 10 // and later attributes: not read
)

// listServices dumps every virtual server of the namespace, sorted by key.
func (b *ipvsBatcher) listServices(sizeHint int) ([]kernel.VirtualServer, error) {
	out := make([]kernel.VirtualServer, 0, sizeHint)
	if err := b.eachService(func(vs kernel.VirtualServer) { out = append(out, vs) }); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b kernel.VirtualServer) int { return a.Key.Compare(b.Key) })
	return out, nil
}

// digestServices dumps every virtual server of the namespace into
// kernel.DigestOf's sum, in the kernel's order.
func (b *ipvsBatcher) digestServices() (uint64, error) {
	var d uint64
	err := b.eachService(func(vs kernel.VirtualServer) { d += vs.Digest() })
	return d, err
}

// eachService dumps every virtual server of the namespace, in the kernel's
// order.
func (b *ipvsBatcher) eachService(each func(kernel.VirtualServer)) error {
	return b.reads.dump(func(buf []byte) ([]byte, uint16, uint16) {
		return append(buf, ipvsCmdGetService, ipvsGenlVersion, 0, 0), b.family, unix.NLM_F_DUMP
	}, func(msg []byte) error {
		vs, err := parseServiceMsg(msg)
		if err != nil {
			return err
		}
		each(vs)
		return nil
	})
}

// parseServiceMsg reads one IPVS_CMD_NEW_SERVICE reply: a genlmsghdr and
// IPVS_CMD_ATTR_SERVICE holding the service's attributes.
func parseServiceMsg(msg []byte) (kernel.VirtualServer, error) {
	svc, err := genlNested(msg, ipvsCmdAttrService, "service")
	if err != nil {
		return kernel.VirtualServer{}, err
	}
	var (
		af, proto, port uint16
		fwmark, netmask uint32
		addr            []byte
		vs              kernel.VirtualServer
	)
	err = walkAttrs(svc, func(typ uint16, v []byte) error {
		switch typ {
		case ipvsSvcAttrAddr:
			addr = v
			return nil
		case ipvsSvcAttrSchedName:
			vs.Scheduler = schedulerName(v)
			return nil
		}
		width := 4
		switch typ {
		case ipvsSvcAttrAF, ipvsSvcAttrProtocol, ipvsSvcAttrPort:
			width = 2
		case ipvsSvcAttrFWMark, ipvsSvcAttrFlags, ipvsSvcAttrTimeout, ipvsSvcAttrNetmask:
		default:
			return nil // statistics and later attributes
		}
		if len(v) < width {
			return fmt.Errorf("service attribute %d: %d bytes, want %d", typ, len(v), width)
		}
		switch typ {
		case ipvsSvcAttrAF:
			af = binary.NativeEndian.Uint16(v)
		case ipvsSvcAttrProtocol:
			proto = binary.NativeEndian.Uint16(v)
		case ipvsSvcAttrPort:
			port = binary.BigEndian.Uint16(v)
		case ipvsSvcAttrFWMark:
			fwmark = binary.NativeEndian.Uint32(v)
		case ipvsSvcAttrFlags: // struct ip_vs_flags: flags, then mask
			vs.Flags = kernel.ServiceFlags(binary.NativeEndian.Uint32(v))
		case ipvsSvcAttrTimeout:
			vs.Timeout = binary.NativeEndian.Uint32(v)
		case ipvsSvcAttrNetmask:
			netmask = binary.NativeEndian.Uint32(v)
		}
		return nil
	})
	if err != nil {
		return kernel.VirtualServer{}, fmt.Errorf("ipvs: service: %w", err)
	}
	fam, ok := familyOfAF(af)
	if !ok {
		return kernel.VirtualServer{}, fmt.Errorf("ipvs: service with address family %d", af)
	}
	if fwmark != 0 {
		vs.Key = kernel.FWMarkKey(fam, fwmark)
	} else {
		a, err := inetAddr(fam, addr)
		if err != nil {
			return kernel.VirtualServer{}, fmt.Errorf("ipvs: service: %w", err)
		}
		vs.Key = kernel.AddrKey(a, kernel.Protocol(proto), port)
	}
	vs.Netmask = netmaskFromKernel(fam, netmask)
	return vs.Normalize(), nil
}

// genlNested returns the value of the top-level attribute typ of a generic
// netlink reply (after its genlmsghdr); what names the object in errors.
func genlNested(msg []byte, typ uint16, what string) ([]byte, error) {
	if len(msg) < unix.GENL_HDRLEN {
		return nil, fmt.Errorf("ipvs: short %s message (%d bytes)", what, len(msg))
	}
	var nested []byte
	if err := walkAttrs(msg[unix.GENL_HDRLEN:], func(t uint16, v []byte) error {
		if t == typ {
			nested = v
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("ipvs: %s message: %w", what, err)
	}
	if nested == nil {
		return nil, fmt.Errorf("ipvs: %s message without a %s", what, what)
	}
	return nested, nil
}

// familyOfAF maps AF_INET and AF_INET6.
func familyOfAF(af uint16) (kernel.Family, bool) {
	switch af {
	case unix.AF_INET:
		return kernel.FamilyIPv4, true
	case unix.AF_INET6:
		return kernel.FamilyIPv6, true
	}
	return kernel.FamilyUnspecified, false
}

// inetAddr reads an address attribute (IPVS_SVC_ATTR_ADDR,
// IPVS_DEST_ATTR_ADDR), a union nf_inet_addr: an IPv4 address is its first
// 4 bytes.
func inetAddr(fam kernel.Family, v []byte) (netip.Addr, error) {
	switch {
	case fam == kernel.FamilyIPv4 && len(v) >= 4:
		return netip.AddrFrom4([4]byte(v[:4])), nil
	case fam == kernel.FamilyIPv6 && len(v) >= 16:
		return netip.AddrFrom16([16]byte(v[:16])), nil
	}
	return netip.Addr{}, fmt.Errorf("address of %d bytes for %v", len(v), fam)
}

// schedulerName returns the NUL-terminated name in v, without allocating
// for the schedulers the kernel ships.
func schedulerName(v []byte) string {
	if i := slices.Index(v, 0); i >= 0 {
		v = v[:i]
	}
	for _, s := range knownSchedulers {
		if string(v) == s {
			return s
		}
	}
	return string(v)
}

var knownSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

const (
	ipvsCmdGetDest = 8

	ipvsDestAttrActiveConns = 7
	ipvsDestAttrInactConns  = 8
	ipvsDestAttrAddrFamily  = 11 // since Linux 3.18
)

// listDestinations dumps the real servers of key (none, without error, when
// the server does not exist: the kernel dumps nothing).
func (b *ipvsBatcher) listDestinations(key kernel.VirtualServerKey) ([]kernel.Destination, error) {
	var out []kernel.Destination
	err := b.reads.dump(func(buf []byte) ([]byte, uint16, uint16) {
		buf = append(buf, ipvsCmdGetDest, ipvsGenlVersion, 0, 0)
		return appendServiceAttr(buf, kernel.VirtualServer{Key: key}, false), b.family, unix.NLM_F_DUMP
	}, func(msg []byte) error {
		d, err := parseDestMsg(msg, key.Family)
		if err != nil {
			return err
		}
		out = append(out, d)
		return nil
	})
	return out, err
}

// parseDestMsg reads one IPVS_CMD_NEW_DEST reply: a genlmsghdr and
// IPVS_CMD_ATTR_DEST. A kernel older than 3.18 sends no address family:
// the server's (svcFamily) is the destination's then (no mixed families
// before 3.18).
func parseDestMsg(msg []byte, svcFamily kernel.Family) (kernel.Destination, error) {
	dest, err := genlNested(msg, ipvsCmdAttrDest, "destination")
	if err != nil {
		return kernel.Destination{}, err
	}
	var (
		d    kernel.Destination
		af   uint16
		addr []byte
	)
	err = walkAttrs(dest, func(typ uint16, v []byte) error {
		width := 4
		switch typ {
		case ipvsDestAttrAddr:
			addr = v
			return nil
		case ipvsDestAttrPort, ipvsDestAttrAddrFamily:
			width = 2
		case ipvsDestAttrFwdMethod, ipvsDestAttrWeight, ipvsDestAttrActiveConns, ipvsDestAttrInactConns:
		default:
			return nil // thresholds, statistics and later attributes
		}
		if len(v) < width {
			return fmt.Errorf("destination attribute %d: %d bytes, want %d", typ, len(v), width)
		}
		switch typ {
		case ipvsDestAttrPort:
			d.Port = binary.BigEndian.Uint16(v)
		case ipvsDestAttrAddrFamily:
			af = binary.NativeEndian.Uint16(v)
		case ipvsDestAttrFwdMethod:
			d.Forward = kernel.ForwardMethod(binary.NativeEndian.Uint32(v) & ipvs.ConnFwdMask)
		case ipvsDestAttrWeight:
			d.Weight = int(int32(binary.NativeEndian.Uint32(v)))
		case ipvsDestAttrActiveConns:
			d.ActiveConn = binary.NativeEndian.Uint32(v)
		case ipvsDestAttrInactConns:
			d.InactiveConn = binary.NativeEndian.Uint32(v)
		}
		return nil
	})
	if err != nil {
		return kernel.Destination{}, fmt.Errorf("ipvs: destination: %w", err)
	}
	fam, ok := familyOfAF(af)
	switch {
	case af == 0:
		fam = svcFamily
	case !ok:
		return kernel.Destination{}, fmt.Errorf("ipvs: destination with address family %d", af)
	}
	a, err := inetAddr(fam, addr)
	if err != nil {
		return kernel.Destination{}, fmt.Errorf("ipvs: destination: %w", err)
	}
	d.Address = a.Unmap()
	return d, nil
}
