package linux

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// serviceReply builds an IPVS_CMD_NEW_SERVICE reply the way the kernel
// writes one (ip_vs_genl_fill_service): a 16-byte address union whatever
// the family, the flags with their mask, and nested statistics.
func serviceReply(af uint16, proto uint16, addr []byte, port uint16, fwmark uint32, sched string, flags, timeout, netmask uint32) []byte {
	b := []byte{ipvsCmdNewService, ipvsGenlVersion, 0, 0}
	b, nest := nlaNest(b, ipvsCmdAttrService)
	b = nlaU16(b, ipvsSvcAttrAF, af)
	if fwmark != 0 {
		b = nlaU32(b, ipvsSvcAttrFWMark, fwmark)
	} else {
		b = nlaU16(b, ipvsSvcAttrProtocol, proto)
		var union [16]byte
		copy(union[:], addr)
		b = nlaBytes(b, ipvsSvcAttrAddr, union[:])
		b = nlaBE16(b, ipvsSvcAttrPort, port)
	}
	b = nlaString(b, ipvsSvcAttrSchedName, sched)
	var fl [8]byte
	binary.NativeEndian.PutUint32(fl[0:], flags)
	binary.NativeEndian.PutUint32(fl[4:], 0xffffffff)
	b = nlaBytes(b, ipvsSvcAttrFlags, fl[:])
	b = nlaU32(b, ipvsSvcAttrTimeout, timeout)
	b = nlaU32(b, ipvsSvcAttrNetmask, netmask)
	b, stats := nlaNest(b, ipvsSvcAttrStats)
	b = nlaU32(b, 1, 12345) // IPVS_STATS_ATTR_CONNS: not read
	b = nlaEnd(b, stats)
	return nlaEnd(b, nest)
}

// TestParseServiceMsg: the in-place list reads what fromService read from
// moby's Service: keys of every kind, scheduler, flags, persistence.
func TestParseServiceMsg(t *testing.T) {
	a := netip.MustParseAddr
	v4mask := func(bits int) uint32 { // the kernel's __be32 mask, as read natively
		m := netip.PrefixFrom(a("255.255.255.255"), bits).Masked().Addr().As4()
		return binary.NativeEndian.Uint32(m[:])
	}
	for name, tc := range map[string]struct {
		msg  []byte
		want kernel.VirtualServer
	}{
		"IPv4 TCP": {
			serviceReply(unix.AF_INET, unix.IPPROTO_TCP, []byte{198, 18, 96, 1}, 80, 0, "rr", 0, 0, v4mask(32)),
			kernel.VirtualServer{Key: kernel.AddrKey(a("198.18.96.1"), kernel.ProtocolTCP, 80), Scheduler: "rr"},
		},
		"IPv4 UDP persistent /24": {
			serviceReply(unix.AF_INET, unix.IPPROTO_UDP, []byte{198, 18, 96, 2}, 53, 0, "wrr", uint32(kernel.FlagPersistent), 10800, v4mask(24)),
			kernel.VirtualServer{Key: kernel.AddrKey(a("198.18.96.2"), kernel.ProtocolUDP, 53), Scheduler: "wrr",
				Flags: kernel.FlagPersistent, Timeout: 10800, Netmask: 24},
		},
		"IPv6 SCTP": {
			serviceReply(unix.AF_INET6, unix.IPPROTO_SCTP, a("fd00::10").AsSlice(), 9, 0, "mh", 0, 0, 128),
			kernel.VirtualServer{Key: kernel.AddrKey(a("fd00::10"), kernel.ProtocolSCTP, 9), Scheduler: "mh"},
		},
		"fwmark, unknown scheduler": {
			serviceReply(unix.AF_INET, 0, nil, 0, 0x4000, "custom", 0, 0, v4mask(32)),
			kernel.VirtualServer{Key: kernel.FWMarkKey(kernel.FamilyIPv4, 0x4000), Scheduler: "custom"},
		},
	} {
		got, err := parseServiceMsg(tc.msg)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if want := tc.want.Normalize(); got != want {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
		}
	}
}

// TestParseServiceMsgRejects: a reply it cannot read fails the list.
func TestParseServiceMsgRejects(t *testing.T) {
	good := serviceReply(unix.AF_INET, unix.IPPROTO_TCP, []byte{198, 18, 96, 1}, 80, 0, "rr", 0, 0, 0xffffffff)
	noService := []byte{ipvsCmdNewService, ipvsGenlVersion, 0, 0}
	noService = nlaU32(noService, 2, 1) // IPVS_CMD_ATTR_DEST only
	badLen := append([]byte(nil), good...)
	binary.NativeEndian.PutUint16(badLen[4:], uint16(len(good))) // nest longer than the message
	badAF := serviceReply(99, unix.IPPROTO_TCP, []byte{198, 18, 96, 1}, 80, 0, "rr", 0, 0, 0)
	shortAddr := []byte{ipvsCmdNewService, ipvsGenlVersion, 0, 0}
	shortAddr, nest := nlaNest(shortAddr, ipvsCmdAttrService)
	shortAddr = nlaU16(shortAddr, ipvsSvcAttrAF, unix.AF_INET6)
	shortAddr = nlaBytes(shortAddr, ipvsSvcAttrAddr, []byte{1, 2, 3, 4})
	shortAddr = nlaEnd(shortAddr, nest)
	for name, msg := range map[string][]byte{
		"short":              good[:2],
		"no service":         noService,
		"bad length":         badLen,
		"unknown family":     badAF,
		"short IPv6 address": shortAddr,
	} {
		if got, err := parseServiceMsg(msg); err == nil || !strings.HasPrefix(err.Error(), "ipvs: ") {
			t.Errorf("%s: got %+v, %v; want an ipvs: error", name, got, err)
		}
	}
}

// destReply builds an IPVS_CMD_NEW_DEST reply the way the kernel writes one
// (ip_vs_genl_fill_dest): a 16-byte address union, thresholds, counters,
// nested statistics, and the address family unless af is 0 (pre-3.18).
func destReply(af uint16, addr []byte, port uint16, fwd, weight, active, inactive uint32) []byte {
	b := []byte{ipvsCmdNewDest, ipvsGenlVersion, 0, 0}
	b, nest := nlaNest(b, ipvsCmdAttrDest)
	var union [16]byte
	copy(union[:], addr)
	b = nlaBytes(b, ipvsDestAttrAddr, union[:])
	b = nlaBE16(b, ipvsDestAttrPort, port)
	b = nlaU32(b, ipvsDestAttrFwdMethod, fwd)
	b = nlaU32(b, ipvsDestAttrWeight, weight)
	b = nlaU32(b, ipvsDestAttrUThresh, 0)
	b = nlaU32(b, ipvsDestAttrLThresh, 0)
	b = nlaU32(b, ipvsDestAttrActiveConns, active)
	b = nlaU32(b, ipvsDestAttrInactConns, inactive)
	b = nlaU32(b, 9, 4) // IPVS_DEST_ATTR_PERSIST_CONNS: not read
	b, stats := nlaNest(b, 10)
	b = nlaU32(b, 1, 99)
	b = nlaEnd(b, stats)
	if af != 0 {
		b = nlaU16(b, ipvsDestAttrAddrFamily, af)
	}
	return nlaEnd(b, nest)
}

// TestParseDestMsg: the in-place read of a real server gives what
// ListDestinations gave from moby's Destination.
func TestParseDestMsg(t *testing.T) {
	a := netip.MustParseAddr
	for name, tc := range map[string]struct {
		msg  []byte
		svc  kernel.Family
		want kernel.Destination
	}{
		"IPv4 masq with connections": {destReply(unix.AF_INET, []byte{198, 19, 1, 2}, 8080, 0, 1, 3, 17), kernel.FamilyIPv4,
			kernel.Destination{Address: a("198.19.1.2"), Port: 8080, Weight: 1, Forward: kernel.ForwardMasq, ActiveConn: 3, InactiveConn: 17}},
		"draining, direct route, flag bits above the method": {destReply(unix.AF_INET, []byte{198, 19, 1, 3}, 80, 0x0100|uint32(kernel.ForwardDirectRoute), 0, 1, 0), kernel.FamilyIPv4,
			kernel.Destination{Address: a("198.19.1.3"), Port: 80, Weight: 0, Forward: kernel.ForwardDirectRoute, ActiveConn: 1}},
		"IPv4 real server of an IPv6 server": {destReply(unix.AF_INET, []byte{198, 19, 1, 5}, 8443, uint32(kernel.ForwardLocal), 65535, 0, 0), kernel.FamilyIPv6,
			kernel.Destination{Address: a("198.19.1.5"), Port: 8443, Weight: 65535, Forward: kernel.ForwardLocal}},
		"IPv6 tunnel": {destReply(unix.AF_INET6, a("fd00::7").AsSlice(), 53, uint32(kernel.ForwardTunnel), 2, 0, 1), kernel.FamilyIPv6,
			kernel.Destination{Address: a("fd00::7"), Port: 53, Weight: 2, Forward: kernel.ForwardTunnel, InactiveConn: 1}},
		"no family attribute (before Linux 3.18): the server's": {destReply(0, a("fd00::8").AsSlice(), 53, 0, 1, 0, 0), kernel.FamilyIPv6,
			kernel.Destination{Address: a("fd00::8"), Port: 53, Weight: 1}},
	} {
		got, err := parseDestMsg(tc.msg, tc.svc)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, tc.want)
		}
	}
}

// TestParseDestMsgRejects: a reply it cannot read fails the list.
func TestParseDestMsgRejects(t *testing.T) {
	good := destReply(unix.AF_INET, []byte{198, 19, 1, 2}, 8080, 0, 1, 0, 0)
	noDest := []byte{ipvsCmdNewDest, ipvsGenlVersion, 0, 0}
	noDest = nlaU32(noDest, ipvsCmdAttrService, 1)
	shortPort := []byte{ipvsCmdNewDest, ipvsGenlVersion, 0, 0}
	shortPort, nest := nlaNest(shortPort, ipvsCmdAttrDest)
	shortPort = nlaBytes(shortPort, ipvsDestAttrAddr, make([]byte, 16))
	shortPort = nlaU8(shortPort, ipvsDestAttrPort, 1)
	shortPort = nlaEnd(shortPort, nest)
	shortAddr := []byte{ipvsCmdNewDest, ipvsGenlVersion, 0, 0}
	shortAddr, nest = nlaNest(shortAddr, ipvsCmdAttrDest)
	shortAddr = nlaBytes(shortAddr, ipvsDestAttrAddr, []byte{1, 2, 3, 4})
	shortAddr = nlaU16(shortAddr, ipvsDestAttrAddrFamily, unix.AF_INET6)
	shortAddr = nlaEnd(shortAddr, nest)
	for name, msg := range map[string][]byte{
		"short":              good[:3],
		"no destination":     noDest,
		"unknown family":     destReply(99, []byte{198, 19, 1, 2}, 80, 0, 1, 0, 0),
		"truncated":          good[:len(good)-16],
		"short IPv6 address": shortAddr,
		"short port":         shortPort,
	} {
		if got, err := parseDestMsg(msg, kernel.FamilyIPv4); err == nil || !strings.HasPrefix(err.Error(), "ipvs: ") {
			t.Errorf("%s: got %+v, %v; want an ipvs: error", name, got, err)
		}
	}
}
