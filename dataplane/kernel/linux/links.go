package linux

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Links manages the dummy device and its addresses with rtnetlink.
type Links struct {
	mu sync.Mutex
	h  *netlink.Handle
	// batch carries ApplyAddresses: many binds/unbinds per syscall; reads
	// carries BoundAddresses' in-place dumps.
	batch, reads *nlBatch
}

var _ kernel.Links = (*Links)(nil)

// NewLinks opens an rtnetlink handle in the caller's network namespace.
func NewLinks() (*Links, error) {
	h, err := netlink.NewHandle(syscall.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("links: open rtnetlink handle: %w", err)
	}
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("links: socket timeout: %w", err)
	}
	b, err := newNLBatch(unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("links: %w", err)
	}
	r, err := newNLBatch(unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		b.close()
		return nil, fmt.Errorf("links: %w", err)
	}
	return &Links{h: h, batch: b, reads: r}, nil
}

// Close releases the netlink sockets.
func (l *Links) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.h.Close()
	l.batch.close()
	l.reads.close()
}

func validDev(name string) error {
	if name == "" || len(name) > 15 {
		return fmt.Errorf("device name %q must be 1..15 bytes: %w", name, kernel.ErrInvalid)
	}
	return nil
}

func linkErr(what string, err error) error {
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return fmt.Errorf("%s: %w", what, kernel.ErrNotFound)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if s := kernel.ErrnoSentinel(errno); s != nil {
			return fmt.Errorf("%s: %w (%w)", what, s, errno)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// linkByName returns the link, or nil when it does not exist.
func (l *Links) linkByName(name string) (netlink.Link, error) {
	link, err := l.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, linkErr("links: find "+name, err)
	}
	return link, nil
}

// retryDump repeats a netlink dump interrupted by a concurrent change.
func retryDump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range 5 {
		v, err = f()
		if !errors.Is(err, nl.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

func (l *Links) EnsureDummy(name string) (bool, error) {
	if err := validDev(name); err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	link, err := l.linkByName(name)
	if err != nil {
		return false, err
	}
	if link != nil {
		if link.Type() != "dummy" {
			return false, fmt.Errorf("links: device %s exists with type %s: %w", name, link.Type(), kernel.ErrExist)
		}
		return false, nil
	}
	// Left down, as kube-proxy leaves kube-ipvs0: addresses on it are local
	// all the same.
	if err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return false, fmt.Errorf("links: create dummy %s (is the dummy kernel module available?): %w (%w)", name, kernel.ErrUnsupported, err)
		}
		return false, linkErr("links: create dummy "+name, err)
	}
	return true, nil
}

// DeleteDummy deletes a dummy device (a missing one is nil): for tests and
// the contract suite's clean-up (see contract.DummyDeleter); the agent never
// deletes it.
func (l *Links) DeleteDummy(name string) error {
	if err := validDev(name); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	link, err := l.linkByName(name)
	if err != nil || link == nil {
		return err
	}
	if link.Type() != "dummy" {
		return fmt.Errorf("links: %s has type %s, not dummy: %w", name, link.Type(), kernel.ErrInvalid)
	}
	if err := l.h.LinkDel(link); err != nil && !errors.Is(err, syscall.ENODEV) {
		return linkErr("links: delete "+name, err)
	}
	return nil
}

// unbindOther deletes addr from link where addrs (the device's addresses)
// hold it with a prefix length other than the host length the agent
// binds: the fallback of an unbind whose host-prefix delete found nothing.
func (l *Links) unbindOther(link netlink.Link, dev string, addr netip.Addr, addrs []netlink.Addr) error {
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != addr {
			continue
		}
		if ones, _ := a.Mask.Size(); ones == addr.BitLen() {
			continue // the host prefix: its delete just found nothing
		}
		err := l.h.AddrDel(link, &a)
		if err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENXIO) && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ENODEV) {
			return linkErr(fmt.Sprintf("links: unbind %v from %s", addr, dev), err)
		}
	}
	return nil
}

// appendAddrRequest appends the payload of the rtnetlink request binding
// (RTM_NEWADDR, NLM_F_EXCL: a bound address answers EEXIST) or unbinding
// (RTM_DELADDR) addr as a host prefix on the device with index idx, as
// netlink's AddrAdd/AddrDel build it for a host prefix (no broadcast, no
// label, no lifetimes), and returns its type and flags.
func appendAddrRequest(buf []byte, kind kernel.AddressOpKind, idx int, addr netip.Addr) ([]byte, uint16, uint16) {
	typ, flags := uint16(unix.RTM_DELADDR), uint16(0)
	if kind == kernel.BindAddress {
		typ, flags = unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL
	}
	family := uint8(unix.AF_INET)
	if addr.Is6() {
		family = unix.AF_INET6
	}
	buf = append(buf, family, uint8(addr.BitLen()), 0, 0) // ifaddrmsg: family, prefix length, flags, scope
	buf = binary.NativeEndian.AppendUint32(buf, uint32(idx))
	buf = nlaAddr(buf, unix.IFA_LOCAL, addr)
	buf = nlaAddr(buf, unix.IFA_ADDRESS, addr)
	return buf, typ, flags
}

// ApplyAddresses binds and unbinds addresses on dev in batches of many
// rtnetlink requests per syscall (see kernel.Links.ApplyAddresses and
// nlBatch), with kernel.Links' semantics per op: EEXIST on a bind is
// success (already bound), an unbind that finds no host prefix falls back
// to deleting the address with whatever prefix length it has (after the
// batch, one address listing for all of them).
func (l *Links) ApplyAddresses(dev string, ops []kernel.AddressOp) []error {
	errs := make([]error, len(ops))
	if err := validDev(dev); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	valid := validOps(ops, kernel.AddressOp.Validate, errs)
	if len(valid) == 0 {
		return errs
	}
	what := func(op kernel.AddressOp) string {
		if op.Kind == kernel.BindAddress {
			return fmt.Sprintf("links: bind %v to %s", op.Addr.Unmap(), dev)
		}
		return fmt.Sprintf("links: unbind %v from %s", op.Addr.Unmap(), dev)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	link, err := l.linkByName(dev)
	if err != nil || link == nil {
		for _, i := range valid {
			switch {
			case err != nil:
				errs[i] = err
			case ops[i].Kind == kernel.BindAddress:
				errs[i] = fmt.Errorf("%s: %w", what(ops[i]), kernel.ErrNotFound)
			}
		}
		return errs
	}
	idx := link.Attrs().Index
	res := l.batch.do(len(valid), func(j int) nlPayload {
		op := ops[valid[j]]
		return func(buf []byte) ([]byte, uint16, uint16) {
			return appendAddrRequest(buf, op.Kind, idx, op.Addr.Unmap())
		}
	})
	var other []int // unbinds that found no host prefix
	for j, i := range valid {
		op, r := ops[i], res[j]
		switch {
		case r.lost != nil:
			errs[i] = fmt.Errorf("%s: %w: %w", what(op), errBatchLost, r.lost)
		case r.errno == 0:
		case op.Kind == kernel.BindAddress && r.errno == syscall.EEXIST:
			// Already bound.
		case op.Kind == kernel.UnbindAddress && r.errno == syscall.ENODEV:
		case op.Kind == kernel.UnbindAddress && r.errno == syscall.EADDRNOTAVAIL:
			other = append(other, i)
		default:
			errs[i] = linkErr(what(op), r.errno)
		}
	}
	if len(other) == 0 {
		return errs
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return l.h.AddrList(link, netlink.FAMILY_ALL) })
	for _, i := range other {
		if err != nil {
			errs[i] = linkErr("links: list addresses of "+dev, err)
			continue
		}
		errs[i] = l.unbindOther(link, dev, ops[i].Addr.Unmap(), addrs)
	}
	return errs
}

func (l *Links) BoundAddresses(dev string) ([]netip.Addr, error) {
	if err := validDev(dev); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	link, err := l.linkByName(dev)
	if err != nil {
		return nil, err
	}
	if link == nil {
		return nil, fmt.Errorf("links: addresses of %s: %w", dev, kernel.ErrNotFound)
	}
	out, err := retryDump(func() ([]netip.Addr, error) { return l.dumpAddresses(link.Attrs().Index) })
	if err != nil {
		return nil, linkErr("links: list addresses of "+dev, err)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// dumpAddresses reads the addresses of link index with an in-place
// RTM_GETADDR dump (nldump.go): kube-ipvs0 holds every Service address, and
// the netlink library's AddrList built an Addr with its own slices per
// address (33 MB per two full passes at 10k Services). IPv6 link-local
// addresses are left out. An address is IFA_LOCAL when given (a
// point-to-point link's own end), else IFA_ADDRESS, as AddrList reads it.
func (l *Links) dumpAddresses(index int) ([]netip.Addr, error) {
	out := []netip.Addr{}
	err := l.reads.dump(func(buf []byte) ([]byte, uint16, uint16) {
		return append(buf, make([]byte, unix.SizeofIfAddrmsg)...), unix.RTM_GETADDR, unix.NLM_F_DUMP
	}, func(msg []byte) error {
		if len(msg) < unix.SizeofIfAddrmsg {
			return fmt.Errorf("short address message (%d bytes)", len(msg))
		}
		if int(binary.NativeEndian.Uint32(msg[4:8])) != index { // ifa_index
			return nil
		}
		var local, address netip.Addr
		if err := walkAttrs(msg[unix.SizeofIfAddrmsg:], func(typ uint16, v []byte) error {
			a, ok := netip.AddrFromSlice(v)
			switch {
			case typ != unix.IFA_LOCAL && typ != unix.IFA_ADDRESS:
			case !ok:
				return fmt.Errorf("address attribute %d of %d bytes", typ, len(v))
			case typ == unix.IFA_LOCAL:
				local = a
			default:
				address = a
			}
			return nil
		}); err != nil {
			return err
		}
		a := cmp.Or(local, address).Unmap()
		if a.IsValid() && !(a.Is6() && a.IsLinkLocalUnicast()) {
			out = append(out, a)
		}
		return nil
	})
	return out, err
}

func (l *Links) LocalAddresses() ([]kernel.InterfaceAddress, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	links, err := retryDump(l.h.LinkList)
	if err != nil {
		return nil, linkErr("links: list links", err)
	}
	names := make(map[int]string, len(links))
	for _, link := range links {
		names[link.Attrs().Index] = link.Attrs().Name
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return l.h.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, linkErr("links: list addresses", err)
	}
	out := make([]kernel.InterfaceAddress, 0, len(addrs))
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, kernel.InterfaceAddress{
			Interface: names[a.LinkIndex],
			Index:     a.LinkIndex,
			Prefix:    netip.PrefixFrom(ip.Unmap(), ones),
		})
	}
	slices.SortFunc(out, func(a, b kernel.InterfaceAddress) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), a.Prefix.Addr().Compare(b.Prefix.Addr()))
	})
	return out, nil
}
