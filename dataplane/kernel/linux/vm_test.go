//go:build vmtest

package linux_test

// Real-kernel tests for IPVS and dummy links. They need a kernel with ip_vs
// and dummy (the QEMU test bed); build with
//
//	CGO_ENABLED=0 go test -c -tags vmtest -o kernel-linux.test ./dataplane/kernel/linux
//
// and run the binary as root inside the VM. TestMain moves it into a fresh
// network namespace first, like the host tests.

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/contract"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
)

func newIPVS(t *testing.T) *linux.IPVS {
	t.Helper()
	requireNetns(t)
	v, err := linux.NewIPVS(linux.IPVSOptions{})
	if err != nil {
		t.Fatalf("IPVS must work in the VM: %v", err)
	}
	t.Cleanup(v.Close)
	return v
}

func newLinks(t *testing.T) *linux.Links {
	t.Helper()
	requireNetns(t)
	l, err := linux.NewLinks()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func TestVMIPVSContract(t *testing.T) {
	v := newIPVS(t)
	contract.RunIPVS(t, func(*testing.T) kernel.IPVS { return v })
	left, err := v.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("suite left %d virtual servers behind: %+v", len(left), left)
	}
}

// TestVMDestinationDumperContract: the one-read dump of /proc/net/ip_vs
// against netlink's per-server reads. Not necessarily complete: TestVM runs
// this beside node namespaces that hold IPVS servers (ipvs_proc.go).
func TestVMDestinationDumperContract(t *testing.T) {
	contract.RunDestinationDumper(t, newIPVS(t), false)
}

// TestVMVirtualServerDigesterContract: the digest of one service dump against
// the listing.
func TestVMVirtualServerDigesterContract(t *testing.T) {
	contract.RunVirtualServerDigester(t, newIPVS(t))
}

func TestVMIPVSSchedulers(t *testing.T) {
	v := newIPVS(t)
	s, err := v.Schedulers()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rr", "wrr", "sh", "mh", "lc", "wlc"} {
		if !slices.Contains(s, want) {
			t.Errorf("schedulers %v lack %s", s, want)
		}
	}
}

func TestVMLinksContract(t *testing.T) {
	l := newLinks(t)
	contract.RunLinks(t, func(*testing.T) kernel.Links { return l })
}

func TestVMAddressWatcherContract(t *testing.T) {
	contract.RunAddressWatcher(t, newLinks(t))
}

func TestVMKubeIPVS0(t *testing.T) {
	l := newLinks(t)
	created, err := l.EnsureDummy(kernel.DummyDevice)
	if err != nil || !created {
		t.Fatalf("create %s: created=%v err=%v", kernel.DummyDevice, created, err)
	}
	t.Cleanup(func() { _ = l.DeleteDummy(kernel.DummyDevice) })
	if err := bind(l, kernel.DummyDevice, testAddr(t, "198.18.0.10")); err != nil {
		t.Fatal(err)
	}
	got, err := l.BoundAddresses(kernel.DummyDevice)
	if err != nil || len(got) != 1 {
		t.Fatalf("bound: %v, %v", got, err)
	}
}

// TestVMUnbindOtherPrefix: an unbind deletes a /32 (/128) directly and
// falls back to listing for an address bound with another prefix length.
func TestVMUnbindOtherPrefix(t *testing.T) {
	l := newLinks(t)
	const dev = "vsptprefix"
	if _, err := l.EnsureDummy(dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.DeleteDummy(dev) })
	link, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"198.18.77.1/24", "2001:2:0:77::1/64"} {
		a, err := netlink.ParseAddr(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrAdd(link, a); err != nil {
			t.Fatalf("add %s by hand: %v", p, err)
		}
	}
	host := testAddr(t, "198.18.77.2")
	if err := bind(l, dev, host); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"198.18.77.1", "2001:2:0:77::1", "198.18.77.2"} {
		if err := unbind(l, dev, testAddr(t, a)); err != nil {
			t.Fatalf("unbind %s: %v", a, err)
		}
	}
	got, err := l.BoundAddresses(dev)
	if err != nil || len(got) != 0 {
		t.Fatalf("after unbinding everything: %v, %v", got, err)
	}
}

func TestVMIPVSSysctls(t *testing.T) {
	newIPVS(t) // loads ip_vs, which creates net/ipv4/vs/*
	s := linux.NewSysctl("")
	for _, name := range []string{kernel.SysctlVSConntrack, kernel.SysctlVSExpireNodestConn, kernel.SysctlVSExpireQuiescentTmpl, kernel.SysctlVSConnReuseMode} {
		orig, err := s.Get(name)
		if err != nil {
			t.Fatalf("get %s: %v", name, err)
		}
		want := 1 - orig%2
		if err := s.Set(name, want); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
		if got, err := s.Get(name); err != nil || got != want {
			t.Errorf("%s: got %d, %v; want %d", name, got, err, want)
		}
		_ = s.Set(name, orig)
	}
}

// TestVMFullContract runs every suite against one real kernel.
func TestVMFullContract(t *testing.T) {
	v, l, s, c := newIPVS(t), newLinks(t), newIPSets(t), newConntrack(t)
	ipt := newIPTables(t, "")
	contract.Run(t, func(*testing.T) kernel.Kernel {
		return kernel.Kernel{IPVS: v, IPSets: s, Links: l, IPTables: ipt, Sysctl: linux.NewSysctl(""), Conntrack: c}
	})
}

func testAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
