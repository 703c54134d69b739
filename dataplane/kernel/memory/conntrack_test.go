package memory_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

func udpEntry(client, svc, ep string) kernel.ConntrackEntry {
	c := netip.MustParseAddrPort(client)
	return kernel.ConntrackEntry{Protocol: kernel.ProtocolUDP,
		Orig:  kernel.ConntrackTuple{Src: c, Dst: netip.MustParseAddrPort(svc)},
		Reply: kernel.ConntrackTuple{Src: netip.MustParseAddrPort(ep), Dst: c}}
}

func TestConntrackFaultAndCalls(t *testing.T) {
	m := memory.New()
	k := m.Kernel()
	e := udpEntry("198.19.0.1:40000", "198.18.0.1:53", "198.19.1.5:5353")
	if err := m.AddConntrackEntry(e); err != nil {
		t.Fatal(err)
	}
	if err := m.AddConntrackEntry(e); !errors.Is(err, kernel.ErrExist) {
		t.Errorf("second add: %v, want ErrExist", err)
	}
	if err := m.AddConntrackEntry(udpEntry("198.19.0.1:40000", "[2001:2::1]:53", "198.19.1.5:5353")); !errors.Is(err, kernel.ErrInvalid) {
		t.Errorf("mixed families: %v, want ErrInvalid", err)
	}
	boom := errors.New("boom")
	m.SetFault(func(op string) error {
		if op == "conntrack.DeleteEntries" {
			return boom
		}
		return nil
	})
	all := func(kernel.ConntrackEntry) bool { return true }
	if n, err := k.Conntrack.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, all); !errors.Is(err, boom) || n != 0 {
		t.Fatalf("fault: %d, %v", n, err)
	}
	if got := m.ConntrackEntries(); len(got) != 1 {
		t.Fatalf("faulted delete changed state: %+v", got)
	}
	m.SetFault(nil)
	// Invalid input is rejected before the hook and the counter.
	if _, err := k.Conntrack.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, nil); !errors.Is(err, kernel.ErrInvalid) {
		t.Fatalf("nil stale: %v", err)
	}
	if n, err := k.Conntrack.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, all); err != nil || n != 1 {
		t.Fatalf("delete: %d, %v", n, err)
	}
	if got := m.Calls(); got["conntrack.DeleteEntry"] != 1 || got["conntrack.DeleteEntries"] != 0 {
		t.Errorf("calls %v, want one conntrack.DeleteEntry write (the dump is no write)", got)
	}
	if got := m.ConntrackEntries(); len(got) != 0 {
		t.Errorf("left %+v", got)
	}
}

// TestConntrackVanished: an entry removed while stale runs (the memory
// kernel calls stale unlocked) is neither an error nor counted.
func TestConntrackVanished(t *testing.T) {
	m := memory.New()
	c := m.Kernel().Conntrack
	a := udpEntry("198.19.0.1:40000", "198.18.0.1:53", "198.19.1.5:5353")
	b := udpEntry("198.19.0.2:40000", "198.18.0.1:53", "198.19.1.5:5353")
	for _, e := range []kernel.ConntrackEntry{a, b} {
		if err := m.AddConntrackEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	first := true
	n, err := c.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, func(e kernel.ConntrackEntry) bool {
		if first {
			first = false
			// Someone else deletes every entry, this one included.
			if n, err := c.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, func(kernel.ConntrackEntry) bool { return true }); n != 2 || err != nil {
				t.Errorf("inner delete: %d, %v", n, err)
			}
		}
		return true
	})
	if n != 0 || err != nil {
		t.Errorf("delete of vanished entries: %d, %v; want 0, nil", n, err)
	}
}
