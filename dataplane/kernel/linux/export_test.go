package linux

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Test hooks of the batched write paths and test-only conntrack access.

// BatchSends is how many sendmsg calls ApplyEntries has made.
func (h *IPSets) BatchSends() int { return h.batch.sends }

// BatchSends is how many sendmsg calls ApplyAddresses has made.
func (l *Links) BatchSends() int { return l.batch.sends }

// BreakBatch makes every later batch exchange of h fail (a bad socket).
func (h *IPSets) BreakBatch() { h.batch.close(); h.batch.fd = -1 }

// BreakBatch makes every later batch exchange of l fail (a bad socket).
func (l *Links) BreakBatch() { l.batch.close(); l.batch.fd = -1 }

// Test-only conntrack access: the contract suite seeds entries as traffic
// would create them (contract.ConntrackSeeder) and reads them back.

// CreateConntrackEntry creates e in the kernel's table; it expires after
// timeout (whole seconds, at least one: UDP entries need one).
func (c *Conntrack) CreateConntrackEntry(e kernel.ConntrackEntry, timeout time.Duration) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if timeout < time.Second {
		return fmt.Errorf("conntrack entry timeout %v: want at least 1s: %w", timeout, kernel.ErrInvalid)
	}
	fam := nfproto(e.Family())
	tuple := func(t kernel.ConntrackTuple) netlink.IPTuple {
		return netlink.IPTuple{Protocol: uint8(e.Protocol),
			SrcIP: t.Src.Addr().AsSlice(), SrcPort: t.Src.Port(),
			DstIP: t.Dst.Addr().AsSlice(), DstPort: t.Dst.Port()}
	}
	flow := &netlink.ConntrackFlow{FamilyType: fam, Forward: tuple(e.Orig), Reverse: tuple(e.Reply), TimeOut: uint32(timeout / time.Second)}
	if e.Protocol == kernel.ProtocolTCP {
		// Without a state the kernel keeps a TCP entry in NONE.
		flow.ProtoInfo = &netlink.ProtoInfoTCP{State: nl.TCP_CONNTRACK_ESTABLISHED}
	}
	// netlink's own create request carries SCTP ports too (only its
	// parser lacks them); it runs on its own socket in this namespace.
	if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(fam), flow); err != nil {
		return conntrackError(fmt.Sprintf("create conntrack entry %+v", e), err)
	}
	return nil
}

// Add and List make *Conntrack a contract.ConntrackSeeder (entries live
// for ten minutes; the suite deletes its own).
func (c *Conntrack) Add(e kernel.ConntrackEntry) error {
	return c.CreateConntrackEntry(e, 10*time.Minute)
}

func (c *Conntrack) List(family kernel.Family, proto kernel.Protocol) ([]kernel.ConntrackEntry, error) {
	return c.Entries(family, proto)
}

// DumpLinkNames lists the namespace's links with an RTM_GETLINK dump on a
// batch socket (nldump.go); stopAfter > 0 fails the callback after that
// many links, then dumps again on the same socket.
func DumpLinkNames(stopAfter int) ([]string, error) {
	b, err := newNLBatch(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer b.close()
	req := func(buf []byte) ([]byte, uint16, uint16) {
		return append(buf, make([]byte, unix.SizeofIfInfomsg)...), unix.RTM_GETLINK, unix.NLM_F_DUMP
	}
	var names []string
	errStop := errors.New("stop")
	each := func(msg []byte) error {
		if stopAfter > 0 && len(names) == stopAfter {
			return errStop
		}
		if len(msg) < unix.SizeofIfInfomsg {
			return fmt.Errorf("short link message")
		}
		return walkAttrs(msg[unix.SizeofIfInfomsg:], func(typ uint16, v []byte) error {
			if typ == unix.IFLA_IFNAME {
				names = append(names, string(bytes.TrimRight(v, "\x00")))
			}
			return nil
		})
	}
	err = b.dump(req, each)
	if stopAfter > 0 {
		if !errors.Is(err, errStop) {
			return nil, fmt.Errorf("stopped dump returned %v, want the callback's error", err)
		}
		names, stopAfter = nil, 0
		err = b.dump(req, each)
	}
	return names, err
}
