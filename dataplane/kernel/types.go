package kernel

import (
	"fmt"
	"net/netip"
	"strings"
)

// Family is an address family. The zero value means "derive it from the
// address" wherever an address is present.
type Family uint8

const (
	FamilyUnspecified Family = 0
	FamilyIPv4        Family = 4
	FamilyIPv6        Family = 6
)

// String returns the ipset spelling: "inet" or "inet6".
func (f Family) String() string {
	switch f {
	case FamilyIPv4:
		return "inet"
	case FamilyIPv6:
		return "inet6"
	case FamilyUnspecified:
		return "unspec"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// Valid reports whether f is IPv4 or IPv6.
func (f Family) Valid() bool { return f == FamilyIPv4 || f == FamilyIPv6 }

// FamilyOf returns the family of a valid address (IPv4-mapped IPv6 counts as
// IPv6: callers must Unmap first if they mean IPv4).
func FamilyOf(a netip.Addr) Family {
	switch {
	case !a.IsValid():
		return FamilyUnspecified
	case a.Is4():
		return FamilyIPv4
	default:
		return FamilyIPv6
	}
}

// CheckAddr rejects what no kernel interface accepts as an address: the
// zero Addr and IPv6 addresses with a zone ("fe80::1%eth0"). Netlink
// carries only the 16 address bytes, so a zoned address would never equal
// its read-back, and its text form (with the zone verbatim) must never
// reach iptables-restore input or a log line.
func CheckAddr(a netip.Addr) error {
	switch {
	case !a.IsValid():
		return fmt.Errorf("invalid address: %w", ErrInvalid)
	case a.Zone() != "":
		return fmt.Errorf("address %q has an IPv6 zone: %w", a.String(), ErrInvalid)
	}
	return nil
}

// Protocol is an IP protocol number; only the ones kube-proxy uses are named.
type Protocol uint8

const (
	ProtocolUnspecified Protocol = 0
	ProtocolTCP         Protocol = 6
	ProtocolUDP         Protocol = 17
	ProtocolSCTP        Protocol = 132
)

// String returns the lower-case name ("tcp", "udp", "sctp").
func (p Protocol) String() string {
	switch p {
	case ProtocolTCP:
		return "tcp"
	case ProtocolUDP:
		return "udp"
	case ProtocolSCTP:
		return "sctp"
	case ProtocolUnspecified:
		return "unspec"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// Valid reports whether p is TCP, UDP or SCTP.
func (p Protocol) Valid() bool {
	return p == ProtocolTCP || p == ProtocolUDP || p == ProtocolSCTP
}

// ParseProtocol accepts "tcp", "udp", "sctp" in any case.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return ProtocolTCP, nil
	case "udp":
		return ProtocolUDP, nil
	case "sctp":
		return ProtocolSCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: %w", s, ErrInvalid)
}
