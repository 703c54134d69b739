package memory_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

func TestFaultAndCalls(t *testing.T) {
	m := memory.New()
	k := m.Kernel()
	boom := errors.New("boom")
	m.SetFault(func(op string) error {
		if op == "ipvs.AddVirtualServer" {
			return boom
		}
		return nil
	})
	vs := kernel.VirtualServer{Key: kernel.AddrKey(netip.MustParseAddr("198.18.0.1"), kernel.ProtocolTCP, 80), Scheduler: "rr"}
	if err := one(k, kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: vs}); !errors.Is(err, boom) {
		t.Fatalf("fault not returned: %v", err)
	}
	if list, err := k.IPVS.ListVirtualServers(); err != nil || len(list) != 0 {
		t.Fatalf("faulted add changed state: %+v (%v)", list, err)
	}
	m.SetFault(nil)
	if err := one(k, kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: vs}); err != nil {
		t.Fatal(err)
	}
	if err := k.IPTables.Restore(context.Background(), kernel.FamilyIPv4, []byte("*nat\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	calls := m.Calls()
	if calls["ipvs.AddVirtualServer"] != 2 || calls["iptables.Restore"] != 1 {
		t.Errorf("calls: %v", calls)
	}
	m.ResetCalls()
	if len(m.Calls()) != 0 {
		t.Errorf("ResetCalls left %v", m.Calls())
	}
}

func TestSetConnections(t *testing.T) {
	m := memory.New()
	k := m.Kernel()
	key := kernel.AddrKey(netip.MustParseAddr("198.18.0.1"), kernel.ProtocolTCP, 80)
	d := kernel.Destination{Address: netip.MustParseAddr("198.19.1.5"), Port: 8080, Weight: 1}
	if err := one(k, kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: kernel.VirtualServer{Key: key, Scheduler: "rr"}}); err != nil {
		t.Fatal(err)
	}
	if err := one(k, kernel.IPVSOp{Kind: kernel.AddDestination, Server: kernel.VirtualServer{Key: key}, Destination: d}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetConnections(key, d.Key(), 3, 4); err != nil {
		t.Fatal(err)
	}
	d.Weight = 0
	if err := one(k, kernel.IPVSOp{Kind: kernel.UpdateDestination, Server: kernel.VirtualServer{Key: key}, Destination: d}); err != nil {
		t.Fatal(err)
	}
	ds, err := k.IPVS.ListDestinations(key)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || ds[0].ActiveConn != 3 || ds[0].InactiveConn != 4 || ds[0].Weight != 0 {
		t.Errorf("destinations: %+v (want counters kept across a weight update)", ds)
	}
	if err := m.SetConnections(key, kernel.DestinationKey{Address: d.Address, Port: 1}, 1, 1); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("missing destination: %v", err)
	}
}

func TestLocalAddressesAndSysctlHooks(t *testing.T) {
	m := memory.New()
	k := m.Kernel()
	m.AddInterface("eth0", "veth", netip.MustParsePrefix("198.19.0.11/24"))
	local, err := k.Links.LocalAddresses()
	if err != nil {
		t.Fatal(err)
	}
	if len(local) != 1 || local[0].Interface != "eth0" || local[0].Prefix != netip.MustParsePrefix("198.19.0.11/24") {
		t.Errorf("local: %+v", local)
	}
	m.SetKernelRelease("5.4.0-42-generic")
	v, err := k.Sysctl.KernelVersion()
	if err != nil {
		t.Fatal(err)
	}
	if want := (kernel.KernelVersion{Major: 5, Minor: 4, Patch: 0, Raw: "5.4.0-42-generic"}); v != want {
		t.Errorf("KernelVersion = %+v, want %+v", v, want)
	}
	m.SetKernelRelease("garbage")
	if _, err := k.Sysctl.KernelVersion(); !errors.Is(err, kernel.ErrInvalid) {
		t.Errorf("KernelVersion of an unparsable release: %v, want ErrInvalid", err)
	}
	m.DeleteSysctl(kernel.SysctlVSConntrack)
	if _, err := k.Sysctl.Get(kernel.SysctlVSConntrack); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("deleted sysctl: %v", err)
	}
	m.SetSchedulers([]string{"rr"})
	s, err := k.IPVS.Schedulers()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s, []string{"rr"}) {
		t.Errorf("schedulers %v, want [rr]", s)
	}
}

// one applies a one-op IPVS batch.
func one(k kernel.Kernel, op kernel.IPVSOp) error { return k.IPVS.Apply([]kernel.IPVSOp{op})[0] }
