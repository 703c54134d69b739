package reconcile

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// gatedKernel blocks the n-th call of one read (ListDestinations,
// DumpDestinations or ListEntries) until released, so a test can act while a full pass is
// reading the kernel.
type gatedKernel struct {
	mu      sync.Mutex
	read    string // "ListDestinations" or "ListEntries"
	n, seen int
	reached chan struct{}
	release chan struct{}
}

func (g *gatedKernel) gate(read string) {
	g.mu.Lock()
	hit := read == g.read && g.seen < g.n
	if hit {
		g.seen++
		hit = g.seen == g.n
	}
	g.mu.Unlock()
	if hit {
		close(g.reached)
		<-g.release
	}
}

type gatedIPVS struct {
	kernel.IPVS
	g *gatedKernel
}

func (v gatedIPVS) ListDestinations(key kernel.VirtualServerKey) ([]kernel.Destination, error) {
	v.g.gate("ListDestinations")
	return v.IPVS.ListDestinations(key)
}

// gatedDumpIPVS adds the one-read dump (kernel.DestinationDumper) that
// gatedIPVS hides.
type gatedDumpIPVS struct{ gatedIPVS }

func (v gatedDumpIPVS) DumpDestinations() (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	v.g.gate("DumpDestinations")
	return v.IPVS.(kernel.DestinationDumper).DumpDestinations()
}

type gatedIPSets struct {
	kernel.IPSets
	g *gatedKernel
}

func (s gatedIPSets) ListEntries(name string) ([]kernel.Entry, error) {
	s.g.gate("ListEntries")
	return s.IPSets.ListEntries(name)
}

// TestFullReconcileReadsWithoutHoldingDeltas: a Delta that arrives while
// the periodic full pass reads the kernel is applied at once, not after the
// pass (at 10k Services the read takes seconds on a slow node), and the
// pass, which then compares a read partly older than that Delta, neither
// reverts it nor writes anything: what the Delta wrote is read again.
func TestFullReconcileReadsWithoutHoldingDeltas(t *testing.T) {
	for _, tc := range []struct {
		name string
		read string
		n    int
	}{
		// At the last set: after the IPVS table, the addresses and the
		// other sets' entries were read.
		{"during the ipset read", "ListEntries", len(rules.AllSets())},
		// Some servers' real servers read before the Delta, some after
		// (a kernel without the one-read dump).
		{"during the IPVS read", "ListDestinations", 3},
		// Every server's real servers read before the Delta, at once.
		{"during the IPVS dump", "DumpDestinations", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := memory.New()
			g := &gatedKernel{read: tc.read, n: tc.n, reached: make(chan struct{}), release: make(chan struct{})}
			k := mk.Kernel()
			k.IPVS, k.IPSets = gatedIPVS{k.IPVS, g}, gatedIPSets{k.IPSets, g}
			if tc.read == "DumpDestinations" {
				k.IPVS = gatedDumpIPVS{gatedIPVS{mk.Kernel().IPVS, g}}
			}
			r, err := New(k, Config{}, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			keep := tcp("keep", "198.18.0.10", 80, be("198.19.1.2", 8080))
			changed := tcp("changed", "198.18.0.11", 80, be("198.19.1.3", 8080), be("198.19.1.4", 8080))
			gone := tcp("gone", "198.18.0.12", 80, be("198.19.1.5", 8080))
			mustAck(t, apply(t, r, full(keep.resource(), changed.resource(), gone.resource())))

			done := make(chan struct{})
			go func() {
				defer close(done)
				r.Reconcile(context.Background())
			}()
			select {
			case <-g.reached:
			case <-time.After(10 * time.Second):
				t.Fatal("the full pass never reached the gated read")
			}
			// The pass is blocked in its read: the Delta must not wait for it.
			// It replaces a real server, adds a Service and removes one.
			changed.backends = []backend{be("198.19.1.3", 8080), be("198.19.1.9", 8080)}
			added := tcp("added", "198.18.0.13", 80, be("198.19.1.6", 8080))
			acked := make(chan *vsplanev1.Ack, 1)
			go func() {
				acked <- r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "during",
					Resources: []*vsplanev1.Resource{changed.resource(), added.resource()},
					Removed:   []string{"service/default/gone"}})
			}()
			select {
			case ack := <-acked:
				mustAck(t, ack)
			case <-time.After(10 * time.Second):
				close(g.release)
				t.Fatal("a Delta waited for the full pass's kernel read")
			}
			mk.ResetCalls()
			close(g.release)
			<-done

			if w := writes(mk); len(w) != 0 {
				t.Errorf("the full pass wrote %v: it compared what the Delta changed with the older read", w)
			}
			if s := r.Stats(); s.DriftRepaired != 0 || s.FullReconciles != 1 || len(s.KernelErrors) != 0 {
				t.Errorf("stats: %d repaired, %d full reconciles, errors %v; want 0, 1, none", s.DriftRepaired, s.FullReconciles, s.KernelErrors)
			}
			if f := r.Failed(); len(f) != 0 {
				t.Errorf("failed resources %v", f)
			}
			want := memory.New()
			mustAck(t, apply(t, newReconciler(t, want, Config{}), full(keep.resource(), changed.resource(), added.resource())))
			wantState(t, mk, readState(t, want))
		})
	}
}

// countDumpIPVS is countIPVS with the one-read dump of every destination.
type countDumpIPVS struct{ countIPVS }

func (w countDumpIPVS) DumpDestinations() (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	w.c.inc("ipvs.DumpDestinations")
	return w.IPVS.(kernel.DestinationDumper).DumpDestinations()
}

// TestFullReconcileDumpsDestinationsOnce: where the kernel can dump every
// destination in one read, a periodic full pass of a clean kernel reads
// them that way, not per virtual server (2,000 round trips at 1k Services
// were most of a quiet agent's CPU, #27), and still repairs a destination
// changed behind its back.
func TestFullReconcileDumpsDestinationsOnce(t *testing.T) {
	mk := memory.New()
	k, c := countingKernel(mk)
	k.IPVS = countDumpIPVS{k.IPVS.(countIPVS)}
	r, err := New(k, Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mustAck(t, r.Apply(ctx, full(svcA.resource(), svcB.resource(), settingsRes(defaultNodeSettings()))))

	c.reset()
	mk.ResetCalls()
	r.Reconcile(ctx)
	n := c.counts()
	if n["ipvs.DumpDestinations"] != 1 || n["ipvs.ListDestinations"] != 0 {
		t.Errorf("a clean full pass read destinations %d times at once and %d times per server; want 1 and 0 (reads %v)",
			n["ipvs.DumpDestinations"], n["ipvs.ListDestinations"], n)
	}
	if w := writes(mk); len(w) != 0 {
		t.Errorf("a clean full pass wrote %v", w)
	}

	// Drift the dump must show: a real server's weight set to 0 by hand.
	key := kernel.AddrKey(netip.MustParseAddr("198.18.0.10"), kernel.ProtocolTCP, 80)
	ds, err := mk.Kernel().IPVS.ListDestinations(key)
	if err != nil || len(ds) == 0 {
		t.Fatalf("destinations of %v: %v, %v", key, ds, err)
	}
	drifted := ds[0]
	drifted.Weight = 0
	if errs := mk.Kernel().IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.UpdateDestination, Server: kernel.VirtualServer{Key: key}, Destination: drifted}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	mk.ResetCalls()
	r.Reconcile(ctx)
	if d := cmp.Diff(map[string]int{"ipvs.UpdateDestination": 1}, writes(mk)); d != "" {
		t.Errorf("repair of a drifted weight (-want +got):\n%s", d)
	}
	if got, _ := mk.Kernel().IPVS.ListDestinations(key); got[0].Weight != ds[0].Weight {
		t.Errorf("weight after repair %d, want %d", got[0].Weight, ds[0].Weight)
	}
}

// partialDumpIPVS dumps every destination but those of hide, the way
// Linux's /proc/net/ip_vs can skip servers (kernel/linux/ipvs_proc.go).
type partialDumpIPVS struct {
	countDumpIPVS
	hide kernel.VirtualServerKey
}

func (w partialDumpIPVS) DumpDestinations() (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	m, err := w.countDumpIPVS.DumpDestinations()
	delete(m, w.hide)
	return m, err
}

// TestFullReconcileReadsWhatTheDumpMissed: a server the dump left out is
// read by itself, and drift in it is repaired like anywhere else.
func TestFullReconcileReadsWhatTheDumpMissed(t *testing.T) {
	mk := memory.New()
	k, c := countingKernel(mk)
	hidden := kernel.AddrKey(netip.MustParseAddr("198.18.0.10"), kernel.ProtocolTCP, 80)
	k.IPVS = partialDumpIPVS{countDumpIPVS{k.IPVS.(countIPVS)}, hidden}
	r, err := New(k, Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mustAck(t, r.Apply(ctx, full(svcA.resource(), svcB.resource(), settingsRes(defaultNodeSettings()))))

	ds, err := mk.Kernel().IPVS.ListDestinations(hidden)
	if err != nil || len(ds) == 0 {
		t.Fatalf("destinations of %v: %v, %v", hidden, ds, err)
	}
	if errs := mk.Kernel().IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.DeleteDestination, Server: kernel.VirtualServer{Key: hidden}, Destination: ds[0]}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	c.reset()
	mk.ResetCalls()
	r.Reconcile(ctx)
	if n := c.counts(); n["ipvs.DumpDestinations"] != 1 || n["ipvs.ListDestinations"] != 1 {
		t.Errorf("reads %v: want one dump and one read of the server it missed", n)
	}
	if d := cmp.Diff(map[string]int{"ipvs.AddDestination": 1}, writes(mk)); d != "" {
		t.Errorf("repair of a real server deleted from the missed server (-want +got):\n%s", d)
	}
}
