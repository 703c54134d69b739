package contract

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// RunIPSets checks an IPSets implementation.
func RunIPSets(t *testing.T, newIPSets func(t *testing.T) kernel.IPSets) {
	t.Run("CreateAndListEveryType", func(t *testing.T) {
		s := newIPSets(t)
		sets := []kernel.IPSet{
			{Name: uniqueName("VSPT-IP-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4},
			{Name: uniqueName("VSPT-IPPORT-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4},
			{Name: uniqueName("VSPT-IPPORTIP-"), Type: kernel.HashIPPortIP, Family: kernel.FamilyIPv4},
			{Name: uniqueName("VSPT-IPPORTNET-"), Type: kernel.HashIPPortNet, Family: kernel.FamilyIPv4},
			{Name: uniqueName("VSPT-NET-"), Type: kernel.HashNet, Family: kernel.FamilyIPv4, MaxElem: 1000},
			{Name: uniqueName("VSPT-BM-"), Type: kernel.BitmapPort, PortFrom: 0, PortTo: 65535},
			{Name: uniqueName("VSPT-6-IPPORT-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv6, HashSize: 4096, Comments: true},
			{Name: uniqueName("VSPT-6-NET-"), Type: kernel.HashNet, Family: kernel.FamilyIPv6, Comments: true},
		}
		for _, set := range sets {
			createSet(t, s, set)
		}
		list, err := s.ListSets()
		must(t, err, "list sets")
		if !slices.IsSortedFunc(list, func(a, b kernel.IPSet) int { return cmpString(a.Name, b.Name) }) {
			t.Errorf("ListSets not sorted by name")
		}
		for _, set := range sets {
			if !slices.Contains(list, set.Normalize()) {
				t.Errorf("ListSets lacks %+v; got %+v", set.Normalize(), list)
			}
		}
	})

	t.Run("CreateIsIdempotentOnlyForSameParameters", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-IDEM-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
		createSet(t, s, set)
		must(t, s.CreateSet(set), "create same set again")
		same := set
		same.HashSize, same.MaxElem = 2048, kernel.DefaultMaxElem
		must(t, s.CreateSet(same), "create with other hashsize and explicit default maxelem")
		for _, diff := range []kernel.IPSet{
			{Name: set.Name, Type: kernel.HashIP, Family: kernel.FamilyIPv4},
			{Name: set.Name, Type: kernel.HashIPPort, Family: kernel.FamilyIPv6},
			{Name: set.Name, Type: kernel.HashIPPort, Family: kernel.FamilyIPv4, MaxElem: 100},
			{Name: set.Name, Type: kernel.HashIPPort, Family: kernel.FamilyIPv4, Comments: true},
		} {
			wantErr(t, s.CreateSet(diff), kernel.ErrExist, fmt.Sprintf("create %+v over %+v", diff, set))
		}
		bm := kernel.IPSet{Name: uniqueName("VSPT-BMIDEM-"), Type: kernel.BitmapPort, PortFrom: 30000, PortTo: 32767}
		createSet(t, s, bm)
		must(t, s.CreateSet(bm), "create same bitmap again")
		bm.PortTo = 40000
		wantErr(t, s.CreateSet(bm), kernel.ErrExist, "bitmap with other range")
	})

	t.Run("EntriesRoundTripEveryType", func(t *testing.T) {
		s := newIPSets(t)
		a4, b4 := testAddr4(), testAddr4()
		a6, b6 := testAddr6(), testAddr6()
		cases := []struct {
			set     kernel.IPSet
			entries []kernel.Entry
		}{
			{kernel.IPSet{Type: kernel.HashIP, Family: kernel.FamilyIPv4}, []kernel.Entry{{IP: a4}, {IP: b4}}},
			{kernel.IPSet{Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}, []kernel.Entry{
				{IP: a4, Protocol: kernel.ProtocolTCP, Port: 80},
				{IP: a4, Protocol: kernel.ProtocolUDP, Port: 80},
				{IP: b4, Protocol: kernel.ProtocolSCTP, Port: 9},
			}},
			{kernel.IPSet{Type: kernel.HashIPPortIP, Family: kernel.FamilyIPv4}, []kernel.Entry{
				{IP: a4, Protocol: kernel.ProtocolTCP, Port: 8080, IP2: a4},
				{IP: b4, Protocol: kernel.ProtocolUDP, Port: 53, IP2: b4},
			}},
			{kernel.IPSet{Type: kernel.HashIPPortNet, Family: kernel.FamilyIPv4}, []kernel.Entry{
				{IP: a4, Protocol: kernel.ProtocolTCP, Port: 80, Net: netip.MustParsePrefix("198.19.0.0/24")},
				{IP: a4, Protocol: kernel.ProtocolTCP, Port: 80, Net: netip.MustParsePrefix("198.19.7.9/32")},
			}},
			{kernel.IPSet{Type: kernel.HashNet, Family: kernel.FamilyIPv4}, []kernel.Entry{
				{Net: netip.MustParsePrefix("198.19.1.0/24")},
				{Net: netip.PrefixFrom(b4, 32)},
			}},
			{kernel.IPSet{Type: kernel.BitmapPort, PortFrom: 0, PortTo: 65535}, []kernel.Entry{{Port: 30080}, {Port: 0}, {Port: 65535}}},
			{kernel.IPSet{Type: kernel.HashIP, Family: kernel.FamilyIPv6}, []kernel.Entry{{IP: a6}, {IP: b6}}},
			{kernel.IPSet{Type: kernel.HashIPPort, Family: kernel.FamilyIPv6}, []kernel.Entry{{IP: a6, Protocol: kernel.ProtocolTCP, Port: 443}}},
			{kernel.IPSet{Type: kernel.HashIPPortIP, Family: kernel.FamilyIPv6}, []kernel.Entry{{IP: a6, Protocol: kernel.ProtocolTCP, Port: 443, IP2: b6}}},
			{kernel.IPSet{Type: kernel.HashIPPortNet, Family: kernel.FamilyIPv6}, []kernel.Entry{
				{IP: a6, Protocol: kernel.ProtocolTCP, Port: 443, Net: netip.MustParsePrefix("2001:2:0:1::/64")},
			}},
			{kernel.IPSet{Type: kernel.HashNet, Family: kernel.FamilyIPv6}, []kernel.Entry{{Net: netip.MustParsePrefix("2001:2:0:2::/64")}}},
		}
		for _, c := range cases {
			c.set.Name = uniqueName("VSPT-E-")
			createSet(t, s, c.set)
			for _, e := range c.entries {
				must(t, addEntry(s, c.set, e), fmt.Sprintf("add %s to %s", e.Format(c.set.Type), c.set.Type))
				must(t, addEntry(s, c.set, e), fmt.Sprintf("add %s to %s again (exist semantics)", e.Format(c.set.Type), c.set.Type))
			}
			wantEntries(t, s, c.set, c.entries)
			must(t, delEntry(s, c.set, c.entries[0]), "delete entry")
			must(t, delEntry(s, c.set, c.entries[0]), "delete absent entry (exist semantics)")
			wantEntries(t, s, c.set, c.entries[1:])
		}
	})

	t.Run("NetEntriesAreMasked", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-MASK-"), Type: kernel.HashNet, Family: kernel.FamilyIPv4}
		createSet(t, s, set)
		must(t, addEntry(s, set, kernel.Entry{Net: netip.MustParsePrefix("198.19.3.77/24")}), "add unmasked net")
		wantEntries(t, s, set, []kernel.Entry{{Net: netip.MustParsePrefix("198.19.3.0/24")}})
	})

	t.Run("Comments", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-CMT-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4, Comments: true}
		createSet(t, s, set)
		e := kernel.Entry{IP: testAddr4(), Protocol: kernel.ProtocolTCP, Port: 80, Comment: "ns/svc:http"}
		must(t, addEntry(s, set, e), "add with comment")
		wantEntries(t, s, set, []kernel.Entry{e})
		e.Comment = "ns/svc:https"
		must(t, addEntry(s, set, e), "re-add with other comment")
		wantEntries(t, s, set, []kernel.Entry{e})
		plain := kernel.IPSet{Name: uniqueName("VSPT-NOCMT-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4}
		createSet(t, s, plain)
		wantErr(t, addEntry(s, plain, kernel.Entry{IP: testAddr4(), Comment: "x"}), kernel.ErrInvalid, "comment on set without comments")
	})

	t.Run("MissingSet", func(t *testing.T) {
		s := newIPSets(t)
		name := uniqueName("VSPT-MISSING-")
		wantErr(t, destroySet(s, name), kernel.ErrNotFound, "destroy missing")
		wantErr(t, flushSet(s, name), kernel.ErrNotFound, "flush missing")
		_, err := s.ListEntries(name)
		wantErr(t, err, kernel.ErrNotFound, "list missing")
		set := kernel.IPSet{Name: name, Type: kernel.HashIP, Family: kernel.FamilyIPv4}
		wantErr(t, addEntry(s, set, kernel.Entry{IP: testAddr4()}), kernel.ErrNotFound, "add to missing")
		wantErr(t, delEntry(s, set, kernel.Entry{IP: testAddr4()}), kernel.ErrNotFound, "del from missing")
	})

	t.Run("FlushAndDestroy", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-FL-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4}
		must(t, s.CreateSet(set), "create")
		for range 10 {
			must(t, addEntry(s, set, kernel.Entry{IP: testAddr4()}), "add")
		}
		must(t, flushSet(s, set.Name), "flush")
		wantEntries(t, s, set, nil)
		must(t, destroySet(s, set.Name), "destroy")
		list, err := s.ListSets()
		must(t, err, "list")
		if slices.ContainsFunc(list, func(x kernel.IPSet) bool { return x.Name == set.Name }) {
			t.Errorf("destroyed set still listed")
		}
	})

	t.Run("MaxElem", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-MAX-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4, MaxElem: 2}
		createSet(t, s, set)
		a, b := testAddr4(), testAddr4()
		must(t, addEntry(s, set, kernel.Entry{IP: a}), "add 1")
		must(t, addEntry(s, set, kernel.Entry{IP: b}), "add 2")
		must(t, addEntry(s, set, kernel.Entry{IP: a}), "re-add 1 to a full set")
		if err := addEntry(s, set, kernel.Entry{IP: testAddr4()}); err == nil {
			t.Errorf("add beyond maxelem 2 succeeded")
		}
		wantEntries(t, s, set, []kernel.Entry{{IP: a}, {IP: b}})
	})

	t.Run("InvalidInput", func(t *testing.T) {
		s := newIPSets(t)
		for _, bad := range []kernel.IPSet{
			{Name: "", Type: kernel.HashIP, Family: kernel.FamilyIPv4},
			{Name: "VSPT-NAME-THAT-IS-FAR-TOO-LONG-FOR-IPSET", Type: kernel.HashIP, Family: kernel.FamilyIPv4},
			{Name: uniqueName("VSPT-BAD-"), Type: "hash:mac", Family: kernel.FamilyIPv4},
			{Name: uniqueName("VSPT-BAD-"), Type: kernel.HashIP},
			{Name: uniqueName("VSPT-BAD-"), Type: kernel.BitmapPort, PortFrom: 10, PortTo: 5},
			{Name: uniqueName("VSPT-BAD-"), Type: kernel.BitmapPort, Family: kernel.FamilyIPv4, PortTo: 5},
		} {
			wantErr(t, s.CreateSet(bad), kernel.ErrInvalid, fmt.Sprintf("create %+v", bad))
		}
		set := kernel.IPSet{Name: uniqueName("VSPT-BADE-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
		createSet(t, s, set)
		bm := kernel.IPSet{Name: uniqueName("VSPT-BADBM-"), Type: kernel.BitmapPort, PortFrom: 30000, PortTo: 32767}
		createSet(t, s, bm)
		set6 := kernel.IPSet{Name: uniqueName("VSPT-BADE6-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv6}
		createSet(t, s, set6)
		for _, c := range []struct {
			set kernel.IPSet
			e   kernel.Entry
		}{
			{set, kernel.Entry{IP: testAddr4(), Port: 80}},                               // no protocol
			{set, kernel.Entry{IP: testAddr6(), Protocol: kernel.ProtocolTCP, Port: 80}}, // wrong family
			{set, kernel.Entry{Protocol: kernel.ProtocolTCP, Port: 80}},                  // no IP
			{bm, kernel.Entry{Port: 80}},                                                 // out of range
			{bm, kernel.Entry{Port: 30001, Protocol: kernel.ProtocolTCP}},                // protocol on bitmap
			{set, kernel.Entry{IP: testAddr4(), Protocol: kernel.ProtocolTCP, Port: 1, Net: netip.MustParsePrefix("198.19.0.0/24")}},
			{set6, kernel.Entry{IP: testAddr6().WithZone("eth0"), Protocol: kernel.ProtocolTCP, Port: 80}}, // IPv6 zone
		} {
			wantErr(t, addEntry(s, c.set, c.e), kernel.ErrInvalid, fmt.Sprintf("add %+v to %s", c.e, c.set.Type))
		}
		wantEntries(t, s, set, nil)
		wantEntries(t, s, bm, nil)
		wantEntries(t, s, set6, nil)
	})

	t.Run("ManyEntries", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-MANY-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
		createSet(t, s, set)
		var want []kernel.Entry
		for i := range 2000 {
			e := kernel.Entry{IP: netip.AddrFrom4([4]byte{198, 18, 64 + byte(i>>8), byte(i)}), Protocol: kernel.ProtocolTCP, Port: uint16(1000 + i%7)}
			must(t, addEntry(s, set, e), "add")
			want = append(want, e)
		}
		wantEntries(t, s, set, want)
	})

	t.Run("ApplyEntriesBatch", func(t *testing.T) {
		s := newIPSets(t)
		ipport := kernel.IPSet{Name: uniqueName("VSPT-B-IPPORT-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4, Comments: true}
		bm := kernel.IPSet{Name: uniqueName("VSPT-B-BM-"), Type: kernel.BitmapPort, PortFrom: 30000, PortTo: 32767}
		ip6 := kernel.IPSet{Name: uniqueName("VSPT-B-6-IP-"), Type: kernel.HashIP, Family: kernel.FamilyIPv6}
		full := kernel.IPSet{Name: uniqueName("VSPT-B-FULL-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4, MaxElem: 1}
		missing := kernel.IPSet{Name: uniqueName("VSPT-B-MISSING-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4}
		for _, set := range []kernel.IPSet{ipport, bm, ip6, full} {
			createSet(t, s, set)
		}
		a4, b4, c4, a6 := testAddr4(), testAddr4(), testAddr4(), testAddr6()
		e1 := kernel.Entry{IP: a4, Protocol: kernel.ProtocolTCP, Port: 80, Comment: "ns/a:http"}
		e2 := kernel.Entry{IP: b4, Protocol: kernel.ProtocolUDP, Port: 53}
		add := func(set kernel.IPSet, e kernel.Entry) kernel.EntryOp {
			return kernel.EntryOp{Kind: kernel.AddEntry, Set: set, Entry: e}
		}
		del := func(set kernel.IPSet, e kernel.Entry) kernel.EntryOp {
			return kernel.EntryOp{Kind: kernel.DelEntry, Set: set, Entry: e}
		}
		e1b := e1
		e1b.Comment = "ns/a:https"
		ops := []kernel.EntryOp{
			add(ipport, e1),
			add(ipport, e2),
			add(bm, kernel.Entry{Port: 30080}), // bitmap:port: port only on the wire
			add(missing, kernel.Entry{IP: c4}), // 3: no such set
			add(ipport, kernel.Entry{IP: a6, Protocol: kernel.ProtocolTCP, Port: 80}), // 4: wrong family
			add(ipport, e1), // present: -exist
			add(ip6, kernel.Entry{IP: a6}),
			add(full, kernel.Entry{IP: a4}),
			add(full, kernel.Entry{IP: b4}), // 8: set full (maxelem 1)
			del(ipport, e2),
			del(ipport, e2),                    // absent: -exist
			add(bm, kernel.Entry{Port: 80}),    // 11: outside the range
			add(ipport, e1b),                   // present: updates the comment
			del(bm, kernel.Entry{Port: 30080}), // deleted again ...
			add(bm, kernel.Entry{Port: 32767}), // ... and another added
			{Kind: 0, Set: ipport, Entry: e2},  // 15: no kind
			del(missing, kernel.Entry{IP: c4}), // 16: no such set
		}
		orig := slices.Clone(ops)
		errs := s.ApplyEntries(ops)
		if len(errs) != len(ops) {
			t.Fatalf("ApplyEntries returned %d errors for %d ops", len(errs), len(ops))
		}
		if !slices.Equal(ops, orig) {
			t.Errorf("ApplyEntries changed its argument")
		}
		want := map[int]error{3: kernel.ErrNotFound, 4: kernel.ErrInvalid, 11: kernel.ErrInvalid, 15: kernel.ErrInvalid, 16: kernel.ErrNotFound}
		for i, err := range errs {
			switch w, ok := want[i]; {
			case ok:
				wantErr(t, err, w, fmt.Sprintf("op %d (%v)", i, ops[i].Kind))
			case i == 8:
				if err == nil {
					t.Errorf("op 8: add beyond maxelem 1 succeeded")
				}
			default:
				must(t, err, fmt.Sprintf("op %d (%v %s to %s)", i, ops[i].Kind, ops[i].Entry.Format(ops[i].Set.Type), ops[i].Set.Name))
			}
		}
		wantEntries(t, s, ipport, []kernel.Entry{e1b})
		wantEntries(t, s, bm, []kernel.Entry{{Port: 32767}})
		wantEntries(t, s, ip6, []kernel.Entry{{IP: a6}})
		wantEntries(t, s, full, []kernel.Entry{{IP: a4}})
		if errs := s.ApplyEntries(nil); len(errs) != 0 {
			t.Errorf("ApplyEntries(nil) = %v, want no errors", errs)
		}
	})

	t.Run("ApplyEntriesLargeBatch", func(t *testing.T) {
		// More ops than one netlink batch holds, by count (plain entries)
		// and by bytes (long comments), with a failure from the kernel and
		// an invalid op in the middle: exactly those fail.
		s := newIPSets(t)
		plain := kernel.IPSet{Name: uniqueName("VSPT-L-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
		cmt := kernel.IPSet{Name: uniqueName("VSPT-LC-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4, Comments: true}
		createSet(t, s, plain)
		createSet(t, s, cmt)
		missing := kernel.IPSet{Name: uniqueName("VSPT-L-MISSING-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4}
		const nPlain, nCmt, gone, bad = 1500, 1000, 1700, 700
		long := strings.Repeat("c", 200)
		var ops []kernel.EntryOp
		var wantPlain, wantCmt []kernel.Entry
		for i := range nPlain {
			e := kernel.Entry{IP: netip.AddrFrom4([4]byte{198, 18, 32 + byte(i>>8), byte(i)}), Protocol: kernel.ProtocolTCP, Port: 80}
			wantPlain = append(wantPlain, e)
			ops = append(ops, kernel.EntryOp{Kind: kernel.AddEntry, Set: plain, Entry: e})
		}
		for i := range nCmt {
			e := kernel.Entry{IP: netip.AddrFrom4([4]byte{198, 18, 48 + byte(i>>8), byte(i)}), Comment: fmt.Sprintf("%s%d", long, i)}
			wantCmt = append(wantCmt, e)
			ops = append(ops, kernel.EntryOp{Kind: kernel.AddEntry, Set: cmt, Entry: e})
		}
		ops = slices.Insert(ops, gone, kernel.EntryOp{Kind: kernel.AddEntry, Set: missing, Entry: kernel.Entry{IP: testAddr4()}})
		ops = slices.Insert(ops, bad, kernel.EntryOp{Kind: kernel.AddEntry, Set: plain, Entry: kernel.Entry{IP: testAddr4()}})
		errs := s.ApplyEntries(ops)
		if len(errs) != len(ops) {
			t.Fatalf("ApplyEntries returned %d errors for %d ops", len(errs), len(ops))
		}
		for i, err := range errs {
			switch i {
			case bad:
				wantErr(t, err, kernel.ErrInvalid, fmt.Sprintf("op %d (no port)", i))
			case gone + 1: // shifted by the insert before it
				wantErr(t, err, kernel.ErrNotFound, fmt.Sprintf("op %d (missing set)", i))
			default:
				if err != nil {
					t.Fatalf("op %d: unexpected error: %v", i, err)
				}
			}
		}
		wantEntries(t, s, plain, wantPlain)
		wantEntries(t, s, cmt, wantCmt)
		// And all of them out again in one batch.
		for i := range ops {
			ops[i].Kind = kernel.DelEntry
		}
		for i, err := range s.ApplyEntries(ops) {
			if i != bad && i != gone+1 && err != nil {
				t.Fatalf("delete op %d: unexpected error: %v", i, err)
			}
		}
		wantEntries(t, s, plain, nil)
		wantEntries(t, s, cmt, nil)
	})

	t.Run("ApplyEntriesInvalidInput", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-BI-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
		createSet(t, s, set)
		plain := kernel.IPSet{Name: uniqueName("VSPT-BI-NOCMT-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4}
		createSet(t, s, plain)
		set6 := kernel.IPSet{Name: uniqueName("VSPT-BI-6-"), Type: kernel.HashIP, Family: kernel.FamilyIPv6}
		createSet(t, s, set6)
		ops := []kernel.EntryOp{
			{Kind: kernel.AddEntry, Set: set, Entry: kernel.Entry{IP: testAddr4(), Port: 80}},                     // no protocol
			{Kind: kernel.AddEntry, Set: set, Entry: kernel.Entry{Protocol: kernel.ProtocolTCP, Port: 80}},        // no IP
			{Kind: kernel.DelEntry, Set: set, Entry: kernel.Entry{IP: testAddr6(), Protocol: kernel.ProtocolTCP}}, // wrong family
			{Kind: kernel.AddEntry, Set: plain, Entry: kernel.Entry{IP: testAddr4(), Comment: "x"}},               // comment without the extension
			{Kind: kernel.AddEntry, Set: set6, Entry: kernel.Entry{IP: testAddr6().WithZone("eth0")}},             // zone
			{Kind: 7, Set: set, Entry: kernel.Entry{IP: testAddr4(), Protocol: kernel.ProtocolTCP, Port: 80}},     // unknown kind
		}
		for i, err := range s.ApplyEntries(ops) {
			wantErr(t, err, kernel.ErrInvalid, fmt.Sprintf("op %d %+v", i, ops[i]))
		}
		wantEntries(t, s, set, nil)
		wantEntries(t, s, plain, nil)
		wantEntries(t, s, set6, nil)
		// A comment on a delete is ignored.
		e := kernel.Entry{IP: testAddr4()}
		must(t, addEntry(s, plain, e), "add")
		del := kernel.Entry{IP: e.IP, Comment: "ignored"}
		for _, err := range s.ApplyEntries([]kernel.EntryOp{{Kind: kernel.DelEntry, Set: plain, Entry: del}}) {
			must(t, err, "delete with a comment from a set without comments")
		}
		wantEntries(t, s, plain, nil)
	})

	t.Run("ConcurrentUse", func(t *testing.T) {
		s := newIPSets(t)
		set := kernel.IPSet{Name: uniqueName("VSPT-CONC-"), Type: kernel.HashIP, Family: kernel.FamilyIPv4}
		createSet(t, s, set)
		const workers, each = 4, 50
		var wg sync.WaitGroup
		var mu sync.Mutex
		var want []kernel.Entry
		errs := make(chan error, workers*each)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					e := kernel.Entry{IP: testAddr4()}
					if err := addEntry(s, set, e); err != nil {
						errs <- err
						continue
					}
					mu.Lock()
					want = append(want, e)
					mu.Unlock()
					if _, err := s.ListSets(); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent op: %v", err)
		}
		wantEntries(t, s, set, want)
	})
}

// createSet creates set and destroys it when the test ends.
func createSet(t *testing.T, s kernel.IPSets, set kernel.IPSet) {
	t.Helper()
	must(t, s.CreateSet(set), fmt.Sprintf("create %+v", set))
	t.Cleanup(func() { _ = destroySet(s, set.Name) })
}

func wantEntries(t *testing.T, s kernel.IPSets, set kernel.IPSet, want []kernel.Entry) {
	t.Helper()
	got, err := s.ListEntries(set.Name)
	must(t, err, "list entries of "+set.Name)
	key := func(e kernel.Entry) string { return e.Normalize().Format(set.Type) + "|" + e.Comment }
	g := make([]string, 0, len(got))
	for _, e := range got {
		if e != e.Normalize() {
			t.Errorf("entry %+v of %s is not normalized", e, set.Name)
		}
		g = append(g, key(e))
	}
	w := make([]string, 0, len(want))
	for _, e := range want {
		w = append(w, key(e))
	}
	slices.Sort(g)
	slices.Sort(w)
	// The header's count agrees with the listing (the kernels the suite
	// runs on, 4.10 and later, all report it).
	counts, err := s.EntryCounts()
	must(t, err, "entry counts")
	if n, ok := counts[set.Name]; !ok || n != len(g) {
		t.Errorf("EntryCounts of %s: %d (reported: %v), its listing has %d", set.Name, n, ok, len(g))
	}
	if !slices.Equal(g, w) {
		if len(g) > 20 || len(w) > 20 {
			t.Fatalf("entries of %s: got %d, want %d (first got %v, first want %v)", set.Name, len(g), len(w), g[:min(3, len(g))], w[:min(3, len(w))])
		}
		t.Fatalf("entries of %s:\n got %q\nwant %q", set.Name, g, w)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
