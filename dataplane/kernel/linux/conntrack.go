package linux

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Conntrack deletes conntrack entries through ctnetlink with
// vishvananda/netlink, the way kube-proxy does: one dump, then one delete
// request per stale entry.
type Conntrack struct {
	// mu serializes calls: the handle's socket carries one exchange at a time.
	mu sync.Mutex
	h  *netlink.Handle
}

var _ kernel.Conntrack = (*Conntrack)(nil)

// NewConntrack opens a netfilter netlink handle in the caller's network
// namespace. It does not probe ctnetlink (a dump costs as much as the
// table is large); without nf_conntrack_netlink DeleteEntries fails with
// ErrUnsupported.
func NewConntrack() (*Conntrack, error) {
	h, err := newNetfilterHandle()
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netfilter netlink handle: %w", err)
	}
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("conntrack: socket timeout: %w", err)
	}
	return &Conntrack{h: h}, nil
}

// newNetfilterHandle waits out a concurrent load of nfnetlink like
// openNetfilterSocket (netlink.Handle cannot adopt a socket).
func newNetfilterHandle() (*netlink.Handle, error) {
	deadline := time.Now().Add(nfnetlinkLoadWait)
	for delay := 20 * time.Millisecond; ; delay *= 2 {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err == nil || !errors.Is(err, unix.EPROTONOSUPPORT) || time.Now().After(deadline) {
			return h, err
		}
		time.Sleep(delay)
	}
}

// Close releases the netlink handle.
func (c *Conntrack) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.Close()
}

func (c *Conntrack) DeleteEntries(family kernel.Family, proto kernel.Protocol, stale func(kernel.ConntrackEntry) bool) (int, error) {
	if err := kernel.CheckConntrackDelete(family, proto, stale); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f := &conntrackFilter{family: family, proto: proto, stale: stale}
	n, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(nfproto(family)), f)
	switch {
	case err == nil:
		return int(n), nil
	case errors.Is(err, netlink.ErrDumpInterrupted):
		// The table changed during the dump: the entries read were judged
		// and deleted, others may have been missed; the caller runs again.
		return int(n), fmt.Errorf("conntrack %s %s: %d deleted, but the dump was interrupted (table changed meanwhile): %w", family, proto, n, err)
	}
	return int(n), conntrackError(fmt.Sprintf("conntrack %s %s", family, proto), err)
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

// conntrackFilter judges each dumped flow; netlink deletes the ones it
// matches.
type conntrackFilter struct {
	family kernel.Family
	proto  kernel.Protocol
	stale  func(kernel.ConntrackEntry) bool
}

func (f *conntrackFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	// The kernel dumps only the requested family; check anyway, so stale
	// never sees another family's entry.
	if flow.FamilyType != nfproto(f.family) || flow.Forward.Protocol != uint8(f.proto) {
		return false
	}
	e, ok := conntrackEntry(f.family, flow)
	return ok && f.stale(e)
}

// conntrackEntry converts a dumped flow; ok is false when an address is
// missing or of another family (a flow netlink could not parse).
func conntrackEntry(family kernel.Family, flow *netlink.ConntrackFlow) (kernel.ConntrackEntry, bool) {
	e := kernel.ConntrackEntry{Protocol: kernel.Protocol(flow.Forward.Protocol)}
	ok := true
	ap := func(ip net.IP, port uint16) netip.AddrPort {
		a, valid := netip.AddrFromSlice(ip)
		if family == kernel.FamilyIPv4 {
			a = a.Unmap()
		}
		if !valid || kernel.FamilyOf(a) != family {
			ok = false
		}
		return netip.AddrPortFrom(a, port)
	}
	e.Orig = kernel.ConntrackTuple{Src: ap(flow.Forward.SrcIP, flow.Forward.SrcPort), Dst: ap(flow.Forward.DstIP, flow.Forward.DstPort)}
	e.Reply = kernel.ConntrackTuple{Src: ap(flow.Reverse.SrcIP, flow.Reverse.SrcPort), Dst: ap(flow.Reverse.DstIP, flow.Reverse.DstPort)}
	return e, ok
}
