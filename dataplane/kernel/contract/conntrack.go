package contract

import (
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// ConntrackSeeder creates and lists entries behind the Conntrack's back, as
// traffic would. The memory implementation's Conntrack is one; the Linux
// one only in its own test binary (export_test.go).
type ConntrackSeeder interface {
	Add(kernel.ConntrackEntry) error
	List(kernel.Family, kernel.Protocol) ([]kernel.ConntrackEntry, error)
}

// conntrackRun is one test's entries: clients it owns and what stale saw.
type conntrackRun struct {
	t       *testing.T
	c       kernel.Conntrack
	s       ConntrackSeeder
	clients map[netip.Addr]bool
}

func newConntrackRun(t *testing.T, newConntrack func(t *testing.T) (kernel.Conntrack, ConntrackSeeder)) *conntrackRun {
	c, s := newConntrack(t)
	r := &conntrackRun{t: t, c: c, s: s, clients: map[netip.Addr]bool{}}
	// Shared namespaces: delete what this test created, and only that.
	t.Cleanup(func() {
		for _, f := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
			for _, p := range []kernel.Protocol{kernel.ProtocolUDP, kernel.ProtocolTCP, kernel.ProtocolSCTP} {
				if _, err := c.DeleteEntries(f, p, r.mine); err != nil {
					t.Errorf("cleanup of %s %s entries: %v", f, p, err)
				}
			}
		}
	})
	return r
}

func (r *conntrackRun) mine(e kernel.ConntrackEntry) bool { return r.clients[e.Orig.Src.Addr()] }

// testPort returns a process-unique port (1024..65023).
func testPort() uint16 { return uint16(1024 + next()%64000) }

// client returns a new client address of family f that r owns.
func (r *conntrackRun) client(f kernel.Family) netip.AddrPort {
	a := testAddr4()
	if f == kernel.FamilyIPv6 {
		a = testAddr6()
	}
	r.clients[a] = true
	return netip.AddrPortFrom(a, testPort())
}

// nat seeds the entry of a client of svc DNATed to ep.
func (r *conntrackRun) nat(p kernel.Protocol, client, svc, ep netip.AddrPort) kernel.ConntrackEntry {
	r.t.Helper()
	e := kernel.ConntrackEntry{Protocol: p,
		Orig:  kernel.ConntrackTuple{Src: client, Dst: svc},
		Reply: kernel.ConntrackTuple{Src: ep, Dst: client}}
	must(r.t, r.s.Add(e), "seed conntrack entry")
	return e
}

// listMine returns r's entries of f and p.
func (r *conntrackRun) listMine(f kernel.Family, p kernel.Protocol) []kernel.ConntrackEntry {
	r.t.Helper()
	all, err := r.s.List(f, p)
	must(r.t, err, "list conntrack entries")
	return slices.DeleteFunc(all, func(e kernel.ConntrackEntry) bool { return !r.mine(e) })
}

// judge wraps stale: it fails the test for any entry outside f and p
// (whoever created it) and records r's entries it was asked about.
func (r *conntrackRun) judge(f kernel.Family, p kernel.Protocol, stale func(kernel.ConntrackEntry) bool) (func(kernel.ConntrackEntry) bool, func() []kernel.ConntrackEntry) {
	var mu sync.Mutex
	var seen []kernel.ConntrackEntry
	return func(e kernel.ConntrackEntry) bool {
			if e.Family() != f || e.Protocol != p {
				r.t.Errorf("asked for %s %s, stale got %+v", f, p, e)
				return false
			}
			if !r.mine(e) {
				return false
			}
			mu.Lock()
			seen = append(seen, e)
			mu.Unlock()
			return stale(e)
		}, func() []kernel.ConntrackEntry {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(seen)
		}
}

func sameEntries(a, b []kernel.ConntrackEntry) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(e kernel.ConntrackEntry) bool { return !slices.Contains(b, e) })
}

// RunConntrack checks a Conntrack implementation.
func RunConntrack(t *testing.T, newConntrack func(t *testing.T) (kernel.Conntrack, ConntrackSeeder)) {
	t.Run("DeletesExactlyTheStale", func(t *testing.T) {
		r := newConntrackRun(t, newConntrack)
		f, p := kernel.FamilyIPv4, kernel.ProtocolUDP
		svc := netip.AddrPortFrom(testAddr4(), 53)
		gone, kept := netip.AddrPortFrom(testAddr4(), 5353), netip.AddrPortFrom(testAddr4(), 5353)
		var all, want []kernel.ConntrackEntry
		for i := range 6 {
			ep := gone
			if i%2 == 1 {
				ep = kept
			}
			e := r.nat(p, r.client(f), svc, ep)
			all = append(all, e)
			if ep == kept {
				want = append(want, e)
			}
		}
		// Another service's traffic to the gone endpoint stays.
		other := r.nat(p, r.client(f), netip.AddrPortFrom(testAddr4(), 53), gone)
		all, want = append(all, other), append(want, other)
		stale, seen := r.judge(f, p, func(e kernel.ConntrackEntry) bool {
			return e.Orig.Dst == svc && e.Reply.Src == gone
		})
		n, err := r.c.DeleteEntries(f, p, stale)
		must(t, err, "delete entries")
		if n != 3 {
			t.Errorf("deleted %d, want 3", n)
		}
		if got := seen(); !sameEntries(got, all) {
			t.Errorf("stale saw %+v, want each of %+v once", got, all)
		}
		if got := r.listMine(f, p); !sameEntries(got, want) {
			t.Errorf("left %+v, want %+v", got, want)
		}
	})

	t.Run("OnlyTheProtocolAsked", func(t *testing.T) {
		r := newConntrackRun(t, newConntrack)
		f := kernel.FamilyIPv4
		svc, ep := netip.AddrPortFrom(testAddr4(), testPort()), netip.AddrPortFrom(testAddr4(), testPort())
		client := r.client(f)
		udp := r.nat(kernel.ProtocolUDP, client, svc, ep)
		tcp := r.nat(kernel.ProtocolTCP, client, svc, ep)
		all := func(kernel.ConntrackEntry) bool { return true }

		stale, seen := r.judge(f, kernel.ProtocolUDP, all)
		n, err := r.c.DeleteEntries(f, kernel.ProtocolUDP, stale)
		must(t, err, "delete udp")
		if got := seen(); n != 1 || !sameEntries(got, []kernel.ConntrackEntry{udp}) {
			t.Errorf("udp: deleted %d, stale saw %+v; want 1, %+v", n, got, udp)
		}
		if got := r.listMine(f, kernel.ProtocolTCP); !sameEntries(got, []kernel.ConntrackEntry{tcp}) {
			t.Fatalf("tcp entries after deleting udp: %+v, want %+v", got, tcp)
		}

		stale, seen = r.judge(f, kernel.ProtocolTCP, all)
		n, err = r.c.DeleteEntries(f, kernel.ProtocolTCP, stale)
		must(t, err, "delete tcp")
		if got := seen(); n != 1 || !sameEntries(got, []kernel.ConntrackEntry{tcp}) {
			t.Errorf("tcp: deleted %d, stale saw %+v; want 1, %+v", n, got, tcp)
		}
		if got := r.listMine(f, kernel.ProtocolTCP); len(got) != 0 {
			t.Errorf("tcp entries left: %+v", got)
		}
	})

	// SCTP entries are judged by their ports like UDP's (netlink v1.3.1's
	// own parser reads them as port 0, which this would catch: the two
	// services below differ in their port only).
	t.Run("SCTP", func(t *testing.T) {
		r := newConntrackRun(t, newConntrack)
		f, p := kernel.FamilyIPv4, kernel.ProtocolSCTP
		ip, ep := testAddr4(), netip.AddrPortFrom(testAddr4(), testPort())
		svc, other := netip.AddrPortFrom(ip, testPort()), netip.AddrPortFrom(ip, testPort())
		client := r.client(f)
		doomed := r.nat(p, client, svc, ep)
		kept := r.nat(p, netip.AddrPortFrom(client.Addr(), client.Port()+1), other, ep)
		udp := r.nat(kernel.ProtocolUDP, client, svc, ep)
		stale, seen := r.judge(f, p, func(e kernel.ConntrackEntry) bool { return e.Orig.Dst == svc })
		n, err := r.c.DeleteEntries(f, p, stale)
		must(t, err, "delete sctp")
		if got := seen(); n != 1 || !sameEntries(got, []kernel.ConntrackEntry{doomed, kept}) {
			t.Errorf("deleted %d, stale saw %+v; want 1, %+v", n, got, []kernel.ConntrackEntry{doomed, kept})
		}
		if got := r.listMine(f, p); !sameEntries(got, []kernel.ConntrackEntry{kept}) {
			t.Errorf("sctp left %+v, want %+v", got, kept)
		}
		if got := r.listMine(f, kernel.ProtocolUDP); !sameEntries(got, []kernel.ConntrackEntry{udp}) {
			t.Errorf("udp left %+v, want %+v", got, udp)
		}
	})

	t.Run("IPv6", func(t *testing.T) {
		r := newConntrackRun(t, newConntrack)
		p := kernel.ProtocolUDP
		svc := netip.AddrPortFrom(testAddr6(), testPort())
		gone, kept := netip.AddrPortFrom(testAddr6(), testPort()), netip.AddrPortFrom(testAddr6(), testPort())
		e1 := r.nat(p, r.client(kernel.FamilyIPv6), svc, gone)
		e2 := r.nat(p, r.client(kernel.FamilyIPv6), svc, kept)
		v4 := r.nat(p, r.client(kernel.FamilyIPv4), netip.AddrPortFrom(testAddr4(), svc.Port()), netip.AddrPortFrom(testAddr4(), gone.Port()))

		stale, seen := r.judge(kernel.FamilyIPv4, p, func(kernel.ConntrackEntry) bool { return false })
		n, err := r.c.DeleteEntries(kernel.FamilyIPv4, p, stale)
		must(t, err, "delete ipv4")
		if got := seen(); n != 0 || !sameEntries(got, []kernel.ConntrackEntry{v4}) {
			t.Errorf("ipv4: deleted %d, stale saw %+v; want 0, %+v", n, got, v4)
		}

		stale, seen = r.judge(kernel.FamilyIPv6, p, func(e kernel.ConntrackEntry) bool { return e.Reply.Src == gone })
		n, err = r.c.DeleteEntries(kernel.FamilyIPv6, p, stale)
		must(t, err, "delete ipv6")
		if got := seen(); n != 1 || !sameEntries(got, []kernel.ConntrackEntry{e1, e2}) {
			t.Errorf("ipv6: deleted %d, stale saw %+v; want 1, %+v", n, got, []kernel.ConntrackEntry{e1, e2})
		}
		if got := r.listMine(kernel.FamilyIPv6, p); !sameEntries(got, []kernel.ConntrackEntry{e2}) {
			t.Errorf("ipv6 left %+v, want %+v", got, e2)
		}
		if got := r.listMine(kernel.FamilyIPv4, p); !sameEntries(got, []kernel.ConntrackEntry{v4}) {
			t.Errorf("ipv4 left %+v, want %+v", got, v4)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		r := newConntrackRun(t, newConntrack)
		e := r.nat(kernel.ProtocolUDP, r.client(kernel.FamilyIPv4),
			netip.AddrPortFrom(testAddr4(), testPort()), netip.AddrPortFrom(testAddr4(), testPort()))
		called := func(e kernel.ConntrackEntry) bool {
			t.Errorf("stale called with %+v on invalid input", e)
			return true
		}
		for _, c := range []struct {
			f    kernel.Family
			p    kernel.Protocol
			want error
		}{
			{kernel.FamilyUnspecified, kernel.ProtocolUDP, kernel.ErrInvalid},
			{kernel.Family(5), kernel.ProtocolUDP, kernel.ErrInvalid},
			{kernel.FamilyIPv4, kernel.ProtocolUnspecified, kernel.ErrInvalid},
			{kernel.FamilyIPv4, kernel.Protocol(1), kernel.ErrInvalid}, // icmp
		} {
			n, err := r.c.DeleteEntries(c.f, c.p, called)
			wantErr(t, err, c.want, "delete "+c.f.String()+" "+c.p.String())
			if n != 0 {
				t.Errorf("%s %s: deleted %d", c.f, c.p, n)
			}
		}
		n, err := r.c.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, nil)
		wantErr(t, err, kernel.ErrInvalid, "delete with nil stale")
		if n != 0 {
			t.Errorf("nil stale: deleted %d", n)
		}
		if got := r.listMine(kernel.FamilyIPv4, kernel.ProtocolUDP); !sameEntries(got, []kernel.ConntrackEntry{e}) {
			t.Errorf("invalid calls touched the table: %+v, want %+v", got, e)
		}
	})

	t.Run("NothingMatches", func(t *testing.T) {
		r := newConntrackRun(t, newConntrack)
		for _, f := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
			// Maybe an empty table (a fresh namespace has no TCP entries).
			stale, _ := r.judge(f, kernel.ProtocolTCP, func(kernel.ConntrackEntry) bool { return true })
			n, err := r.c.DeleteEntries(f, kernel.ProtocolTCP, stale)
			if n != 0 || err != nil {
				t.Errorf("%s tcp without own entries: %d, %v; want 0, nil", f, n, err)
			}
		}
		e := r.nat(kernel.ProtocolUDP, r.client(kernel.FamilyIPv4),
			netip.AddrPortFrom(testAddr4(), testPort()), netip.AddrPortFrom(testAddr4(), testPort()))
		stale, seen := r.judge(kernel.FamilyIPv4, kernel.ProtocolUDP, func(kernel.ConntrackEntry) bool { return false })
		n, err := r.c.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, stale)
		if n != 0 || err != nil || len(seen()) != 1 {
			t.Errorf("none stale: %d, %v, stale saw %+v; want 0, nil, %+v", n, err, seen(), e)
		}
		if got := r.listMine(kernel.FamilyIPv4, kernel.ProtocolUDP); !sameEntries(got, []kernel.ConntrackEntry{e}) {
			t.Errorf("left %+v, want %+v", got, e)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		r := newConntrackRun(t, newConntrack)
		const workers, each = 4, 8
		f, p := kernel.FamilyIPv4, kernel.ProtocolUDP
		svcs := make([]netip.AddrPort, workers)
		for w := range svcs {
			svcs[w] = netip.AddrPortFrom(testAddr4(), testPort())
			ep := netip.AddrPortFrom(testAddr4(), testPort())
			for range each {
				r.nat(p, r.client(f), svcs[w], ep)
			}
		}
		counts := make([]int, workers)
		var wg sync.WaitGroup
		for w := range svcs {
			wg.Go(func() {
				stale, _ := r.judge(f, p, func(e kernel.ConntrackEntry) bool { return e.Orig.Dst == svcs[w] })
				n, err := r.c.DeleteEntries(f, p, stale)
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
				}
				counts[w] = n
			})
		}
		wg.Wait()
		for w, n := range counts {
			if n != each {
				t.Errorf("worker %d deleted %d, want %d", w, n, each)
			}
		}
		if got := r.listMine(f, p); len(got) != 0 {
			t.Errorf("left %d entries: %+v", len(got), got)
		}
	})
}
