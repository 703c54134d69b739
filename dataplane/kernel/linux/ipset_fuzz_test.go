package linux

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Fuzz targets of the ipset netlink encoding (no kernel needed; the test
// binary still enters its private network namespace, see TestMain).

var fuzzSets = []kernel.IPSet{
	{Name: "T-IP", Type: kernel.HashIP, Family: kernel.FamilyIPv4},
	{Name: "T-IPPORT", Type: kernel.HashIPPort, Family: kernel.FamilyIPv4},
	{Name: "T-IPPORTIP", Type: kernel.HashIPPortIP, Family: kernel.FamilyIPv6},
	{Name: "T-IPPORTNET", Type: kernel.HashIPPortNet, Family: kernel.FamilyIPv4},
	{Name: "T-NET", Type: kernel.HashNet, Family: kernel.FamilyIPv6},
	{Name: "T-PORT", Type: kernel.BitmapPort, PortFrom: 0, PortTo: 65535},
	{Name: "T-IPPORT6", Type: kernel.HashIPPort, Family: kernel.FamilyIPv6, Comments: true},
}

// FuzzIPSetEntryNetlink: every entry Validate accepts decodes from its own
// encoding as itself (normalized), and decoding arbitrary bytes as an
// entry or a list message never panics.
func FuzzIPSetEntryNetlink(f *testing.F) {
	f.Add(uint8(1), []byte{198, 18, 0, 10}, uint8(6), uint16(80), []byte(nil), []byte(nil), uint8(0), "", []byte(nil))
	f.Add(uint8(2), netip.MustParseAddr("2001:2::1").AsSlice(), uint8(132), uint16(30081), netip.MustParseAddr("2001:2::1").AsSlice(), []byte(nil), uint8(0), "", []byte(nil))
	f.Add(uint8(3), []byte{198, 18, 200, 1}, uint8(6), uint16(80), []byte(nil), []byte{198, 19, 50, 7}, uint8(24), "", []byte(nil))
	f.Add(uint8(4), []byte(nil), uint8(0), uint16(0), []byte(nil), netip.MustParseAddr("2001:2:0:100::").AsSlice(), uint8(56), "", []byte(nil))
	f.Add(uint8(5), []byte(nil), uint8(0), uint16(30080), []byte(nil), []byte(nil), uint8(0), "", []byte(nil))
	f.Add(uint8(6), netip.MustParseAddr("2001:2::c8").AsSlice(), uint8(17), uint16(53), []byte(nil), []byte(nil), uint8(0), "a comment", []byte(nil))
	// A list reply: nfgenmsg, set name, type, family, data header, one entry.
	f.Add(uint8(1), []byte(nil), uint8(0), uint16(0), []byte(nil), []byte(nil), uint8(0), "", listReply())
	f.Fuzz(func(t *testing.T, typ uint8, ip []byte, proto uint8, port uint16, ip2, netIP []byte, bits uint8, comment string, raw []byte) {
		spec := fuzzSets[int(typ)%len(fuzzSets)]
		// Arbitrary bytes: no panic, whatever they are.
		_, _ = decodeEntry(spec.Type, raw)
		_, _, _, _ = decodeListMessage(raw)

		e := kernel.Entry{Protocol: kernel.Protocol(proto), Port: port, Comment: comment}
		e.IP, _ = netip.AddrFromSlice(ip)
		e.IP2, _ = netip.AddrFromSlice(ip2)
		if a, ok := netip.AddrFromSlice(netIP); ok {
			e.Net = netip.PrefixFrom(a, int(bits))
		}
		if e.Validate(spec) != nil {
			return
		}
		want := e.Normalize()
		if want.Comment != "" && (containsNUL(want.Comment) || !spec.Comments) {
			return // the kernel's comment is a C string
		}
		wire := appendEntryData(nil, spec.Type, want)
		got, err := decodeEntry(spec.Type, wire[4:])
		if err != nil {
			t.Fatalf("decode own encoding of %+v: %v", want, err)
		}
		if got != want {
			t.Fatalf("round trip of %+v gave %+v", want, got)
		}
	})
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// listReply is a list reply message as the kernel sends it for a
// hash:ip,port set with one entry.
func listReply() []byte {
	msg := (&nl.Nfgenmsg{NfgenFamily: 2, Version: nl.NFNETLINK_V0}).Serialize()
	add := func(a *nl.RtAttr) { msg = append(msg, a.Serialize()...) }
	add(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated("KUBE-CLUSTER-IP")))
	add(nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated("hash:ip,port")))
	add(nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, nl.Uint8Attr(2)))
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|attrNested, nil)
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_MAXELEM|attrNetOrder, be32(65536)))
	add(data)
	adt, nest := nlaNest(nil, uint16(nl.IPSET_ATTR_ADT|attrNested))
	adt = appendEntryData(adt, kernel.HashIPPort, kernel.Entry{IP: netip.MustParseAddr("198.18.0.10"), Protocol: kernel.ProtocolTCP, Port: 80})
	return append(msg, nlaEnd(adt, nest)...)
}
