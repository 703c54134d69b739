package linux

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Wire constants of the ipset netlink protocol not exported by nl
// (include/uapi/linux/netfilter/ipset/ip_set.h).
const (
	ipsetProtocol        = 6 // what the kernel accepts from every client since 3.x
	ipsetFlagListHeader  = 1 << 2
	ipsetAttrBucketSize  = 21 // create-level, kernel >= 5.10
	ipsetErrTypeSpecific = nl.IPSET_ERR_TYPE_SPECIFIC

	nfprotoUnspec = 0
	nfprotoIPv4   = 2
	nfprotoIPv6   = 10

	attrNetOrder = int(nl.NLA_F_NET_BYTEORDER)
	attrNested   = int(nl.NLA_F_NESTED)
)

// attr is one parsed netlink attribute with the flag bits removed from Type.
type attr struct {
	Type  uint16
	Value []byte
}

// parseAttrs walks a buffer of netlink attributes. Unlike nl.ParseAttributes
// it needs no goroutine, which matters when listing sets with 100k entries.
func parseAttrs(b []byte) ([]attr, error) {
	var out []attr
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		t := binary.NativeEndian.Uint16(b[2:4])
		if l < 4 || l > len(b) {
			return nil, fmt.Errorf("ipset netlink: attribute %d has bad length %d (%d left)", t&nl.NLA_TYPE_MASK, l, len(b))
		}
		out = append(out, attr{Type: t & nl.NLA_TYPE_MASK, Value: b[4:l]})
		adv := (l + 3) &^ 3
		if adv > len(b) {
			adv = len(b)
		}
		b = b[adv:]
	}
	return out, nil
}

func attrU32(v []byte) uint32 {
	if len(v) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(v)
}

func attrU16(v []byte) uint16 {
	if len(v) < 2 {
		return 0
	}
	return binary.BigEndian.Uint16(v)
}

func attrU8(v []byte) uint8 {
	if len(v) < 1 {
		return 0
	}
	return v[0]
}

func attrString(v []byte) string {
	for i, c := range v {
		if c == 0 {
			return string(v[:i])
		}
	}
	return string(v)
}

func nfproto(f kernel.Family) uint8 {
	switch f {
	case kernel.FamilyIPv4:
		return nfprotoIPv4
	case kernel.FamilyIPv6:
		return nfprotoIPv6
	}
	return nfprotoUnspec
}

func familyOfNFProto(p uint8) kernel.Family {
	switch p {
	case nfprotoIPv4:
		return kernel.FamilyIPv4
	case nfprotoIPv6:
		return kernel.FamilyIPv6
	}
	return kernel.FamilyUnspecified
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func decodeIPAttr(v []byte) (netip.Addr, error) {
	attrs, err := parseAttrs(v)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range attrs {
		if a.Type == nl.IPSET_ATTR_IPADDR_IPV4 || a.Type == nl.IPSET_ATTR_IPADDR_IPV6 {
			if ip, ok := netip.AddrFromSlice(a.Value); ok {
				return ip.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("ipset netlink: address attribute without a valid address")
}

// appendADT appends the payload (nfgenmsg and attributes) of the request
// adding or deleting e in set to buf; ApplyEntries sends it.
func appendADT(buf []byte, cmd int, set kernel.IPSet, e kernel.Entry) []byte {
	buf = append(buf, unix.AF_INET, nl.NFNETLINK_V0, 0, 0) // nfgenmsg: family, version, res_id
	buf = nlaU8(buf, nl.IPSET_ATTR_PROTOCOL, ipsetProtocol)
	buf = nlaString(buf, nl.IPSET_ATTR_SETNAME, set.Name)
	return appendEntryData(buf, set.Type, e)
}

// appendIPAttr appends an address as the nested IPSET_ATTR_IP/IP2
// container.
func appendIPAttr(b []byte, typ int, a netip.Addr) []byte {
	a = a.Unmap()
	inner := nl.IPSET_ATTR_IPADDR_IPV4
	if a.Is6() {
		inner = nl.IPSET_ATTR_IPADDR_IPV6
	}
	b, nest := nlaNest(b, uint16(typ|attrNested))
	b = nlaAddr(b, uint16(inner|attrNetOrder), a)
	return nlaEnd(b, nest)
}

// appendEntryData appends the IPSET_ATTR_DATA container of e for a set of
// type t (already validated). bitmap:port gets only the port: its policy
// has no protocol attribute, which is what breaks netlink v1.3.1's
// IpsetAdd (vishvananda/netlink#1054).
func appendEntryData(b []byte, t kernel.SetType, e kernel.Entry) []byte {
	b, nest := nlaNest(b, uint16(nl.IPSET_ATTR_DATA|attrNested))
	if e.IP.IsValid() {
		b = appendIPAttr(b, nl.IPSET_ATTR_IP, e.IP)
	}
	switch t {
	case kernel.HashNet:
		b = appendIPAttr(b, nl.IPSET_ATTR_IP, e.Net.Addr())
		b = nlaU8(b, nl.IPSET_ATTR_CIDR, uint8(e.Net.Bits()))
	case kernel.HashIPPortNet:
		b = appendIPAttr(b, nl.IPSET_ATTR_IP2, e.Net.Addr())
		b = nlaU8(b, nl.IPSET_ATTR_CIDR2, uint8(e.Net.Bits()))
	case kernel.HashIPPortIP:
		b = appendIPAttr(b, nl.IPSET_ATTR_IP2, e.IP2)
	}
	if t == kernel.BitmapPort {
		b = nlaBE16(b, uint16(nl.IPSET_ATTR_PORT|attrNetOrder), e.Port)
	} else if e.Protocol != 0 {
		b = nlaBE16(b, uint16(nl.IPSET_ATTR_PORT|attrNetOrder), e.Port)
		b = nlaU8(b, nl.IPSET_ATTR_PROTO, uint8(e.Protocol))
	}
	if e.Comment != "" {
		b = nlaString(b, nl.IPSET_ATTR_COMMENT, e.Comment)
	}
	return nlaEnd(b, nest)
}

// decodeEntry turns one ADT data container back into an Entry.
func decodeEntry(t kernel.SetType, v []byte) (kernel.Entry, error) {
	attrs, err := parseAttrs(v)
	if err != nil {
		return kernel.Entry{}, err
	}
	var e kernel.Entry
	var ip, ip2 netip.Addr
	cidr, cidr2 := -1, -1
	for _, a := range attrs {
		switch a.Type {
		case nl.IPSET_ATTR_IP:
			if ip, err = decodeIPAttr(a.Value); err != nil {
				return e, err
			}
		case nl.IPSET_ATTR_IP2:
			if ip2, err = decodeIPAttr(a.Value); err != nil {
				return e, err
			}
		case nl.IPSET_ATTR_CIDR:
			cidr = int(attrU8(a.Value))
		case nl.IPSET_ATTR_CIDR2:
			cidr2 = int(attrU8(a.Value))
		case nl.IPSET_ATTR_PORT:
			e.Port = attrU16(a.Value)
		case nl.IPSET_ATTR_PROTO:
			e.Protocol = kernel.Protocol(attrU8(a.Value))
		case nl.IPSET_ATTR_COMMENT:
			e.Comment = attrString(a.Value)
		}
	}
	full := func(a netip.Addr, bits int) netip.Prefix {
		if bits < 0 {
			bits = a.BitLen()
		}
		return netip.PrefixFrom(a, bits).Masked()
	}
	switch t {
	case kernel.HashNet:
		e.Net = full(ip, cidr)
	case kernel.HashIPPortNet:
		e.IP, e.Net = ip, full(ip2, cidr2)
	case kernel.HashIPPortIP:
		e.IP, e.IP2 = ip, ip2
	case kernel.BitmapPort:
		e.Protocol = 0
	default:
		e.IP = ip
	}
	return e, nil
}

// setHeader is the part of a list message that describes the set.
type setHeader struct {
	set      kernel.IPSet
	revision uint8
	refs     uint32
	// elements is the set's entry count; -1 when the header has none.
	elements int
}

// decodeListMessage parses one IPSET_CMD_LIST reply message: the header
// (first message of a set only) and any entries.
func decodeListMessage(msg []byte) (name string, hdr *setHeader, entries [][]byte, err error) {
	if len(msg) < nl.SizeofNfgenmsg {
		return "", nil, nil, fmt.Errorf("ipset netlink: short message")
	}
	attrs, err := parseAttrs(msg[nl.SizeofNfgenmsg:])
	if err != nil {
		return "", nil, nil, err
	}
	h := &setHeader{elements: -1}
	var hasHeader bool
	for _, a := range attrs {
		switch a.Type {
		case nl.IPSET_ATTR_SETNAME:
			name = attrString(a.Value)
			h.set.Name = name
		case nl.IPSET_ATTR_TYPENAME:
			h.set.Type = kernel.SetType(attrString(a.Value))
			hasHeader = true
		case nl.IPSET_ATTR_REVISION:
			h.revision = attrU8(a.Value)
		case nl.IPSET_ATTR_FAMILY:
			h.set.Family = familyOfNFProto(attrU8(a.Value))
		case nl.IPSET_ATTR_DATA:
			data, err := parseAttrs(a.Value)
			if err != nil {
				return "", nil, nil, err
			}
			for _, d := range data {
				switch d.Type {
				case nl.IPSET_ATTR_HASHSIZE:
					h.set.HashSize = attrU32(d.Value)
				case nl.IPSET_ATTR_MAXELEM:
					h.set.MaxElem = attrU32(d.Value)
				case nl.IPSET_ATTR_PORT_FROM:
					h.set.PortFrom = attrU16(d.Value)
				case nl.IPSET_ATTR_PORT_TO:
					h.set.PortTo = attrU16(d.Value)
				case nl.IPSET_ATTR_CADT_FLAGS:
					h.set.Comments = attrU32(d.Value)&nl.IPSET_FLAG_WITH_COMMENT != 0
				case nl.IPSET_ATTR_REFERENCES:
					h.refs = attrU32(d.Value)
				case nl.IPSET_ATTR_ELEMENTS:
					h.elements = int(attrU32(d.Value))
				}
			}
		case nl.IPSET_ATTR_ADT:
			adt, err := parseAttrs(a.Value)
			if err != nil {
				return "", nil, nil, err
			}
			for _, d := range adt {
				if d.Type == nl.IPSET_ATTR_DATA {
					entries = append(entries, d.Value)
				}
			}
		}
	}
	if !hasHeader {
		h = nil
	} else if h.set.Type == kernel.BitmapPort {
		h.set.Family = kernel.FamilyUnspecified
	}
	return name, h, entries, nil
}

// newIpsetRequest starts an ipset message of command cmd.
func newIpsetRequest(cmd int, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(ipsetProtocol)))
	return req
}
