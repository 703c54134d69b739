package contract

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// RunLinks checks a Links implementation.
func RunLinks(t *testing.T, newLinks func(t *testing.T) kernel.Links) {
	t.Run("DummyLifecycle", func(t *testing.T) {
		l := newLinks(t)
		dev := uniqueName("vspt")
		created, err := l.EnsureDummy(dev)
		must(t, err, "ensure dummy")
		t.Cleanup(func() { _ = l.DeleteDummy(dev) })
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
		must(t, l.DeleteDummy(dev), "delete dummy")
		must(t, l.DeleteDummy(dev), "delete missing dummy")
		_, err = l.BoundAddresses(dev)
		wantErr(t, err, kernel.ErrNotFound, "bound addresses of deleted dummy")
	})

	t.Run("BindUnbind", func(t *testing.T) {
		l := newLinks(t)
		dev := ensureDummy(t, l)
		a4, b4, a6 := testAddr4(), testAddr4(), testAddr6()
		for _, a := range []netip.Addr{a4, b4, a6} {
			added, err := l.BindAddress(dev, a)
			must(t, err, "bind "+a.String())
			if !added {
				t.Errorf("first bind of %v reported added=false", a)
			}
			added, err = l.BindAddress(dev, a)
			must(t, err, "bind twice "+a.String())
			if added {
				t.Errorf("second bind of %v reported added=true", a)
			}
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

		must(t, l.UnbindAddress(dev, b4), "unbind")
		must(t, l.UnbindAddress(dev, b4), "unbind again")
		must(t, l.UnbindAddress(dev, testAddr4()), "unbind never-bound address")
		must(t, l.UnbindAddress(dev, a6), "unbind v6")
		wantBound(t, l, dev, []netip.Addr{a4})
	})

	t.Run("MissingDevice", func(t *testing.T) {
		l := newLinks(t)
		dev := uniqueName("vsptno")
		_, err := l.BindAddress(dev, testAddr4())
		wantErr(t, err, kernel.ErrNotFound, "bind to missing device")
		must(t, l.UnbindAddress(dev, testAddr4()), "unbind from missing device")
		_, err = l.BoundAddresses(dev)
		wantErr(t, err, kernel.ErrNotFound, "addresses of missing device")
	})

	t.Run("InvalidInput", func(t *testing.T) {
		l := newLinks(t)
		_, err := l.EnsureDummy("")
		wantErr(t, err, kernel.ErrInvalid, "empty name")
		_, err = l.EnsureDummy("name-longer-than-15")
		wantErr(t, err, kernel.ErrInvalid, "long name")
		dev := ensureDummy(t, l)
		_, err = l.BindAddress(dev, netip.Addr{})
		wantErr(t, err, kernel.ErrInvalid, "bind zero address")
		_, err = l.BindAddress(dev, testAddr6().WithZone("eth0"))
		wantErr(t, err, kernel.ErrInvalid, "bind zoned address")
		wantErr(t, l.UnbindAddress(dev, testAddr6().WithZone("eth0")), kernel.ErrInvalid, "unbind zoned address")
	})
}

func ensureDummy(t *testing.T, l kernel.Links) string {
	t.Helper()
	dev := uniqueName("vspt")
	_, err := l.EnsureDummy(dev)
	must(t, err, "ensure dummy "+dev)
	t.Cleanup(func() { _ = l.DeleteDummy(dev) })
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
