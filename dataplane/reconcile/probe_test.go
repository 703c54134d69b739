package reconcile

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
)

// probeRun starts Run with the period an hour away and a 10 ms probe.
func probeRun(t *testing.T, mk *memory.Kernel, setup func()) *Reconciler {
	t.Helper()
	r := newReconciler(t, mk, Config{Period: time.Hour, ProbeInterval: 10 * time.Millisecond})
	if setup != nil {
		setup()
	}
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// awaitProbe waits until cond holds (checked under the lock), 10 s at most.
func awaitProbe(t *testing.T, r *Reconciler, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestDriftProbeRepairsBeforePeriod: with the period an hour away, a
// flushed IPVS table, a destroyed set, a flushed set and a deleted entry
// are each found by the probe and repaired by the full pass it runs, one
// pass per drift.
func TestDriftProbeRepairsBeforePeriod(t *testing.T) {
	mk := memory.New()
	k := mk.Kernel()
	r := probeRun(t, mk, nil)
	keyA := kernel.AddrKey(netip.MustParseAddr(svcA.vip), kernel.ProtocolTCP, uint16(svcA.port))

	before := r.Stats().FullReconciles
	list, err := k.IPVS.ListVirtualServers()
	if err != nil || len(list) == 0 {
		t.Fatalf("list: %d servers, %v", len(list), err)
	}
	for _, vs := range list { // ipvsadm -C
		if err := deleteVS(k, vs.Key); err != nil {
			t.Fatal(err)
		}
	}
	awaitProbe(t, r, "flushed IPVS table repaired", func() bool {
		_, err := k.IPVS.GetVirtualServer(keyA)
		return err == nil && r.probe.hits == 1
	})
	if n := r.Stats().FullReconciles - before; n != 1 {
		t.Errorf("%d full reconciles after one flush, want 1", n)
	}

	// A set nothing references (empty: no rule matches it) is destroyed.
	name := rules.SetNodePortTCP.Name(kernel.FamilyIPv4)
	if err := k.IPSets.(*memory.IPSets).DestroySet(name); err != nil {
		t.Fatal(err)
	}
	awaitProbe(t, r, "destroyed set re-created", func() bool { return r.probe.hits == 2 })
	sets, err := k.IPSets.ListSets()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range sets {
		found = found || s.Name == name
	}
	if !found {
		t.Errorf("%s not re-created by the pass the probe ran", name)
	}

	// ipset flush KUBE-CLUSTER-IP, then one entry deleted by hand: the
	// headers' entry counts differ from what the agent wrote.
	cip := rules.SetClusterIP.Name(kernel.FamilyIPv4)
	want, err := k.IPSets.ListEntries(cip)
	if err != nil || len(want) < 2 {
		t.Fatalf("%s holds %d entries (%v), want 2 or more", cip, len(want), err)
	}
	if err := k.IPSets.(*memory.IPSets).FlushSet(cip); err != nil {
		t.Fatal(err)
	}
	awaitProbe(t, r, "flushed set refilled", func() bool { return r.probe.hits == 3 })
	if got, err := k.IPSets.ListEntries(cip); err != nil || len(got) != len(want) {
		t.Errorf("%s holds %d entries (%v) after the probe's pass, want %d", cip, len(got), err, len(want))
	}
	set := kernel.IPSet{Name: cip, Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
	if errs := k.IPSets.ApplyEntries([]kernel.EntryOp{{Kind: kernel.DelEntry, Set: set, Entry: want[0]}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	awaitProbe(t, r, "deleted entry re-added", func() bool { return r.probe.hits == 4 })
	if got, err := k.IPSets.ListEntries(cip); err != nil || len(got) != len(want) {
		t.Errorf("%s holds %d entries (%v) after the probe's pass, want %d", cip, len(got), err, len(want))
	}
	if n := r.Stats().FullReconciles - before; n != 4 {
		t.Errorf("%d full reconciles after four drifts, want 4", n)
	}
}

// TestDriftProbeQuietWhenNothingDrifts: probes run no full pass while the
// kernel is as the last pass left it, even when that is wrong: a set of
// another type under a managed name, which the pass reports but does not
// replace (its error leaves the sets unknown, so the probe skips them
// until a clean pass). Nor does a Delta deleting the sentinel's Service.
func TestDriftProbeQuietWhenNothingDrifts(t *testing.T) {
	mk := memory.New()
	name := rules.SetNodePortTCP.Name(kernel.FamilyIPv4)
	r := probeRun(t, mk, func() {
		// Another type under a managed name, before the agent's first pass.
		if err := mk.Kernel().IPSets.CreateSet(kernel.IPSet{Name: name, Type: kernel.HashIP, Family: kernel.FamilyIPv4}); err != nil {
			t.Fatal(err)
		}
	})
	r.mu.Lock()
	sentinel, before := r.probe.sentinel, r.stats.FullReconciles
	runs := r.probe.runs
	r.mu.Unlock()
	if sentinel == (kernel.VirtualServerKey{}) {
		t.Fatal("no sentinel chosen by the first full pass")
	}
	awaitProbe(t, r, "five probes", func() bool { return r.probe.runs >= runs+5 })
	// Delete every Service: the sentinel is no longer wanted, and gone.
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()))))
	r.mu.Lock()
	runs = r.probe.runs
	r.mu.Unlock()
	awaitProbe(t, r, "five more probes", func() bool { return r.probe.runs >= runs+5 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probe.hits != 0 || r.stats.FullReconciles != before {
		t.Errorf("probes found drift %d times and ran %d full passes; want none", r.probe.hits, r.stats.FullReconciles-before)
	}
}
