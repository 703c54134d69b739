package kernel

import (
	"fmt"
	"net/netip"
)

// ConntrackEntry is one connection-tracking entry as the proxier judges it.
type ConntrackEntry struct {
	Protocol    Protocol
	Orig, Reply ConntrackTuple // original and reply direction
}

// ConntrackTuple is one direction of an entry. For a client of a service
// DNATed to an endpoint, Orig.Dst is the service's address and Reply.Src
// the endpoint's.
type ConntrackTuple struct{ Src, Dst netip.AddrPort }

// Family is the family of the entry's original source address.
func (e ConntrackEntry) Family() Family { return FamilyOf(e.Orig.Src.Addr()) }

// Validate accepts what a kernel table can hold: a valid protocol, four
// valid unzoned addresses of one family (IPv4 unmapped). It checks entries
// seeded by tests; DeleteEntries never needs it.
func (e ConntrackEntry) Validate() error {
	if !e.Protocol.Valid() {
		return fmt.Errorf("conntrack entry: protocol %s: %w", e.Protocol, ErrInvalid)
	}
	f := e.Family()
	for _, ap := range []netip.AddrPort{e.Orig.Src, e.Orig.Dst, e.Reply.Src, e.Reply.Dst} {
		if err := CheckAddr(ap.Addr()); err != nil {
			return fmt.Errorf("conntrack entry: %w", err)
		}
		if ap.Addr().Is4In6() || FamilyOf(ap.Addr()) != f {
			return fmt.Errorf("conntrack entry: %s is not %s like %s: %w", ap.Addr(), f, e.Orig.Src.Addr(), ErrInvalid)
		}
	}
	return nil
}

// Conntrack deletes stale connection-tracking entries one by one, like
// kube-proxy's pkg/proxy/conntrack: never a flush, which would cut every
// connection of the node.
//
// Contract:
//   - DeleteEntries dumps family's table once and deletes each entry of
//     protocol proto for which stale returns true; it returns how many it
//     deleted. Entries that vanish meanwhile (expired, deleted by someone
//     else), also between the dump and their delete, are neither errors
//     nor counted.
//   - stale sees only entries of family and proto; other protocols' and
//     families' entries are never passed to it. It runs during the dump and
//     must not call back into the Conntrack.
//   - An invalid family or protocol, or a nil stale: ErrInvalid, and
//     nothing is touched.
//   - TCP, UDP and SCTP entries are judged alike, by addresses and ports
//     (kube-proxy cleans UDP only; the agent also cleans SCTP).
//   - Only entries of conntrack zone 0 are listed (IPVS's and the
//     proxies'); a delete by tuple cannot reach another zone's.
//   - Safe for concurrent use.
type Conntrack interface {
	DeleteEntries(family Family, proto Protocol, stale func(ConntrackEntry) bool) (int, error)
}

// CheckConntrackDelete validates DeleteEntries' arguments as every
// implementation must, before touching anything.
func CheckConntrackDelete(family Family, proto Protocol, stale func(ConntrackEntry) bool) error {
	switch {
	case !family.Valid():
		return fmt.Errorf("conntrack: family %s: %w", family, ErrInvalid)
	case !proto.Valid():
		return fmt.Errorf("conntrack: protocol %s: %w", proto, ErrInvalid)
	case stale == nil:
		return fmt.Errorf("conntrack: nil stale func: %w", ErrInvalid)
	}
	return nil
}
