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
			serviceReply(unix.AF_INET, unix.IPPROTO_TCP, []byte{10, 96, 0, 1}, 80, 0, "rr", 0, 0, v4mask(32)),
			kernel.VirtualServer{Key: kernel.AddrKey(a("10.96.0.1"), kernel.ProtocolTCP, 80), Scheduler: "rr"},
		},
		"IPv4 UDP persistent /24": {
			serviceReply(unix.AF_INET, unix.IPPROTO_UDP, []byte{10, 96, 0, 2}, 53, 0, "wrr", uint32(kernel.FlagPersistent), 10800, v4mask(24)),
			kernel.VirtualServer{Key: kernel.AddrKey(a("10.96.0.2"), kernel.ProtocolUDP, 53), Scheduler: "wrr",
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
	good := serviceReply(unix.AF_INET, unix.IPPROTO_TCP, []byte{10, 96, 0, 1}, 80, 0, "rr", 0, 0, 0xffffffff)
	noService := []byte{ipvsCmdNewService, ipvsGenlVersion, 0, 0}
	noService = nlaU32(noService, 2, 1) // IPVS_CMD_ATTR_DEST only
	badLen := append([]byte(nil), good...)
	binary.NativeEndian.PutUint16(badLen[4:], uint16(len(good))) // nest longer than the message
	badAF := serviceReply(99, unix.IPPROTO_TCP, []byte{10, 96, 0, 1}, 80, 0, "rr", 0, 0, 0)
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
