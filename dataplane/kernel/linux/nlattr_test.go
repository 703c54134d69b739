package linux

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// The IPVS requests appended in place are byte for byte what nl.RtAttr
// builds (the encoding they replaced, kept here as the reference).

func refServiceAttr(vs kernel.VirtualServer, full bool) *nl.RtAttr {
	vs = vs.Normalize()
	k := vs.Key
	a := nl.NewRtAttr(ipvsCmdAttrService, nil)
	a.AddRtAttr(ipvsSvcAttrAF, nl.Uint16Attr(afOf(k.Family)))
	if k.FWMark != 0 {
		a.AddRtAttr(ipvsSvcAttrFWMark, nl.Uint32Attr(k.FWMark))
	} else {
		a.AddRtAttr(ipvsSvcAttrProtocol, nl.Uint16Attr(uint16(k.Protocol)))
		a.AddRtAttr(ipvsSvcAttrAddr, k.Address.AsSlice())
		a.AddRtAttr(ipvsSvcAttrPort, be16(k.Port))
	}
	if full {
		a.AddRtAttr(ipvsSvcAttrSchedName, nl.ZeroTerminated(vs.Scheduler))
		flags := binary.NativeEndian.AppendUint32(nil, uint32(vs.Flags))
		flags = binary.NativeEndian.AppendUint32(flags, 0xffffffff)
		a.AddRtAttr(ipvsSvcAttrFlags, flags)
		a.AddRtAttr(ipvsSvcAttrTimeout, nl.Uint32Attr(vs.Timeout))
		a.AddRtAttr(ipvsSvcAttrNetmask, nl.Uint32Attr(netmaskToKernel(k.Family, vs.Netmask)))
	}
	return a
}

func refDestAttr(d kernel.Destination, full bool) *nl.RtAttr {
	a := nl.NewRtAttr(ipvsCmdAttrDest, nil)
	a.AddRtAttr(ipvsDestAttrAddr, d.Address.Unmap().AsSlice())
	a.AddRtAttr(ipvsDestAttrPort, be16(d.Port))
	if full {
		a.AddRtAttr(ipvsDestAttrFwdMethod, nl.Uint32Attr(uint32(d.Forward)))
		a.AddRtAttr(ipvsDestAttrWeight, nl.Uint32Attr(uint32(d.Weight)))
		a.AddRtAttr(ipvsDestAttrUThresh, nl.Uint32Attr(0))
		a.AddRtAttr(ipvsDestAttrLThresh, nl.Uint32Attr(0))
	}
	return a
}

func refMessage(op kernel.IPVSOp) []byte {
	cmd := map[kernel.IPVSOpKind]uint8{kernel.AddVirtualServer: ipvsCmdNewService, kernel.UpdateVirtualServer: ipvsCmdSetService,
		kernel.DeleteVirtualServer: ipvsCmdDelService, kernel.AddDestination: ipvsCmdNewDest,
		kernel.UpdateDestination: ipvsCmdSetDest, kernel.DeleteDestination: ipvsCmdDelDest}[op.Kind]
	var attrs []*nl.RtAttr
	switch op.Kind {
	case kernel.AddVirtualServer, kernel.UpdateVirtualServer:
		attrs = append(attrs, refServiceAttr(op.Server, true))
	case kernel.DeleteVirtualServer:
		attrs = append(attrs, refServiceAttr(kernel.VirtualServer{Key: op.Server.Key}, false))
	default:
		attrs = append(attrs, refServiceAttr(kernel.VirtualServer{Key: op.Server.Key}, false),
			refDestAttr(op.Destination, op.Kind != kernel.DeleteDestination))
	}
	payload := []byte{cmd, ipvsGenlVersion, 0, 0}
	for _, a := range attrs {
		payload = append(payload, a.Serialize()...)
	}
	return payload
}

func TestIPVSMessagesMatchRtAttrEncoding(t *testing.T) {
	servers := []kernel.VirtualServer{
		{Key: kernel.VirtualServerKey{Family: kernel.FamilyIPv4, Protocol: kernel.ProtocolTCP, Address: netip.MustParseAddr("198.18.0.1"), Port: 80}, Scheduler: "rr"},
		{Key: kernel.VirtualServerKey{Family: kernel.FamilyIPv6, Protocol: kernel.ProtocolUDP, Address: netip.MustParseAddr("2001:2::1"), Port: 53},
			Scheduler: "mh", Flags: kernel.FlagPersistent | kernel.FlagSched1, Timeout: 10800, Netmask: 64},
		{Key: kernel.VirtualServerKey{Family: kernel.FamilyIPv4, FWMark: 0x4000}, Scheduler: "wlc"},
		{Key: kernel.VirtualServerKey{Family: kernel.FamilyIPv4, Protocol: kernel.ProtocolSCTP, Address: netip.MustParseAddr("198.19.255.254"), Port: 65535}, Scheduler: "sh", Netmask: 24},
	}
	dests := []kernel.Destination{
		{Address: netip.MustParseAddr("198.19.0.7"), Port: 8080, Weight: 1},
		{Address: netip.MustParseAddr("::ffff:198.19.0.8"), Port: 1, Weight: 0, Forward: kernel.ForwardDirectRoute},
		{Address: netip.MustParseAddr("2001:2::99"), Port: 443, Weight: 100},
	}
	b := &ipvsBatcher{family: 42}
	n := 0
	for _, vs := range servers {
		for _, kind := range []kernel.IPVSOpKind{kernel.AddVirtualServer, kernel.UpdateVirtualServer, kernel.DeleteVirtualServer} {
			ops := []kernel.IPVSOp{{Kind: kind, Server: vs}}
			for _, d := range dests {
				for _, dk := range []kernel.IPVSOpKind{kernel.AddDestination, kernel.UpdateDestination, kernel.DeleteDestination} {
					ops = append(ops, kernel.IPVSOp{Kind: dk, Server: vs, Destination: d})
				}
			}
			for _, op := range ops {
				// Appended after what the (aligned) buffer holds.
				prefix := []byte{0xde, 0xad, 0xbe, 0xef}
				got, typ, flags := b.message(op, prefix)
				if typ != 42 || flags != 0 || !bytes.Equal(got[:4], []byte{0xde, 0xad, 0xbe, 0xef}) {
					t.Fatalf("%v: type %d, flags %#x, prefix %x", op, typ, flags, got[:4])
				}
				if want := refMessage(op); !bytes.Equal(got[4:], want) {
					t.Fatalf("%v:\n got %x\nwant %x", op, got[4:], want)
				}
				n++
			}
		}
	}
	if n != 4*3*10 {
		t.Fatalf("compared %d messages", n)
	}
}

// A whole batch message: header, payload, padding, as before.
func TestBatchMessageFraming(t *testing.T) {
	var b nlBatch
	at := b.message(7, func(buf []byte) ([]byte, uint16, uint16) { return append(buf, 1, 2, 3), 99, 0 })
	second := b.message(8, func(buf []byte) ([]byte, uint16, uint16) { return buf, 100, unix.NLM_F_CREATE })
	if at != 0 || second != 20 {
		t.Fatalf("offsets %d %d, want 0 20", at, second)
	}
	want := binary.NativeEndian.AppendUint32(nil, unix.NLMSG_HDRLEN+3)
	want = binary.NativeEndian.AppendUint16(want, 99)
	want = binary.NativeEndian.AppendUint16(want, unix.NLM_F_REQUEST)
	want = binary.NativeEndian.AppendUint32(want, 7)
	want = binary.NativeEndian.AppendUint32(want, 0)
	want = append(want, 1, 2, 3, 0)
	want = binary.NativeEndian.AppendUint32(want, unix.NLMSG_HDRLEN)
	want = binary.NativeEndian.AppendUint16(want, 100)
	want = binary.NativeEndian.AppendUint16(want, unix.NLM_F_REQUEST|unix.NLM_F_CREATE)
	want = binary.NativeEndian.AppendUint32(want, 8)
	want = binary.NativeEndian.AppendUint32(want, 0)
	if !bytes.Equal(b.buf, want) {
		t.Fatalf("batch\n got %x\nwant %x", b.buf, want)
	}
}

// The ipset entry and address requests, against the nl.NetlinkRequest
// encoding they replaced.

// refIPAttr encodes an address as the nested IPSET_ATTR_IP/IP2 container.
func refIPAttr(typ int, a netip.Addr) *nl.RtAttr {
	a = a.Unmap()
	inner := nl.IPSET_ATTR_IPADDR_IPV4
	if a.Is6() {
		inner = nl.IPSET_ATTR_IPADDR_IPV6
	}
	outer := nl.NewRtAttr(typ|attrNested, nil)
	outer.AddChild(nl.NewRtAttr(inner|attrNetOrder, a.AsSlice()))
	return outer
}

// refEntryData encodes e for a set of type t (already validated).
func refEntryData(t kernel.SetType, e kernel.Entry) *nl.RtAttr {
	d := nl.NewRtAttr(nl.IPSET_ATTR_DATA|attrNested, nil)
	if e.IP.IsValid() {
		d.AddChild(refIPAttr(nl.IPSET_ATTR_IP, e.IP))
	}
	switch t {
	case kernel.HashNet:
		d.AddChild(refIPAttr(nl.IPSET_ATTR_IP, e.Net.Addr()))
		d.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_CIDR, nl.Uint8Attr(uint8(e.Net.Bits()))))
	case kernel.HashIPPortNet:
		d.AddChild(refIPAttr(nl.IPSET_ATTR_IP2, e.Net.Addr()))
		d.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_CIDR2, nl.Uint8Attr(uint8(e.Net.Bits()))))
	case kernel.HashIPPortIP:
		d.AddChild(refIPAttr(nl.IPSET_ATTR_IP2, e.IP2))
	}
	if t == kernel.BitmapPort {
		// Only the port: bitmap:port's policy has no protocol attribute,
		// which is what breaks netlink v1.3.1's IpsetAdd (vishvananda/netlink#1054).
		d.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|attrNetOrder, be16(e.Port)))
	} else if e.Protocol != 0 {
		d.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|attrNetOrder, be16(e.Port)))
		d.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PROTO, nl.Uint8Attr(uint8(e.Protocol))))
	}
	if e.Comment != "" {
		d.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_COMMENT, nl.ZeroTerminated(e.Comment)))
	}
	return d
}

// refAddrRequest is the rtnetlink request binding (RTM_NEWADDR, NLM_F_EXCL:
// a bound address answers EEXIST) or unbinding (RTM_DELADDR) addr as a
// host prefix on the device with index idx, as netlink's AddrAdd/AddrDel
// build it for a host prefix (no broadcast, no label, no lifetimes).
func refAddrRequest(kind kernel.AddressOpKind, idx int, addr netip.Addr) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.RTM_DELADDR, 0)
	if kind == kernel.BindAddress {
		req = nl.NewNetlinkRequest(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	}
	family := unix.AF_INET
	if addr.Is6() {
		family = unix.AF_INET6
	}
	msg := nl.NewIfAddrmsg(family)
	msg.Index = uint32(idx)
	msg.Prefixlen = uint8(addr.BitLen())
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, addr.AsSlice()))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, addr.AsSlice()))
	return req
}

func refPayload(req *nl.NetlinkRequest) []byte {
	var out []byte
	for _, d := range req.Data {
		out = append(out, d.Serialize()...)
	}
	return out
}

func TestIPSetRequestsMatchRtAttrEncoding(t *testing.T) {
	ip4, ip6 := netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("2001:2::10")
	cases := []struct {
		set kernel.IPSet
		e   kernel.Entry
	}{
		{kernel.IPSet{Name: "KUBE-CLUSTER-IP", Type: kernel.HashIPPort}, kernel.Entry{IP: ip4, Protocol: kernel.ProtocolTCP, Port: 80, Comment: "ns/svc:http"}},
		{kernel.IPSet{Name: "KUBE-6-CLUSTER-IP", Type: kernel.HashIPPort}, kernel.Entry{IP: ip6, Protocol: kernel.ProtocolUDP, Port: 53}},
		{kernel.IPSet{Name: "KUBE-LOOP-BACK", Type: kernel.HashIPPortIP}, kernel.Entry{IP: ip4, Protocol: kernel.ProtocolTCP, Port: 8080, IP2: ip4}},
		{kernel.IPSet{Name: "KUBE-LOAD-BALANCER-SOURCE-CIDR", Type: kernel.HashIPPortNet}, kernel.Entry{IP: ip4, Protocol: kernel.ProtocolSCTP, Port: 443, Net: netip.MustParsePrefix("198.19.0.0/16")}},
		{kernel.IPSet{Name: "KUBE-NODE-PORT-TCP", Type: kernel.BitmapPort}, kernel.Entry{Port: 30080, Protocol: kernel.ProtocolTCP}},
		{kernel.IPSet{Name: "KUBE-IPVS-IPS", Type: kernel.HashIP}, kernel.Entry{IP: ip6}},
		{kernel.IPSet{Name: "KUBE-CLUSTER-CIDR", Type: kernel.HashNet}, kernel.Entry{Net: netip.MustParsePrefix("198.19.0.0/17")}},
	}
	for _, c := range cases {
		for _, cmd := range []int{nl.IPSET_CMD_ADD, nl.IPSET_CMD_DEL} {
			ref := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), 0)
			ref.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
			ref.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(ipsetProtocol)))
			ref.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(c.set.Name)))
			ref.AddData(refEntryData(c.set.Type, c.e))
			if got, want := appendADT(nil, cmd, c.set, c.e), refPayload(ref); !bytes.Equal(got, want) {
				t.Fatalf("%s %+v:\n got %x\nwant %x", c.set.Name, c.e, got, want)
			}
			req := adtRequest(cmd, unix.NLM_F_ACK, c.set, c.e)
			if got, want := req.Serialize(), ref.Serialize(); bytes.Equal(got, want) {
				t.Fatalf("adtRequest ignored its flags")
			}
			ref.Flags |= unix.NLM_F_ACK
			ref.Seq = req.Seq
			if got, want := req.Serialize(), ref.Serialize(); !bytes.Equal(got, want) {
				t.Fatalf("adtRequest %s %+v:\n got %x\nwant %x", c.set.Name, c.e, got, want)
			}
		}
	}
}

func TestAddressRequestsMatchRtAttrEncoding(t *testing.T) {
	for _, a := range []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("2001:2::10")} {
		for _, kind := range []kernel.AddressOpKind{kernel.BindAddress, kernel.UnbindAddress} {
			ref := refAddrRequest(kind, 7, a)
			got, typ, flags := appendAddrRequest(nil, kind, 7, a)
			if !bytes.Equal(got, refPayload(ref)) || typ != ref.Type || unix.NLM_F_REQUEST|flags != ref.Flags {
				t.Fatalf("%v %v: %x type %d flags %#x, want %x type %d flags %#x", kind, a, got, typ, flags,
					refPayload(ref), ref.Type, ref.Flags)
			}
		}
	}
}

// adtRequest is the request adding (IPSET_CMD_ADD) or deleting e (valid,
// normalized) in set. No NLM_F_EXCL: add of a present / del of an absent
// entry is fine (ipset's -exist, what kube-proxy uses).
func adtRequest(cmd int, flags int, set kernel.IPSet, e kernel.Entry) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), flags)
	req.AddRawData(appendADT(nil, cmd, set, e))
	return req
}
