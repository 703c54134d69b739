package contract

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// RunLinks checks a Links implementation.
func RunLinks(t *testing.T, newLinks func(t *testing.T) kernel.Links) {
	t.Run("DummyLifecycle", func(t *testing.T) {
		l := newLinks(t)
		dev := uniqueName("vspt")
		created, err := l.EnsureDummy(dev)
		must(t, err, "ensure dummy")
		t.Cleanup(func() { _ = deleteDummy(l, dev) })
		if !created {
			t.Errorf("first EnsureDummy reported created=false")
		}
		created, err = l.EnsureDummy(dev)
		must(t, err, "ensure dummy again")
		if created {
			t.Errorf("second EnsureDummy reported created=true")
		}
		addrs, err := l.BoundAddresses(dev)
		must(t, err, "bound addresses of new dummy")
		if len(addrs) != 0 {
			t.Errorf("new dummy has addresses %v", addrs)
		}
		must(t, deleteDummy(l, dev), "delete dummy")
		must(t, deleteDummy(l, dev), "delete missing dummy")
		_, err = l.BoundAddresses(dev)
		wantErr(t, err, kernel.ErrNotFound, "bound addresses of deleted dummy")
	})

	t.Run("BindUnbind", func(t *testing.T) {
		l := newLinks(t)
		dev := ensureDummy(t, l)
		a4, b4, a6 := testAddr4(), testAddr4(), testAddr6()
		for _, a := range []netip.Addr{a4, b4, a6} {
			must(t, bind(l, dev, a), "bind "+a.String())
			must(t, bind(l, dev, a), "bind twice "+a.String())
		}
		want := []netip.Addr{a4, b4, a6}
		slices.SortFunc(want, netip.Addr.Compare)
		wantBound(t, l, dev, want)

		local, err := l.LocalAddresses()
		must(t, err, "local addresses")
		for _, a := range want {
			ia := kernel.InterfaceAddress{Interface: dev, Prefix: netip.PrefixFrom(a, a.BitLen())}
			if !slices.ContainsFunc(local, func(x kernel.InterfaceAddress) bool {
				return x.Interface == ia.Interface && x.Prefix == ia.Prefix && x.Index > 0
			}) {
				t.Errorf("LocalAddresses lacks %+v: %+v", ia, local)
			}
		}

		must(t, unbind(l, dev, b4), "unbind")
		must(t, unbind(l, dev, b4), "unbind again")
		must(t, unbind(l, dev, testAddr4()), "unbind never-bound address")
		must(t, unbind(l, dev, a6), "unbind v6")
		wantBound(t, l, dev, []netip.Addr{a4})
	})

	t.Run("MissingDevice", func(t *testing.T) {
		l := newLinks(t)
		dev := uniqueName("vsptno")
		wantErr(t, bind(l, dev, testAddr4()), kernel.ErrNotFound, "bind to missing device")
		must(t, unbind(l, dev, testAddr4()), "unbind from missing device")
		_, err := l.BoundAddresses(dev)
		wantErr(t, err, kernel.ErrNotFound, "addresses of missing device")
	})

	t.Run("InvalidInput", func(t *testing.T) {
		l := newLinks(t)
		_, err := l.EnsureDummy("")
		wantErr(t, err, kernel.ErrInvalid, "empty name")
		_, err = l.EnsureDummy("name-longer-than-15")
		wantErr(t, err, kernel.ErrInvalid, "long name")
		dev := ensureDummy(t, l)
		wantErr(t, bind(l, dev, netip.Addr{}), kernel.ErrInvalid, "bind zero address")
		wantErr(t, bind(l, dev, testAddr6().WithZone("eth0")), kernel.ErrInvalid, "bind zoned address")
		wantErr(t, unbind(l, dev, testAddr6().WithZone("eth0")), kernel.ErrInvalid, "unbind zoned address")
	})

	runLinksBatch(t, newLinks)
}

// runLinksBatch checks Links.ApplyAddresses (part of RunLinks).
func runLinksBatch(t *testing.T, newLinks func(t *testing.T) kernel.Links) {
	bind := func(a netip.Addr) kernel.AddressOp { return kernel.AddressOp{Kind: kernel.BindAddress, Addr: a} }
	unbind := func(a netip.Addr) kernel.AddressOp { return kernel.AddressOp{Kind: kernel.UnbindAddress, Addr: a} }
	apply := func(t *testing.T, l kernel.Links, dev string, ops []kernel.AddressOp, want map[int]error) {
		t.Helper()
		orig := slices.Clone(ops)
		errs := l.ApplyAddresses(dev, ops)
		if len(errs) != len(ops) {
			t.Fatalf("ApplyAddresses returned %d errors for %d ops", len(errs), len(ops))
		}
		if !slices.Equal(ops, orig) {
			t.Errorf("ApplyAddresses changed its argument")
		}
		for i, err := range errs {
			if w, ok := want[i]; ok {
				wantErr(t, err, w, fmt.Sprintf("op %d (%v %v)", i, ops[i].Kind, ops[i].Addr))
			} else {
				must(t, err, fmt.Sprintf("op %d (%v %v)", i, ops[i].Kind, ops[i].Addr))
			}
		}
	}

	t.Run("ApplyAddressesBatch", func(t *testing.T) {
		l := newLinks(t)
		dev := ensureDummy(t, l)
		a4, b4, c4, a6, b6 := testAddr4(), testAddr4(), testAddr4(), testAddr6(), testAddr6()
		apply(t, l, dev, []kernel.AddressOp{
			bind(a4),
			bind(b4),
			bind(a4),           // 2: already bound
			bind(netip.Addr{}), // 3: no address
			bind(a6),
			bind(b6),
			unbind(b4),
			unbind(testAddr4()),         // 7: never bound
			unbind(b6.WithZone("eth0")), // 8: zone
			unbind(b6),
			{Kind: 0, Addr: c4},               // 10: no kind
			bind(netip.AddrFrom16(c4.As16())), // IPv4-mapped: binds c4
			unbind(b4),                        // 12: already unbound in this batch
		}, map[int]error{3: kernel.ErrInvalid, 8: kernel.ErrInvalid, 10: kernel.ErrInvalid})
		want := []netip.Addr{a4, c4, a6}
		slices.SortFunc(want, netip.Addr.Compare)
		wantBound(t, l, dev, want)
		if errs := l.ApplyAddresses(dev, nil); len(errs) != 0 {
			t.Errorf("ApplyAddresses(nil) = %v, want no errors", errs)
		}
	})

	t.Run("ApplyAddressesLargeBatch", func(t *testing.T) {
		// More ops than one netlink batch holds, with answers from the
		// kernel (a duplicate bind, unbinds of absent addresses) and
		// invalid ops in the middle.
		l := newLinks(t)
		dev := ensureDummy(t, l)
		const n = 1500
		var ops []kernel.AddressOp
		var want []netip.Addr
		for i := range n {
			a := netip.AddrFrom4([4]byte{198, 18, 96 + byte(i>>8), byte(i)})
			want = append(want, a)
			ops = append(ops, bind(a))
		}
		ops = slices.Insert(ops, 1100, bind(want[1000]), unbind(testAddr4()), bind(netip.Addr{}))
		ops = slices.Insert(ops, 600, bind(testAddr6().WithZone("eth0")))
		apply(t, l, dev, ops, map[int]error{600: kernel.ErrInvalid, 1103: kernel.ErrInvalid})
		wantBound(t, l, dev, want)
		for i := range ops {
			ops[i].Kind = kernel.UnbindAddress
		}
		apply(t, l, dev, ops, map[int]error{600: kernel.ErrInvalid, 1103: kernel.ErrInvalid})
		wantBound(t, l, dev, []netip.Addr{})
	})

	t.Run("ApplyAddressesMissingDevice", func(t *testing.T) {
		l := newLinks(t)
		dev := uniqueName("vsptno")
		apply(t, l, dev, []kernel.AddressOp{bind(testAddr4()), unbind(testAddr4()), bind(testAddr6()), bind(netip.Addr{})},
			map[int]error{0: kernel.ErrNotFound, 2: kernel.ErrNotFound, 3: kernel.ErrInvalid})
	})

	t.Run("ApplyAddressesInvalidInput", func(t *testing.T) {
		l := newLinks(t)
		dev := ensureDummy(t, l)
		ops := []kernel.AddressOp{bind(testAddr4()), unbind(testAddr4())}
		for _, bad := range []string{"", "name-longer-than-15"} {
			apply(t, l, bad, ops, map[int]error{0: kernel.ErrInvalid, 1: kernel.ErrInvalid})
		}
		apply(t, l, dev, []kernel.AddressOp{
			bind(netip.Addr{}), bind(testAddr6().WithZone("eth0")), unbind(netip.Addr{}), {Kind: 9, Addr: testAddr4()},
		}, map[int]error{0: kernel.ErrInvalid, 1: kernel.ErrInvalid, 2: kernel.ErrInvalid, 3: kernel.ErrInvalid})
		wantBound(t, l, dev, []netip.Addr{})
	})
}

func ensureDummy(t *testing.T, l kernel.Links) string {
	t.Helper()
	dev := uniqueName("vspt")
	_, err := l.EnsureDummy(dev)
	must(t, err, "ensure dummy "+dev)
	t.Cleanup(func() { _ = deleteDummy(l, dev) })
	return dev
}

func wantBound(t *testing.T, l kernel.Links, dev string, want []netip.Addr) {
	t.Helper()
	got, err := l.BoundAddresses(dev)
	must(t, err, "bound addresses")
	if !slices.Equal(got, want) {
		t.Errorf("bound to %s: got %v, want %v", dev, got, want)
	}
}

// watchTimeout bounds how long a removal may take to be reported (a TCG
// guest's scheduling, not the kernel's: rtnetlink notifies synchronously).
const watchTimeout = 10 * time.Second

// RunAddressWatcher checks kernel.AddressWatcher on l, which must offer it:
// an address unbound is reported, a device deleted reports each of its
// addresses (IPv4 and IPv6), an address bound is not reported. Removals of
// addresses that are not the suite's (other tests in the namespace) are
// ignored.
func RunAddressWatcher(t *testing.T, l kernel.Links) {
	w, ok := l.(kernel.AddressWatcher)
	if !ok {
		t.Fatalf("%T is no kernel.AddressWatcher", l)
	}
	dev := ensureDummy(t, l)
	a4, b4, a6, late := testAddr4(), testAddr4(), testAddr6(), testAddr4()
	for _, a := range []netip.Addr{a4, b4, a6} {
		must(t, bind(l, dev, a), "bind "+a.String())
	}
	mine := map[netip.Addr]bool{a4: true, b4: true, a6: true, late: true}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var got []netip.Addr
	reported := make(chan struct{}, 1)
	must(t, w.WatchRemovedAddresses(ctx, func(a netip.Addr) {
		if !a.IsValid() {
			t.Errorf("the watch reported missed removals (zero Addr) in a quiet test")
			return
		}
		if !mine[a] {
			return
		}
		mu.Lock()
		got = append(got, a)
		mu.Unlock()
		select {
		case reported <- struct{}{}:
		default:
		}
	}), "watch removed addresses")
	await := func(what string, want ...netip.Addr) {
		t.Helper()
		slices.SortFunc(want, netip.Addr.Compare)
		deadline := time.After(watchTimeout)
		for {
			mu.Lock()
			have := slices.Clone(got)
			mu.Unlock()
			slices.SortFunc(have, netip.Addr.Compare)
			if slices.Equal(have, want) {
				return
			}
			if len(have) > len(want) {
				t.Fatalf("%s: reported %v, want %v", what, have, want)
			}
			select {
			case <-reported:
			case <-deadline:
				t.Fatalf("%s: reported %v within %v, want %v", what, have, watchTimeout, want)
			}
		}
	}

	must(t, bind(l, dev, late), "bind "+late.String()) // a bind is no removal: the unbind below comes first
	must(t, unbind(l, dev, a4), "unbind")
	await("unbind "+a4.String(), a4)
	must(t, deleteDummy(l, dev), "delete dummy")
	await("delete "+dev, a4, b4, a6, late)
}
