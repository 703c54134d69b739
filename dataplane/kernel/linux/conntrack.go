package linux

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Conntrack deletes conntrack entries through ctnetlink the way kube-proxy
// does: one dump, then one delete request per stale entry. It speaks
// ctnetlink itself (messages built with vishvananda/netlink/nl) because
// netlink v1.3.1's conntrack helpers parse ports for TCP and UDP only: an
// SCTP entry reads as port 0 and its delete request names a tuple the
// kernel does not have.
type Conntrack struct {
	// mu serializes calls: the socket carries one exchange at a time, and
	// a dump must end before the deletes it decided are sent.
	mu   sync.Mutex
	sock *nl.SocketHandle
}

var _ kernel.Conntrack = (*Conntrack)(nil)

// NewConntrack opens a netfilter netlink socket in the caller's network
// namespace. It does not probe ctnetlink (a dump costs as much as the
// table is large); without nf_conntrack_netlink DeleteEntries fails with
// ErrUnsupported.
func NewConntrack() (*Conntrack, error) {
	s, err := openNetfilterSocket()
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netfilter netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
	if err := s.SetReceiveTimeout(&tv); err != nil {
		s.Close()
		return nil, fmt.Errorf("conntrack: socket timeout: %w", err)
	}
	return &Conntrack{sock: &nl.SocketHandle{Socket: s}}, nil
}

// Close releases the netlink socket.
func (c *Conntrack) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sock.Close()
}

func (c *Conntrack) DeleteEntries(family kernel.Family, proto kernel.Protocol, stale func(kernel.ConntrackEntry) bool) (int, error) {
	if err := kernel.CheckConntrackDelete(family, proto, stale); err != nil {
		return 0, err
	}
	what := fmt.Sprintf("conntrack %s %s", family, proto)
	c.mu.Lock()
	defer c.mu.Unlock()
	var doomed []kernel.ConntrackEntry
	dumpErr := c.dump(family, func(e kernel.ConntrackEntry) {
		if e.Protocol == proto && stale(e) {
			doomed = append(doomed, e)
		}
	})
	if dumpErr != nil && !errors.Is(dumpErr, nl.ErrDumpInterrupted) {
		return 0, conntrackError(what+": dump", dumpErr)
	}
	n := 0
	for _, e := range doomed {
		err := c.exec(ctDeleteRequest(family, e))
		switch {
		case err == nil:
			n++
		case errors.Is(err, unix.ENOENT):
			// Expired or deleted by someone else since the dump.
		default:
			return n, conntrackError(fmt.Sprintf("%s: delete %v -> %v (reply from %v)", what, e.Orig.Src, e.Orig.Dst, e.Reply.Src), err)
		}
	}
	if dumpErr != nil {
		// The table changed during the dump: the entries read were judged
		// and deleted, others may have been missed; the caller runs again.
		return n, fmt.Errorf("%s: %d deleted, but the dump was interrupted (table changed meanwhile): %w", what, n, dumpErr)
	}
	return n, nil
}

// Entries lists family's zone-0 entries of proto with the parser
// DeleteEntries judges them by: for diagnostics (the test bed's e2ehelper
// conntrack) and tests; the proxier only ever deletes.
func (c *Conntrack) Entries(family kernel.Family, proto kernel.Protocol) ([]kernel.ConntrackEntry, error) {
	if !family.Valid() || !proto.Valid() {
		return nil, fmt.Errorf("conntrack: family %s, protocol %s: %w", family, proto, kernel.ErrInvalid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []kernel.ConntrackEntry
	err := c.dump(family, func(e kernel.ConntrackEntry) {
		if e.Protocol == proto {
			out = append(out, e)
		}
	})
	if err != nil {
		return nil, conntrackError(fmt.Sprintf("conntrack %s %s: dump", family, proto), err)
	}
	return out, nil
}

// dump calls each with every zone-0 entry of family the kernel lists
// (IPVS's and kube-proxy's entries live there; a delete without a zone
// could not reach the others). The caller holds mu.
func (c *Conntrack) dump(family kernel.Family, each func(kernel.ConntrackEntry)) error {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	req.AddRawData([]byte{nfproto(family), nl.NFNETLINK_V0, 0, 0}) // nfgenmsg
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: c.sock}
	var parseErr error
	err := req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		e, ok, err := decodeCTEntry(family, msg)
		switch {
		case err != nil:
			parseErr = err
			return false
		case ok:
			each(e)
		}
		return true
	})
	if parseErr != nil {
		return parseErr
	}
	return err
}

// exec sends req on the shared socket and waits for the kernel's answer.
func (c *Conntrack) exec(req *nl.NetlinkRequest) error {
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: c.sock}
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

// conntrackError wraps err with the sentinel its errno stands for
// (EOPNOTSUPP: no nf_conntrack_netlink).
func conntrackError(what string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if s := kernel.ErrnoSentinel(errno); s != nil {
			return fmt.Errorf("%s: %w (%w)", what, s, errno)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// ctDeleteRequest asks the kernel to delete the zone-0 entry whose
// original tuple is e's.
func ctDeleteRequest(family kernel.Family, e kernel.ConntrackEntry) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	b := []byte{nfproto(family), nl.NFNETLINK_V0, 0, 0} // nfgenmsg
	b = appendCTTuple(b, nl.CTA_TUPLE_ORIG, e.Protocol, e.Orig)
	req.AddRawData(b)
	return req
}

// appendCTTuple appends a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY nest: the
// addresses and the protocol with its ports (the same attributes for TCP,
// UDP and SCTP).
func appendCTTuple(b []byte, typ uint16, proto kernel.Protocol, t kernel.ConntrackTuple) []byte {
	b, tuple := nlaNest(b, typ|nl.NLA_F_NESTED)
	b, ip := nlaNest(b, nl.CTA_TUPLE_IP|nl.NLA_F_NESTED)
	src, dst := uint16(nl.CTA_IP_V4_SRC), uint16(nl.CTA_IP_V4_DST)
	if t.Src.Addr().Is6() {
		src, dst = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	b = nlaAddr(b, src, t.Src.Addr())
	b = nlaAddr(b, dst, t.Dst.Addr())
	b = nlaEnd(b, ip)
	b, pr := nlaNest(b, nl.CTA_TUPLE_PROTO|nl.NLA_F_NESTED)
	b = nlaU8(b, nl.CTA_PROTO_NUM, uint8(proto))
	b = nlaBE16(b, nl.CTA_PROTO_SRC_PORT, t.Src.Port())
	b = nlaBE16(b, nl.CTA_PROTO_DST_PORT, t.Dst.Port())
	b = nlaEnd(b, pr)
	return nlaEnd(b, tuple)
}

// decodeCTEntry reads one dumped ctnetlink message (nfgenmsg, then
// attributes). ok is false for an entry stale must not see: another
// family's, a non-zero zone's, a protocol without ports (ICMP, GRE), or
// one missing a tuple. err is for a message that is not ctnetlink at all.
func decodeCTEntry(family kernel.Family, msg []byte) (e kernel.ConntrackEntry, ok bool, err error) {
	if len(msg) < 4 {
		return e, false, fmt.Errorf("ctnetlink: message of %d bytes has no nfgenmsg", len(msg))
	}
	if familyOfNFProto(msg[0]) != family {
		return e, false, nil
	}
	attrs, err := parseAttrs(msg[4:])
	if err != nil {
		return e, false, fmt.Errorf("ctnetlink: %w", err)
	}
	var orig, reply bool
	for _, a := range attrs {
		switch a.Type {
		case nl.CTA_TUPLE_ORIG:
			var p kernel.Protocol
			if p, e.Orig, orig = decodeCTTuple(family, a.Value); orig {
				e.Protocol = p
			}
		case nl.CTA_TUPLE_REPLY:
			_, e.Reply, reply = decodeCTTuple(family, a.Value)
		case nl.CTA_ZONE:
			if attrU16(a.Value) != 0 {
				return e, false, nil
			}
		}
	}
	return e, orig && reply && e.Protocol.Valid(), nil
}

// decodeCTTuple reads a tuple nest; ok is false when an address, the
// protocol or a port is missing or of another family.
func decodeCTTuple(family kernel.Family, v []byte) (proto kernel.Protocol, t kernel.ConntrackTuple, ok bool) {
	attrs, err := parseAttrs(v)
	if err != nil {
		return 0, t, false
	}
	var src, dst netip.Addr
	var sport, dport []byte
	for _, a := range attrs {
		switch a.Type {
		case nl.CTA_TUPLE_IP:
			ips, err := parseAttrs(a.Value)
			if err != nil {
				return 0, t, false
			}
			for _, ia := range ips {
				switch ia.Type {
				case nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC:
					src, _ = netip.AddrFromSlice(ia.Value)
				case nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST:
					dst, _ = netip.AddrFromSlice(ia.Value)
				}
			}
		case nl.CTA_TUPLE_PROTO:
			ps, err := parseAttrs(a.Value)
			if err != nil {
				return 0, t, false
			}
			for _, pa := range ps {
				switch pa.Type {
				case nl.CTA_PROTO_NUM:
					proto = kernel.Protocol(attrU8(pa.Value))
				case nl.CTA_PROTO_SRC_PORT:
					sport = pa.Value
				case nl.CTA_PROTO_DST_PORT:
					dport = pa.Value
				}
			}
		}
	}
	if kernel.FamilyOf(src) != family || kernel.FamilyOf(dst) != family || len(sport) < 2 || len(dport) < 2 {
		return 0, t, false
	}
	t.Src, t.Dst = netip.AddrPortFrom(src, attrU16(sport)), netip.AddrPortFrom(dst, attrU16(dport))
	return proto, t, true
}
