package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
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
// flushed IPVS table, one virtual server deleted, one changed, a destroyed
// set, a flushed set and a deleted entry are each found by the probe and
// repaired by the full pass it runs, one pass per drift.
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

	// One virtual server deleted (ipvsadm -D), then one changed (ipvsadm
	// -E: another scheduler).
	if err := deleteVS(k, keyA); err != nil {
		t.Fatal(err)
	}
	awaitProbe(t, r, "deleted virtual server re-added", func() bool {
		_, err := k.IPVS.GetVirtualServer(keyA)
		return err == nil && r.probe.hits == 2
	})
	vs, err := k.IPVS.GetVirtualServer(keyA)
	if err != nil {
		t.Fatal(err)
	}
	programmed := vs
	vs.Scheduler = "wrr"
	if errs := k.IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.UpdateVirtualServer, Server: vs}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	awaitProbe(t, r, "changed virtual server restored", func() bool {
		cur, err := k.IPVS.GetVirtualServer(keyA)
		return err == nil && cur == programmed && r.probe.hits == 3
	})

	// A set nothing references (empty: no rule matches it) is destroyed.
	name := rules.SetNodePortTCP.Name(kernel.FamilyIPv4)
	if err := k.IPSets.(*memory.IPSets).DestroySet(name); err != nil {
		t.Fatal(err)
	}
	awaitProbe(t, r, "destroyed set re-created", func() bool { return r.probe.hits == 4 })
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
	awaitProbe(t, r, "flushed set refilled", func() bool { return r.probe.hits == 5 })
	if got, err := k.IPSets.ListEntries(cip); err != nil || len(got) != len(want) {
		t.Errorf("%s holds %d entries (%v) after the probe's pass, want %d", cip, len(got), err, len(want))
	}
	set := kernel.IPSet{Name: cip, Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
	if errs := k.IPSets.ApplyEntries([]kernel.EntryOp{{Kind: kernel.DelEntry, Set: set, Entry: want[0]}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	awaitProbe(t, r, "deleted entry re-added", func() bool { return r.probe.hits == 6 })
	if got, err := k.IPSets.ListEntries(cip); err != nil || len(got) != len(want) {
		t.Errorf("%s holds %d entries (%v) after the probe's pass, want %d", cip, len(got), err, len(want))
	}
	if n := r.Stats().FullReconciles - before; n != 6 {
		t.Errorf("%d full reconciles after six drifts, want 6", n)
	}
}

// TestDriftProbeQuietWhenNothingDrifts: probes run no full pass while the
// kernel is as the last pass left it, even when that is wrong: a set of
// another type under a managed name, which the pass reports but does not
// replace (its error leaves the sets unknown, so the probe skips them
// until a clean pass). Nor does a virtual server that is not the agent's
// (another address), nor a Delta deleting every Service.
func TestDriftProbeQuietWhenNothingDrifts(t *testing.T) {
	mk := memory.New()
	name := rules.SetNodePortTCP.Name(kernel.FamilyIPv4)
	r := probeRun(t, mk, func() {
		// Another type under a managed name, before the agent's first pass.
		if err := mk.Kernel().IPSets.CreateSet(kernel.IPSet{Name: name, Type: kernel.HashIP, Family: kernel.FamilyIPv4}); err != nil {
			t.Fatal(err)
		}
	})
	foreign := kernel.VirtualServer{Key: kernel.AddrKey(netip.MustParseAddr("198.18.200.1"), kernel.ProtocolTCP, 80), Scheduler: "rr"}
	if errs := mk.Kernel().IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.AddVirtualServer, Server: foreign}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	r.mu.Lock()
	before, runs := r.stats.FullReconciles, r.probe.runs
	r.mu.Unlock()
	awaitProbe(t, r, "five probes", func() bool { return r.probe.runs >= runs+5 })
	// Delete every Service: their virtual servers are no longer wanted.
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

// TestDriftProbeSkipsFailedResources: a virtual server whose add failed
// (the Delta was NACKed; retries run on their own backoff) is missing from
// the kernel while wanted; the probe must not run a full pass for it at
// every interval.
func TestDriftProbeSkipsFailedResources(t *testing.T) {
	mk := memory.New()
	r := probeRun(t, mk, nil)
	mk.SetFault(func(op string) error {
		if op == "ipvs.AddVirtualServer" {
			return fmt.Errorf("injected: %w", kernel.ErrUnsupported)
		}
		return nil
	})
	t.Cleanup(func() { mk.SetFault(nil) })
	svcC := tcp("c", "198.18.0.12", 443, be("198.19.1.7", 8443))
	if ack := apply(t, r, delta("c", svcC.resource())); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("want NACK, got %v", ack.GetStatus())
	}
	r.mu.Lock()
	runs := r.probe.runs
	r.mu.Unlock()
	awaitProbe(t, r, "five probes", func() bool { return r.probe.runs >= runs+5 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probe.hits != 0 {
		t.Errorf("probes found drift %d times in the failed resource's missing server; want none", r.probe.hits)
	}
}

// listCountingIPVS counts ListVirtualServers calls and passes the digest
// through.
type listCountingIPVS struct {
	kernel.IPVS
	lists int
}

func (c *listCountingIPVS) ListVirtualServers() ([]kernel.VirtualServer, error) {
	c.lists++
	return c.IPVS.ListVirtualServers()
}

func (c *listCountingIPVS) DigestVirtualServers() (uint64, error) {
	return c.IPVS.(kernel.VirtualServerDigester).DigestVirtualServers()
}

// TestDriftProbeListsOnlyWhenTheDigestMoves: a probe lists and compares the
// virtual servers once after the agent wrote; while their digest stays
// that of the listing it found right, the next probes only read the
// digest; a server edited by hand moves it, and that probe lists and finds
// the drift. The agent's own writes (a full pass, a Delta) list again.
func TestDriftProbeListsOnlyWhenTheDigestMoves(t *testing.T) {
	mk := memory.New()
	k := mk.Kernel()
	counting := &listCountingIPVS{IPVS: k.IPVS}
	k.IPVS = counting
	r, err := New(k, Config{Period: time.Hour, ProbeInterval: time.Hour}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	probe := func(wantLists int, wantDrift string) {
		t.Helper()
		counting.lists = 0
		if got := r.probeDrift(); !strings.Contains(got, wantDrift) || (wantDrift == "") != (got == "") {
			t.Fatalf("probe found %q, want %q", got, wantDrift)
		}
		if counting.lists != wantLists {
			t.Fatalf("probe listed the virtual servers %d times, want %d", counting.lists, wantLists)
		}
	}
	probe(1, "") // first after the agent's writes: lists, finds them right
	probe(0, "") // digest unchanged: no listing
	probe(0, "")

	keyA := kernel.AddrKey(netip.MustParseAddr(svcA.vip), kernel.ProtocolTCP, uint16(svcA.port))
	vs, err := mk.Kernel().IPVS.GetVirtualServer(keyA)
	if err != nil {
		t.Fatal(err)
	}
	vs.Scheduler = "wrr" // ipvsadm -E, behind the agent's back
	if errs := mk.Kernel().IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.UpdateVirtualServer, Server: vs}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	probe(1, "was changed")
	probe(1, "was changed") // nothing recorded from a drifted listing

	r.Reconcile(context.Background()) // the full pass the probe would run: repairs it
	probe(1, "")
	probe(0, "")
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "b-gone", Removed: []string{svcB.resource().GetName()}}))
	probe(1, "")
	probe(0, "")
}
