package linux

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// The virtual server list is read on the batcher's reads socket with an
// in-place dump (nldump.go) rather than moby's GetServices, which built a
// Service with statistics for each of 20k servers per full pass at 10k
// Services. It reads the same attributes moby does, the same way.

const (
	ipvsCmdGetService = 4
	ipvsSvcAttrStats  = 10 // and later attributes: not read
)

// listServices dumps every virtual server of the namespace, sorted by key.
func (b *ipvsBatcher) listServices(sizeHint int) ([]kernel.VirtualServer, error) {
	out := make([]kernel.VirtualServer, 0, sizeHint)
	err := b.reads.dump(func(buf []byte) ([]byte, uint16, uint16) {
		return append(buf, ipvsCmdGetService, ipvsGenlVersion, 0, 0), b.family, unix.NLM_F_DUMP
	}, func(msg []byte) error {
		vs, err := parseServiceMsg(msg)
		if err != nil {
			return err
		}
		out = append(out, vs)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b kernel.VirtualServer) int { return a.Key.Compare(b.Key) })
	return out, nil
}

// parseServiceMsg reads one IPVS_CMD_NEW_SERVICE reply: a genlmsghdr and
// IPVS_CMD_ATTR_SERVICE holding the service's attributes.
func parseServiceMsg(msg []byte) (kernel.VirtualServer, error) {
	if len(msg) < unix.GENL_HDRLEN {
		return kernel.VirtualServer{}, fmt.Errorf("ipvs: short service message (%d bytes)", len(msg))
	}
	var svc []byte
	if err := walkAttrs(msg[unix.GENL_HDRLEN:], func(typ uint16, v []byte) error {
		if typ == ipvsCmdAttrService {
			svc = v
		}
		return nil
	}); err != nil {
		return kernel.VirtualServer{}, fmt.Errorf("ipvs: service message: %w", err)
	}
	if svc == nil {
		return kernel.VirtualServer{}, fmt.Errorf("ipvs: service message without a service")
	}
	var (
		af, proto, port uint16
		fwmark, netmask uint32
		addr            []byte
		vs              kernel.VirtualServer
	)
	short := func(typ uint16, v []byte, n int) error {
		if len(v) < n {
			return fmt.Errorf("service attribute %d: %d bytes, want %d", typ, len(v), n)
		}
		return nil
	}
	err := walkAttrs(svc, func(typ uint16, v []byte) error {
		var err error
		switch typ {
		case ipvsSvcAttrAF:
			if err = short(typ, v, 2); err == nil {
				af = binary.NativeEndian.Uint16(v)
			}
		case ipvsSvcAttrProtocol:
			if err = short(typ, v, 2); err == nil {
				proto = binary.NativeEndian.Uint16(v)
			}
		case ipvsSvcAttrAddr:
			addr = v
		case ipvsSvcAttrPort:
			if err = short(typ, v, 2); err == nil {
				port = binary.BigEndian.Uint16(v)
			}
		case ipvsSvcAttrFWMark:
			if err = short(typ, v, 4); err == nil {
				fwmark = binary.NativeEndian.Uint32(v)
			}
		case ipvsSvcAttrSchedName:
			vs.Scheduler = schedulerName(v)
		case ipvsSvcAttrFlags: // struct ip_vs_flags: flags, then mask
			if err = short(typ, v, 4); err == nil {
				vs.Flags = kernel.ServiceFlags(binary.NativeEndian.Uint32(v))
			}
		case ipvsSvcAttrTimeout:
			if err = short(typ, v, 4); err == nil {
				vs.Timeout = binary.NativeEndian.Uint32(v)
			}
		case ipvsSvcAttrNetmask:
			if err = short(typ, v, 4); err == nil {
				netmask = binary.NativeEndian.Uint32(v)
			}
		}
		return err
	})
	if err != nil {
		return kernel.VirtualServer{}, fmt.Errorf("ipvs: service: %w", err)
	}
	var fam kernel.Family
	switch af {
	case unix.AF_INET:
		fam = kernel.FamilyIPv4
	case unix.AF_INET6:
		fam = kernel.FamilyIPv6
	default:
		return kernel.VirtualServer{}, fmt.Errorf("ipvs: service with address family %d", af)
	}
	if fwmark != 0 {
		vs.Key = kernel.FWMarkKey(fam, fwmark)
	} else {
		a, err := serviceAddr(fam, addr)
		if err != nil {
			return kernel.VirtualServer{}, err
		}
		vs.Key = kernel.AddrKey(a, kernel.Protocol(proto), port)
	}
	vs.Netmask = netmaskFromKernel(fam, netmask)
	return vs.Normalize(), nil
}

// serviceAddr reads IPVS_SVC_ATTR_ADDR, a union nf_inet_addr: an IPv4
// address is its first 4 bytes.
func serviceAddr(fam kernel.Family, v []byte) (netip.Addr, error) {
	switch {
	case fam == kernel.FamilyIPv4 && len(v) >= 4:
		return netip.AddrFrom4([4]byte(v[:4])), nil
	case fam == kernel.FamilyIPv6 && len(v) >= 16:
		return netip.AddrFrom16([16]byte(v[:16])), nil
	}
	return netip.Addr{}, fmt.Errorf("ipvs: service address of %d bytes for %v", len(v), fam)
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
