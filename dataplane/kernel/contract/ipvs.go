package contract

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// RunIPVS checks an IPVS implementation.
func RunIPVS(t *testing.T, newIPVS func(t *testing.T) kernel.IPVS) {
	t.Run("AddGetListRoundTrip", func(t *testing.T) {
		v := newIPVS(t)
		cases := []kernel.VirtualServer{
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"},
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 443), Scheduler: "rr", Flags: kernel.FlagPersistent, Timeout: 10800},
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolUDP, 53), Scheduler: "wrr", Flags: kernel.FlagOnePacket},
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolSCTP, 9), Scheduler: "rr"},
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 81), Scheduler: "sh", Flags: kernel.FlagSHFallback | kernel.FlagSHPort},
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 82), Scheduler: "mh", Flags: kernel.FlagMHPort},
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 83), Scheduler: "rr", Flags: kernel.FlagPersistent, Timeout: 60, Netmask: 24},
			{Key: kernel.AddrKey(testAddr6(), kernel.ProtocolTCP, 80), Scheduler: "rr", Flags: kernel.FlagPersistent, Timeout: 10800},
			{Key: kernel.AddrKey(testAddr6(), kernel.ProtocolUDP, 53), Scheduler: "rr", Netmask: 64, Flags: kernel.FlagPersistent, Timeout: 5},
			{Key: kernel.FWMarkKey(kernel.FamilyIPv4, 0x7f000000+next()), Scheduler: "rr"},
			{Key: kernel.FWMarkKey(kernel.FamilyIPv6, 0x7f000000+next()), Scheduler: "rr"},
		}
		for _, vs := range cases {
			addVS(t, v, vs)
			got, err := v.GetVirtualServer(vs.Key)
			must(t, err, "get "+vs.Key.String())
			if want := vs.Normalize(); got != want {
				t.Errorf("get %v:\n got %+v\nwant %+v", vs.Key, got, want)
			}
		}
		list, err := v.ListVirtualServers()
		must(t, err, "list")
		if !slices.IsSortedFunc(list, func(a, b kernel.VirtualServer) int { return a.Key.Compare(b.Key) }) {
			t.Errorf("list not sorted by key: %+v", list)
		}
		for _, vs := range cases {
			if !slices.Contains(list, vs.Normalize()) {
				t.Errorf("list lacks %+v", vs.Normalize())
			}
		}
	})

	t.Run("HashedFlagIgnored", func(t *testing.T) {
		v := newIPVS(t)
		vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr", Flags: kernel.FlagHashed | kernel.FlagPersistent, Timeout: 30}
		addVS(t, v, vs)
		got, err := v.GetVirtualServer(vs.Key)
		must(t, err, "get")
		if got.Flags != kernel.FlagPersistent {
			t.Errorf("flags %#x, want only persistent", got.Flags)
		}
	})

	t.Run("DuplicateAddIsErrExist", func(t *testing.T) {
		v := newIPVS(t)
		vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"}
		addVS(t, v, vs)
		vs.Scheduler = "wrr"
		wantErr(t, addServer(v, vs), kernel.ErrExist, "second add")
		got, err := v.GetVirtualServer(vs.Key)
		must(t, err, "get")
		if got.Scheduler != "rr" {
			t.Errorf("failed add changed scheduler to %q", got.Scheduler)
		}
	})

	t.Run("UpdateVirtualServer", func(t *testing.T) {
		v := newIPVS(t)
		vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"}
		addVS(t, v, vs)
		vs.Scheduler, vs.Flags, vs.Timeout = "wrr", kernel.FlagPersistent, 10800
		must(t, updateVS(v, vs), "update")
		got, err := v.GetVirtualServer(vs.Key)
		must(t, err, "get")
		if got != vs.Normalize() {
			t.Errorf("after update got %+v, want %+v", got, vs.Normalize())
		}
		vs.Scheduler, vs.Flags, vs.Timeout = "mh", kernel.FlagMHPort|kernel.FlagMHFallback, 0
		must(t, updateVS(v, vs), "update to mh")
		got, err = v.GetVirtualServer(vs.Key)
		must(t, err, "get")
		if got != vs.Normalize() {
			t.Errorf("after second update got %+v, want %+v", got, vs.Normalize())
		}
	})

	t.Run("MissingIsErrNotFound", func(t *testing.T) {
		v := newIPVS(t)
		key := kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80)
		_, err := v.GetVirtualServer(key)
		wantErr(t, err, kernel.ErrNotFound, "get missing")
		wantErr(t, updateVS(v, kernel.VirtualServer{Key: key, Scheduler: "rr"}), kernel.ErrNotFound, "update missing")
		wantErr(t, deleteVS(v, key), kernel.ErrNotFound, "delete missing")
		_, err = v.ListDestinations(key)
		wantErr(t, err, kernel.ErrNotFound, "list destinations of missing")
		d := kernel.Destination{Address: testAddr4(), Port: 8080, Weight: 1}
		wantErr(t, addDest(v, key, d), kernel.ErrNotFound, "add destination to missing")
		wantErr(t, deleteVS(v, kernel.FWMarkKey(kernel.FamilyIPv4, 0x7e000000+next())), kernel.ErrNotFound, "delete missing fwmark")
	})

	t.Run("UnknownSchedulerIsErrUnsupported", func(t *testing.T) {
		v := newIPVS(t)
		vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "nosuchsched"}
		wantErr(t, addServer(v, vs), kernel.ErrUnsupported, "add with unknown scheduler")
		vs.Scheduler = "rr"
		addVS(t, v, vs)
		vs.Scheduler = "nosuchsched"
		wantErr(t, updateVS(v, vs), kernel.ErrUnsupported, "update to unknown scheduler")
	})

	t.Run("Destinations", func(t *testing.T) {
		v := newIPVS(t)
		vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "wrr"}
		addVS(t, v, vs)
		d1 := kernel.Destination{Address: testAddr4(), Port: 8080, Weight: 1}
		d2 := kernel.Destination{Address: testAddr4(), Port: 8080, Weight: 3}
		d3 := kernel.Destination{Address: d1.Address, Port: 8081, Weight: 0}
		for _, d := range []kernel.Destination{d2, d1, d3} {
			must(t, addDest(v, vs.Key, d), "add "+d.Key().String())
		}
		wantDests(t, v, vs.Key, []kernel.Destination{d1, d3, d2})
		wantErr(t, addDest(v, vs.Key, d1), kernel.ErrExist, "add existing destination")

		d1.Weight = 0
		must(t, updateDest(v, vs.Key, d1), "update weight to 0")
		d3.Weight = 7
		must(t, updateDest(v, vs.Key, d3), "update weight to 7")
		wantDests(t, v, vs.Key, []kernel.Destination{d1, d3, d2})

		missing := kernel.Destination{Address: testAddr4(), Port: 1, Weight: 1}
		wantErr(t, updateDest(v, vs.Key, missing), kernel.ErrNotFound, "update missing destination")
		wantErr(t, deleteDest(v, vs.Key, missing.Key()), kernel.ErrNotFound, "delete missing destination")

		must(t, deleteDest(v, vs.Key, d2.Key()), "delete destination")
		wantDests(t, v, vs.Key, []kernel.Destination{d1, d3})

		must(t, deleteVS(v, vs.Key), "delete server with destinations")
		_, err := v.ListDestinations(vs.Key)
		wantErr(t, err, kernel.ErrNotFound, "destinations of deleted server")
		// Re-adding starts empty: the destinations went with the server.
		addVS(t, v, vs)
		wantDests(t, v, vs.Key, nil)
	})

	t.Run("DestinationsIPv6AndFWMark", func(t *testing.T) {
		v := newIPVS(t)
		vs6 := kernel.VirtualServer{Key: kernel.AddrKey(testAddr6(), kernel.ProtocolUDP, 53), Scheduler: "rr"}
		addVS(t, v, vs6)
		d6 := kernel.Destination{Address: testAddr6(), Port: 5353, Weight: 2}
		must(t, addDest(v, vs6.Key, d6), "add v6 destination")
		wantDests(t, v, vs6.Key, []kernel.Destination{d6})

		fw := kernel.VirtualServer{Key: kernel.FWMarkKey(kernel.FamilyIPv4, 0x7d000000+next()), Scheduler: "rr"}
		addVS(t, v, fw)
		dfw := kernel.Destination{Address: testAddr4(), Port: 0, Weight: 1}
		must(t, addDest(v, fw.Key, dfw), "add fwmark destination")
		wantDests(t, v, fw.Key, []kernel.Destination{dfw})
	})

	t.Run("ApplyBatch", func(t *testing.T) {
		v := newIPVS(t)
		a := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"}
		bad := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "nosuchsched"}
		fw := kernel.VirtualServer{Key: kernel.FWMarkKey(kernel.FamilyIPv4, 0x7c000000+next()), Scheduler: "rr"}
		v6 := kernel.VirtualServer{Key: kernel.AddrKey(testAddr6(), kernel.ProtocolUDP, 53), Scheduler: "wrr",
			Flags: kernel.FlagPersistent, Timeout: 30, Netmask: 64}
		for _, vs := range []kernel.VirtualServer{a, fw, v6} {
			t.Cleanup(func() { _ = deleteVS(v, vs.Key) })
		}
		d1 := kernel.Destination{Address: testAddr4(), Port: 8080, Weight: 1}
		d2 := kernel.Destination{Address: testAddr4(), Port: 8080, Weight: 2}
		d6 := kernel.Destination{Address: testAddr6(), Port: 5353, Weight: 4}
		ops := []kernel.IPVSOp{
			{Kind: kernel.AddVirtualServer, Server: a},
			{Kind: kernel.AddDestination, Server: a, Destination: d1},
			{Kind: kernel.AddDestination, Server: a, Destination: d2},
			{Kind: kernel.AddVirtualServer, Server: bad},                                       // 3: unknown scheduler
			{Kind: kernel.AddDestination, Server: bad, Destination: d1},                        // 4: its server is missing
			{Kind: kernel.AddDestination, Server: a, Destination: d1},                          // 5: duplicate
			{Kind: kernel.AddDestination, Server: a, Destination: kernel.Destination{Port: 1}}, // 6: no address
			{Kind: kernel.UpdateDestination, Server: a, Destination: kernel.Destination{Address: d2.Address, Port: 8080, Weight: 9}},
			{Kind: kernel.AddVirtualServer, Server: fw},
			{Kind: kernel.AddDestination, Server: fw, Destination: kernel.Destination{Address: d1.Address, Weight: 1}},
			{Kind: kernel.AddVirtualServer, Server: v6},
			{Kind: kernel.AddDestination, Server: v6, Destination: d6},
			{Kind: kernel.DeleteDestination, Server: a, Destination: d1},
			{Kind: kernel.DeleteDestination, Server: a, Destination: d1}, // 13: already gone
			{Kind: kernel.UpdateVirtualServer, Server: kernel.VirtualServer{Key: a.Key, Scheduler: "wrr"}},
			{Kind: kernel.DeleteVirtualServer, Server: bad}, // 15: never added
		}
		errs := v.Apply(ops)
		if len(errs) != len(ops) {
			t.Fatalf("Apply returned %d errors for %d ops", len(errs), len(ops))
		}
		want := map[int]error{3: kernel.ErrUnsupported, 4: kernel.ErrNotFound, 5: kernel.ErrExist, 6: kernel.ErrInvalid,
			13: kernel.ErrNotFound, 15: kernel.ErrNotFound}
		for i, err := range errs {
			if w, ok := want[i]; ok {
				wantErr(t, err, w, fmt.Sprintf("op %d (%v)", i, ops[i].Kind))
			} else {
				must(t, err, fmt.Sprintf("op %d (%v)", i, ops[i].Kind))
			}
		}
		got, err := v.GetVirtualServer(a.Key)
		must(t, err, "get "+a.Key.String())
		if got.Scheduler != "wrr" {
			t.Errorf("scheduler after batched update: %q, want wrr", got.Scheduler)
		}
		d2.Weight = 9
		wantDests(t, v, a.Key, []kernel.Destination{d2})
		wantDests(t, v, fw.Key, []kernel.Destination{{Address: d1.Address, Weight: 1}})
		got6, err := v.GetVirtualServer(v6.Key)
		must(t, err, "get "+v6.Key.String())
		if got6 != v6.Normalize() {
			t.Errorf("batched add of %v: got %+v, want %+v", v6.Key, got6, v6.Normalize())
		}
		wantDests(t, v, v6.Key, []kernel.Destination{d6})
		if _, err := v.GetVirtualServer(bad.Key); err == nil {
			t.Errorf("%v exists although its add failed", bad.Key)
		}
		if errs := v.Apply(nil); len(errs) != 0 {
			t.Errorf("Apply(nil) = %v, want no errors", errs)
		}
	})

	t.Run("ApplyLargeBatchOneFailure", func(t *testing.T) {
		// More ops than one netlink message buffer holds, one failing in
		// the middle: exactly that one fails, everything else applies.
		v := newIPVS(t)
		vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"}
		addVS(t, v, vs)
		rs := testAddr4()
		const n, dup = 2500, 1700
		ops := make([]kernel.IPVSOp, 0, n+1)
		var want []kernel.Destination
		for i := range n {
			d := kernel.Destination{Address: rs, Port: uint16(1000 + i), Weight: 1}
			want = append(want, d)
			ops = append(ops, kernel.IPVSOp{Kind: kernel.AddDestination, Server: vs, Destination: d})
			if i == dup {
				ops = append(ops, kernel.IPVSOp{Kind: kernel.AddDestination, Server: vs, Destination: d})
			}
		}
		errs := v.Apply(ops)
		for i, err := range errs {
			if i == dup+1 {
				wantErr(t, err, kernel.ErrExist, fmt.Sprintf("op %d (duplicate)", i))
			} else if err != nil {
				t.Fatalf("op %d: unexpected error: %v", i, err)
			}
		}
		wantDests(t, v, vs.Key, want)
	})

	t.Run("Timeouts", func(t *testing.T) {
		v := newIPVS(t)
		orig, err := v.Timeouts()
		must(t, err, "read timeouts")
		if orig.TCP <= 0 || orig.TCPFin <= 0 || orig.UDP <= 0 {
			t.Fatalf("timeouts %+v: want all positive", orig)
		}
		t.Cleanup(func() { _ = v.SetTimeouts(orig) })
		must(t, v.SetTimeouts(kernel.Timeouts{}), "set all zero")
		got, err := v.Timeouts()
		must(t, err, "read")
		if got != orig {
			t.Errorf("zero timeouts changed %+v to %+v", orig, got)
		}
		must(t, v.SetTimeouts(kernel.Timeouts{TCP: orig.TCP + time.Second}), "set tcp only")
		got, err = v.Timeouts()
		must(t, err, "read")
		if want := (kernel.Timeouts{TCP: orig.TCP + time.Second, TCPFin: orig.TCPFin, UDP: orig.UDP}); got != want {
			t.Errorf("after tcp-only set got %+v, want %+v", got, want)
		}
		want := kernel.Timeouts{TCP: 901 * time.Second, TCPFin: 121 * time.Second, UDP: 301 * time.Second}
		must(t, v.SetTimeouts(want), "set all")
		got, err = v.Timeouts()
		must(t, err, "read")
		if got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
		wantErr(t, v.SetTimeouts(kernel.Timeouts{UDP: 1500 * time.Millisecond}), kernel.ErrInvalid, "sub-second timeout")
		wantErr(t, v.SetTimeouts(kernel.Timeouts{TCP: -time.Second}), kernel.ErrInvalid, "negative timeout")
	})

	t.Run("InvalidInput", func(t *testing.T) {
		v := newIPVS(t)
		key := kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80)
		bad := []kernel.VirtualServer{
			{Key: key}, // no scheduler
			{Key: kernel.VirtualServerKey{}, Scheduler: "rr"}, // empty key
			{Key: kernel.AddrKey(testAddr4(), 0, 80), Scheduler: "rr"},
			{Key: kernel.FWMarkKey(kernel.FamilyUnspecified, 5), Scheduler: "rr"},
			{Key: key, Scheduler: "rr", Netmask: 33},
			{Key: key, Scheduler: "rr", Flags: 0x8000},
			{Key: kernel.AddrKey(testAddr6().WithZone("eth0"), kernel.ProtocolTCP, 80), Scheduler: "rr"},
		}
		for i, vs := range bad {
			wantErr(t, addServer(v, vs), kernel.ErrInvalid, fmt.Sprintf("bad server %d %+v", i, vs))
		}
		addVS(t, v, kernel.VirtualServer{Key: key, Scheduler: "rr"})
		wantErr(t, addDest(v, key, kernel.Destination{Address: testAddr6(), Port: 80, Weight: 1}), kernel.ErrInvalid, "v6 destination on v4 server")
		wantErr(t, addDest(v, key, kernel.Destination{Address: testAddr4(), Port: 80, Weight: -1}), kernel.ErrInvalid, "negative weight")
		key6 := kernel.AddrKey(testAddr6(), kernel.ProtocolTCP, 80)
		addVS(t, v, kernel.VirtualServer{Key: key6, Scheduler: "rr"})
		wantErr(t, addDest(v, key6, kernel.Destination{Address: testAddr6().WithZone("eth0"), Port: 80, Weight: 1}), kernel.ErrInvalid, "zoned destination")
		wantDests(t, v, key6, nil)
		wantDests(t, v, key, nil)
	})

	t.Run("Schedulers", func(t *testing.T) {
		v := newIPVS(t)
		s, err := v.Schedulers()
		must(t, err, "schedulers")
		if !slices.IsSorted(s) || !slices.Contains(s, "rr") {
			t.Errorf("schedulers %v: want sorted and containing rr", s)
		}
	})

	t.Run("ConcurrentUse", func(t *testing.T) {
		v := newIPVS(t)
		const workers, each = 4, 25
		keys := make([]kernel.VirtualServerKey, workers*each)
		for i := range keys {
			keys[i] = kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80)
		}
		t.Cleanup(func() {
			for _, k := range keys {
				_ = deleteVS(v, k)
			}
		})
		var wg sync.WaitGroup
		errs := make(chan error, len(keys))
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, k := range keys[w*each : (w+1)*each] {
					if err := addServer(v, kernel.VirtualServer{Key: k, Scheduler: "rr"}); err != nil {
						errs <- err
						continue
					}
					if err := addDest(v, k, kernel.Destination{Address: k.Address.Next(), Port: 8080, Weight: 1}); err != nil {
						errs <- err
					}
					if _, err := v.ListVirtualServers(); err != nil {
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
		for _, k := range keys {
			ds, err := v.ListDestinations(k)
			if err != nil || len(ds) != 1 {
				t.Errorf("%v: destinations %v, %v; want one", k, ds, err)
			}
		}
	})
}

// addVS adds vs and deletes it when the test ends.
func addVS(t *testing.T, v kernel.IPVS, vs kernel.VirtualServer) {
	t.Helper()
	must(t, addServer(v, vs), "add "+vs.Key.String())
	t.Cleanup(func() { _ = deleteVS(v, vs.Key) })
}

func wantDests(t *testing.T, v kernel.IPVS, key kernel.VirtualServerKey, want []kernel.Destination) {
	t.Helper()
	got, err := v.ListDestinations(key)
	must(t, err, "list destinations of "+key.String())
	if len(got) != len(want) {
		t.Fatalf("destinations of %v: got %+v, want %+v", key, got, want)
	}
	for i := range want {
		w := want[i]
		w.Address = w.Address.Unmap()
		w.ActiveConn, w.InactiveConn = 0, 0
		if got[i] != w {
			t.Errorf("destination %d of %v: got %+v, want %+v", i, key, got[i], w)
		}
	}
}

// RunVirtualServerDigester checks the optional kernel.VirtualServerDigester
// of v (failing when v has none): the digest equals kernel.DigestOf of the
// listing, and changes when a server is added, changed or deleted, and
// back when the change is undone.
func RunVirtualServerDigester(t *testing.T, v kernel.IPVS) {
	d, ok := v.(kernel.VirtualServerDigester)
	if !ok {
		t.Fatalf("%T does not implement kernel.VirtualServerDigester", v)
	}
	digest := func(what string) uint64 {
		t.Helper()
		got, err := d.DigestVirtualServers()
		must(t, err, "digest virtual servers "+what)
		list, err := v.ListVirtualServers()
		must(t, err, "list virtual servers "+what)
		if want := kernel.DigestOf(list); got != want {
			t.Fatalf("%s: digest %#x, DigestOf the listing %#x", what, got, want)
		}
		return got
	}
	before := digest("before")
	vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"}
	addVS(t, v, vs)
	added := digest("with a server added")
	if added == before {
		t.Errorf("digest %#x unchanged by an added server", added)
	}
	edited := vs
	edited.Scheduler, edited.Flags, edited.Timeout = "wrr", kernel.FlagPersistent, 60
	if errs := v.Apply([]kernel.IPVSOp{{Kind: kernel.UpdateVirtualServer, Server: edited}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := digest("with the server edited"); got == added || got == before {
		t.Errorf("digest %#x unchanged by an edited server (added %#x, before %#x)", got, added, before)
	}
	if errs := v.Apply([]kernel.IPVSOp{{Kind: kernel.UpdateVirtualServer, Server: vs}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := digest("with the edit undone"); got != added {
		t.Errorf("digest %#x after the edit was undone, want %#x", got, added)
	}
	if errs := v.Apply([]kernel.IPVSOp{{Kind: kernel.DeleteVirtualServer, Server: vs}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if got := digest("with the server deleted"); got != before {
		t.Errorf("digest %#x after the server was deleted, want %#x as before", got, before)
	}
}

// RunDestinationDumper checks the optional kernel.DestinationDumper of v
// (failing when v has none): each dumped list equals ListDestinations,
// firewall-mark servers are left out, and a small table comes back whole.
// A table too big for one read comes back whole when complete is set;
// otherwise (Linux, whose dump can skip servers while other network
// namespaces hold IPVS servers: linux/ipvs_proc.go) every server dumped must
// be exact and some must be. Only the suite's own servers are compared.
func RunDestinationDumper(t *testing.T, v kernel.IPVS, complete bool) {
	d, ok := v.(kernel.DestinationDumper)
	if !ok {
		t.Fatalf("%T does not implement kernel.DestinationDumper", v)
	}
	t.Run("EqualsListDestinations", func(t *testing.T) {
		a4, b4, a6, b6 := testAddr4(), testAddr4(), testAddr6(), testAddr6()
		servers := map[kernel.VirtualServer][]kernel.Destination{
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"}: {
				{Address: a4, Port: 8080, Weight: 1},
				{Address: b4, Port: 8080, Weight: 0}, // draining
				{Address: a4, Port: 65535, Weight: 65535, Forward: kernel.ForwardDirectRoute},
			},
			// The server line's flags come before the destinations.
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolUDP, 53), Scheduler: "wrr",
				Flags: kernel.FlagPersistent | kernel.FlagOnePacket, Timeout: 10800}: {
				{Address: b4, Port: 5353, Weight: 3, Forward: kernel.ForwardTunnel},
			},
			{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolSCTP, 1), Scheduler: "sh", Flags: kernel.FlagSHFallback}: nil,
			{Key: kernel.AddrKey(testAddr6(), kernel.ProtocolTCP, 443), Scheduler: "rr",
				Flags: kernel.FlagPersistent, Timeout: 60, Netmask: 64}: {
				{Address: a6, Port: 8443, Weight: 1},
				{Address: b6, Port: 1, Weight: 2},
			},
		}
		for vs, ds := range servers {
			addVS(t, v, vs)
			for _, dest := range ds {
				must(t, addDest(v, vs.Key, dest), "add "+dest.Key().String()+" to "+vs.Key.String())
			}
		}
		fw := kernel.VirtualServer{Key: kernel.FWMarkKey(kernel.FamilyIPv4, 0x7d000000+next()), Scheduler: "rr"}
		addVS(t, v, fw)
		must(t, addDest(v, fw.Key, kernel.Destination{Address: a4, Weight: 1}), "add fwmark destination")

		dumped, err := d.DumpDestinations()
		must(t, err, "dump destinations")
		for vs := range servers {
			want, err := v.ListDestinations(vs.Key)
			must(t, err, "list destinations of "+vs.Key.String())
			got, ok := dumped[vs.Key.Normalize()]
			if !ok {
				t.Errorf("%v: missing from the dump", vs.Key)
				continue
			}
			if !slices.Equal(got, want) {
				t.Errorf("%v: dumped %+v, listed %+v", vs.Key, got, want)
			}
		}
		if ds, ok := dumped[fw.Key.Normalize()]; ok {
			t.Errorf("firewall-mark server %v dumped (%+v): the kernel's dump does not say its family", fw.Key, ds)
		}
	})

	t.Run("ManyServers", func(t *testing.T) {
		// ~2,400 destination lines, well over one read of the kernel's dump.
		const servers, perServer = 300, 8
		var ops []kernel.IPVSOp
		keys := make([]kernel.VirtualServerKey, 0, servers)
		for range servers {
			vs := kernel.VirtualServer{Key: kernel.AddrKey(testAddr4(), kernel.ProtocolTCP, 80), Scheduler: "rr"}
			keys = append(keys, vs.Key)
			ops = append(ops, kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: vs})
			for i := range perServer {
				ops = append(ops, kernel.IPVSOp{Kind: kernel.AddDestination, Server: vs,
					Destination: kernel.Destination{Address: netip.AddrFrom4([4]byte{198, 19, 7, byte(i + 1)}), Port: 8080, Weight: 1 + i}})
			}
		}
		t.Cleanup(func() {
			del := make([]kernel.IPVSOp, 0, len(keys))
			for _, k := range keys {
				del = append(del, kernel.IPVSOp{Kind: kernel.DeleteVirtualServer, Server: kernel.VirtualServer{Key: k}})
			}
			v.Apply(del)
		})
		for i, err := range v.Apply(ops) {
			must(t, err, fmt.Sprintf("op %d (%v)", i, ops[i].Kind))
		}
		dumped, err := d.DumpDestinations()
		must(t, err, "dump destinations")
		present := 0
		for _, k := range keys {
			got, ok := dumped[k]
			if !ok {
				continue
			}
			present++
			if len(got) != perServer {
				t.Fatalf("%v: dumped %d destinations, want %d: %+v", k, len(got), perServer, got)
			}
			for i, dest := range got {
				if dest.Weight != 1+i {
					t.Fatalf("%v: destination %d has weight %d, want %d", k, i, dest.Weight, 1+i)
				}
			}
		}
		t.Logf("%d of %d servers dumped", present, servers)
		if present == 0 || (complete && present != servers) {
			t.Errorf("%d of %d servers dumped, want %s", present, servers, map[bool]string{true: "all", false: "some"}[complete])
		}
	})
}
