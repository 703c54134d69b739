package linux_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
)

// TestLinksOnVeth checks address binding against the real kernel on a veth
// device, which this host has (the dummy-device contract runs in the VM).
func TestLinksOnVeth(t *testing.T) {
	requireNetns(t)
	l, err := linux.NewLinks()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vspt-veth0"}, PeerName: "vspt-veth1"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth pair: %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })

	_, err = l.EnsureDummy("vspt-veth0")
	if !errors.Is(err, kernel.ErrExist) {
		t.Errorf("EnsureDummy over a veth: got %v, want ErrExist", err)
	}
	if err := l.DeleteDummy("vspt-veth0"); !errors.Is(err, kernel.ErrInvalid) {
		t.Errorf("DeleteDummy of a veth: got %v, want ErrInvalid", err)
	}

	a4, a6 := netip.MustParseAddr("198.18.250.1"), netip.MustParseAddr("2001:2:0:fa::1")
	for _, a := range []netip.Addr{a4, a6} {
		if err := bind(l, "vspt-veth0", a); err != nil {
			t.Fatalf("bind %v: %v", a, err)
		}
		if err := bind(l, "vspt-veth0", a); err != nil {
			t.Fatalf("bind %v again: %v", a, err)
		}
	}
	got, err := l.BoundAddresses("vspt-veth0")
	if err != nil || !slices.Equal(got, []netip.Addr{a4, a6}) {
		t.Fatalf("bound: %v, %v; want [%v %v]", got, err, a4, a6)
	}
	local, err := l.LocalAddresses()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(local, func(x kernel.InterfaceAddress) bool {
		return x.Interface == "vspt-veth0" && x.Prefix == netip.MustParsePrefix("198.18.250.1/32") && x.Index > 0
	}) {
		t.Errorf("LocalAddresses lacks 198.18.250.1/32 on vspt-veth0: %+v", local)
	}
	// An address bound with another prefix length is still unbound.
	link, err := netlink.LinkByName("vspt-veth0")
	if err != nil {
		t.Fatal(err)
	}
	wide, _ := netlink.ParseAddr("198.18.251.7/24")
	if err := netlink.AddrAdd(link, wide); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{a4, a6, netip.MustParseAddr("198.18.251.7")} {
		if err := unbind(l, "vspt-veth0", a); err != nil {
			t.Errorf("unbind %v: %v", a, err)
		}
		if err := unbind(l, "vspt-veth0", a); err != nil {
			t.Errorf("unbind %v again: %v", a, err)
		}
	}
	got, err = l.BoundAddresses("vspt-veth0")
	if err != nil || len(got) != 0 {
		t.Errorf("after unbinding: %v, %v; want none", got, err)
	}
	if _, err := l.BoundAddresses("vspt-nodev"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("missing device: got %v, want ErrNotFound", err)
	}

	// Dummy devices: created on kernels that have them (the VM), a clear
	// error naming the module otherwise (this host).
	created, err := l.EnsureDummy("vspt-dummy0")
	switch {
	case err == nil:
		if !created {
			t.Errorf("EnsureDummy of a new device: created=false")
		}
		if err := l.DeleteDummy("vspt-dummy0"); err != nil {
			t.Errorf("delete dummy: %v", err)
		}
	case !errors.Is(err, kernel.ErrUnsupported) || !strings.Contains(err.Error(), "dummy"):
		t.Errorf("EnsureDummy without dummy support: got %v, want ErrUnsupported naming the dummy module", err)
	}
}

// TestNewIPVSProbe: NewIPVS either works (and can list) or fails with an
// error naming the ip_vs module, never a handle that silently does nothing.
func TestNewIPVSProbe(t *testing.T) {
	requireNetns(t)
	v, err := linux.NewIPVS(linux.IPVSOptions{})
	if err != nil {
		if !strings.Contains(err.Error(), "ip_vs") {
			t.Fatalf("NewIPVS error does not name the ip_vs module: %v", err)
		}
		t.Logf("IPVS unavailable here, as expected on hosts without ip_vs: %v", err)
		return
	}
	defer v.Close()
	list, err := v.ListVirtualServers()
	if err != nil {
		t.Fatalf("list after successful probe: %v", err)
	}
	for _, vs := range list {
		if vs.Key.FWMark == 0x7f5eed01 {
			t.Errorf("probe virtual server left behind: %+v", vs)
		}
	}
}

// TestApplyAddressesOnVeth runs batched binds against the real kernel on a
// veth device (the dummy-device contract runs in the VM): a kernel failure
// in the middle of a large batch (IPv6 disabled on the device) fails only
// its op, an address bound with another prefix length is still unbound,
// and the batch goes out in sendmsg calls of up to 512 requests.
func TestApplyAddressesOnVeth(t *testing.T) {
	requireNetns(t)
	l, err := linux.NewLinks()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	const dev = "vspt-veth2"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev}, PeerName: "vspt-veth3"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth pair: %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	wide, _ := netlink.ParseAddr("198.18.240.7/24")
	if err := netlink.AddrAdd(link, wide); err != nil {
		t.Fatal(err)
	}

	const n, v6At, wideAt = 1200, 700, 300
	var ops []kernel.AddressOp
	var want []netip.Addr
	for i := range n {
		a := netip.AddrFrom4([4]byte{198, 18, 236 + byte(i>>8), byte(i)})
		want = append(want, a)
		ops = append(ops, kernel.AddressOp{Kind: kernel.BindAddress, Addr: a})
	}
	ops = slices.Insert(ops, v6At, kernel.AddressOp{Kind: kernel.BindAddress, Addr: netip.MustParseAddr("2001:2:0:ec::1")})
	ops = slices.Insert(ops, wideAt, kernel.AddressOp{Kind: kernel.UnbindAddress, Addr: netip.MustParseAddr("198.18.240.7")})
	before := l.BatchSends()
	errs := l.ApplyAddresses(dev, ops)
	for i, err := range errs {
		if (i == v6At+1) != (err != nil) {
			t.Errorf("op %d (%v %v): %v", i, ops[i].Kind, ops[i].Addr, err)
		}
	}
	t.Logf("IPv6 bind with IPv6 disabled: %v", errs[v6At+1])
	if got, want := l.BatchSends()-before, 3; got != want {
		t.Errorf("%d ops: %d sendmsg calls, want %d", len(ops), got, want)
	}
	got, err := l.BoundAddresses(dev)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("bound: %d addresses (%v), want the %d IPv4 ones", len(got), err, len(want))
	}

	l.BreakBatch()
	for i, err := range l.ApplyAddresses(dev, ops[:3]) {
		if err == nil || !strings.Contains(err.Error(), "outcome unknown") {
			t.Errorf("op %d after a failed exchange: got %v, want an outcome-unknown error", i, err)
		}
	}
	// Reads have their own socket.
	if got, err := l.BoundAddresses(dev); err != nil || len(got) != len(want) {
		t.Errorf("bound after the batch socket broke: %d addresses, %v; want %d", len(got), err, len(want))
	}
}

// bind and unbind are one-op batches (kernel.Links writes only in batches).
func bind(l kernel.Links, dev string, a netip.Addr) error {
	return l.ApplyAddresses(dev, []kernel.AddressOp{{Kind: kernel.BindAddress, Addr: a}})[0]
}

func unbind(l kernel.Links, dev string, a netip.Addr) error {
	return l.ApplyAddresses(dev, []kernel.AddressOp{{Kind: kernel.UnbindAddress, Addr: a}})[0]
}

// TestBoundAddressesManyOnVeth: BoundAddresses' in-place dump reads every
// address of the device over many reply datagrams (1,500 IPv4 and 500
// IPv6), none of another device's, no IPv6 link-local one, and a
// point-to-point address as its own end (IFA_LOCAL), as the netlink
// library read them.
func TestBoundAddressesManyOnVeth(t *testing.T) {
	requireNetns(t)
	l, err := linux.NewLinks()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vspt-many0"}, PeerName: "vspt-many1"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth pair: %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })

	var ops []kernel.AddressOp
	var want []netip.Addr
	for i := range 1500 {
		a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		ops, want = append(ops, kernel.AddressOp{Kind: kernel.BindAddress, Addr: a}), append(want, a)
	}
	for i := range 500 {
		a := netip.AddrFrom16([16]byte{0x20, 0x01, 0, 2, 0, 0, 0, 0xfb, 14: byte(i >> 8), 15: byte(i)})
		ops, want = append(ops, kernel.AddressOp{Kind: kernel.BindAddress, Addr: a}), append(want, a)
	}
	for i, err := range l.ApplyAddresses("vspt-many0", ops) {
		if err != nil {
			t.Fatalf("bind %v: %v", ops[i].Addr, err)
		}
	}
	if err := bind(l, "vspt-many1", netip.MustParseAddr("198.18.252.1")); err != nil {
		t.Fatal(err)
	}
	link, err := netlink.LinkByName("vspt-many0")
	if err != nil {
		t.Fatal(err)
	}
	ptp := &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP("198.18.253.1")), Peer: netlink.NewIPNet(net.ParseIP("198.18.253.2"))}
	linkLocal, _ := netlink.ParseAddr("fe80::1234/64")
	for _, a := range []*netlink.Addr{ptp, linkLocal} {
		if err := netlink.AddrAdd(link, a); err != nil {
			t.Fatalf("add %v: %v", a, err)
		}
	}
	want = append(want, netip.MustParseAddr("198.18.253.1"))
	slices.SortFunc(want, netip.Addr.Compare)

	got, err := l.BoundAddresses("vspt-many0")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("bound: %d addresses, want %d; first differences: %v", len(got), len(want), firstDiff(got, want))
	}
}

func firstDiff(got, want []netip.Addr) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("at %d got %v want %v", i, got[i], want[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(got), len(want))
}
