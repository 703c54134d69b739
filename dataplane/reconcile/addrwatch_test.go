package reconcile

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

// TestRemovedAddressRepairedAtOnce: with the period an hour away, a Service
// address someone removes from kube-ipvs0 is bound again by a full
// reconcile the removal triggers; the removal of an address nobody wants
// (the agent's own unbind, someone else's address) triggers none, and
// neither does one before the first Delta (fail-static).
func TestRemovedAddressRepairedAtOnce(t *testing.T) {
	mk := memory.New()
	k := mk.Kernel()
	r := newReconciler(t, mk, Config{Period: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := k.Links.(kernel.AddressWatcher).WatchRemovedAddresses(ctx, r.AddressRemoved); err != nil {
		t.Fatal(err)
	}

	// Before the first Delta: noted, nothing scheduled.
	r.AddressRemoved(netip.MustParseAddr(svcA.vip))
	r.takeRemovals()
	if !r.full.soon.IsZero() {
		t.Fatalf("a removal before the first Delta scheduled a full reconcile at %v", r.full.soon)
	}

	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	// An address nobody wants, and the agent's own unbind of svcB's: no
	// full reconcile.
	for _, a := range []string{"198.18.7.7", svcB.vip} {
		r.AddressRemoved(netip.MustParseAddr(a))
	}
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource())))
	r.takeRemovals()
	if !r.full.soon.IsZero() {
		t.Fatalf("removals of unwanted addresses scheduled a full reconcile at %v", r.full.soon)
	}

	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	before := r.Stats().FullReconciles
	vip := netip.MustParseAddr(svcA.vip)
	if err := unbindAddr(k, kernel.DummyDevice, vip); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		bound, err := k.Links.BoundAddresses(kernel.DummyDevice)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(bound, vip) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v not bound again within 10 s of its removal (bound: %v)", vip, bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := r.Stats().FullReconciles - before; n != 1 {
		t.Errorf("%d full reconciles repaired one removal, want 1", n)
	}
	if got := r.Stats().DriftRepaired; got == 0 {
		t.Errorf("the repair was not counted as drift")
	}
}
