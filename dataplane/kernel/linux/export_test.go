package linux

import (
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

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
