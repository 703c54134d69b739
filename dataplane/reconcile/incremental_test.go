package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// readCounter wraps a kernel.Kernel and counts the whole-table reads the
// memory kernel's Calls() does not see (it counts only mutations).
type readCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *readCounter) inc(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[op]++
}

func (c *readCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = map[string]int{}
}

func (c *readCounter) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for op, n := range c.n {
		out[op] = n
	}
	return out
}

type countIPVS struct {
	kernel.IPVS
	c *readCounter
}

func (w countIPVS) ListVirtualServers() ([]kernel.VirtualServer, error) {
	w.c.inc("ipvs.ListVirtualServers")
	return w.IPVS.ListVirtualServers()
}

func (w countIPVS) ListDestinations(key kernel.VirtualServerKey) ([]kernel.Destination, error) {
	w.c.inc("ipvs.ListDestinations")
	return w.IPVS.ListDestinations(key)
}

type countIPSets struct {
	kernel.IPSets
	c *readCounter
}

func (w countIPSets) ListSets() ([]kernel.IPSet, error) {
	w.c.inc("ipset.ListSets")
	return w.IPSets.ListSets()
}

func (w countIPSets) ListEntries(name string) ([]kernel.Entry, error) {
	w.c.inc("ipset.ListEntries")
	return w.IPSets.ListEntries(name)
}

type countLinks struct {
	kernel.Links
	c *readCounter
}

func (w countLinks) BoundAddresses(dev string) ([]netip.Addr, error) {
	w.c.inc("link.BoundAddresses")
	return w.Links.BoundAddresses(dev)
}

func (w countLinks) LocalAddresses() ([]kernel.InterfaceAddress, error) {
	w.c.inc("link.LocalAddresses")
	return w.Links.LocalAddresses()
}

type countIPTables struct {
	kernel.IPTables
	c *readCounter
}

func (w countIPTables) Save(ctx context.Context, f kernel.Family, t kernel.Table) ([]byte, error) {
	w.c.inc("iptables.Save")
	return w.IPTables.Save(ctx, f, t)
}

func countingKernel(mk *memory.Kernel) (kernel.Kernel, *readCounter) {
	c := &readCounter{n: map[string]int{}}
	k := mk.Kernel()
	return kernel.Kernel{
		IPVS:     countIPVS{k.IPVS, c},
		IPSets:   countIPSets{k.IPSets, c},
		Links:    countLinks{k.Links, c},
		IPTables: countIPTables{k.IPTables, c},
		Sysctl:   k.Sysctl,
	}, c
}

// An incremental apply must cost O(what changed): no whole-table reads
// (virtual servers, bound addresses, sets, set entries, iptables-save);
// only the destinations of the one touched virtual server are listed.
func TestIncrementalApplyListsNothing(t *testing.T) {
	mk := memory.New()
	k, c := countingKernel(mk)
	r, err := New(k, Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mustAck(t, r.Apply(ctx, full(svcA.resource(), svcB.resource(), settingsRes(defaultNodeSettings()))))
	if n := c.counts(); n["ipvs.ListVirtualServers"] == 0 || n["link.BoundAddresses"] == 0 {
		t.Fatalf("first apply should compare everything, read %v", n)
	}

	c.reset()
	mk.ResetCalls()
	changed := tcp("a", "198.18.0.10", 80, be("198.19.1.2", 8080), be("198.19.2.9", 8080))
	ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "e", Resources: []*vsplanev1.Resource{changed.resource()}})
	mustAck(t, ack)
	if d := cmp.Diff(map[string]int{"ipvs.ListDestinations": 1}, c.counts()); d != "" {
		t.Fatalf("reads of a one-endpoint apply (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{"ipvs.AddDestination": 1, "ipvs.DeleteDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}

	// Adding and removing a Service binds/unbinds its address and edits
	// set entries, still without listing anything but its own destinations.
	c.reset()
	svcC := tcp("c", "198.18.0.12", 443, be("198.19.1.7", 8443))
	mustAck(t, r.Apply(ctx, &vsplanev1.Delta{Nonce: "add", Resources: []*vsplanev1.Resource{svcC.resource()}}))
	mustAck(t, r.Apply(ctx, &vsplanev1.Delta{Nonce: "rm", Removed: []string{"service/default/c"}}))
	if n := c.counts(); len(n) != 0 {
		t.Fatalf("add+remove of a Service listed %v", n)
	}
	wantState(t, mk, kernelState{
		Services: map[string][]string{
			"tcp/198.18.0.10:80 rr": {"198.19.1.2:8080 w1", "198.19.2.9:8080 w1"},
			"udp/198.18.0.11:53 rr": {"198.19.1.5:5353 w1"},
		},
		Bound: []string{"198.18.0.10", "198.18.0.11"},
		Sets: map[string][]string{
			"KUBE-CLUSTER-IP": {"198.18.0.10,tcp:80", "198.18.0.11,udp:53"},
			"KUBE-IPVS-IPS":   {"198.18.0.10", "198.18.0.11"},
		},
	})
}

func newCounted(t *testing.T) (*memory.Kernel, *readCounter, *Reconciler) {
	t.Helper()
	mk := memory.New()
	k, c := countingKernel(mk)
	r, err := New(k, Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	mustAck(t, r.Apply(context.Background(), full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	c.reset()
	return mk, c, r
}

// Incremental passes trust the record: outside drift on an item they do
// not change is left to the full pass, which repairs it.
func TestIncrementalTrustsRecordFullPassRepairs(t *testing.T) {
	mk, c, r := newCounted(t)
	ctx := context.Background()
	k := mk.Kernel()
	if err := unbindAddr(k, kernel.DummyDevice, netip.MustParseAddr("198.18.0.10")); err != nil {
		t.Fatal(err)
	}
	if err := delEntry(k, kernel.IPSet{Name: "KUBE-CLUSTER-IP", Type: kernel.HashIPPort, Family: kernel.FamilyIPv4},
		kernel.Entry{IP: netip.MustParseAddr("198.18.0.10"), Protocol: kernel.ProtocolTCP, Port: 80}); err != nil {
		t.Fatal(err)
	}
	// A second port on the same address: its VS is new, the address and
	// KUBE-IPVS-IPS entry were already programmed (per the record).
	second := tcp("a2", "198.18.0.10", 443, be("198.19.1.2", 8443))
	mk.ResetCalls()
	mustAck(t, r.Apply(ctx, &vsplanev1.Delta{Nonce: "a2", Resources: []*vsplanev1.Resource{second.resource()}}))
	if n := c.counts(); len(n) != 0 {
		t.Fatalf("incremental apply listed %v", n)
	}
	if d := cmp.Diff(map[string]int{"ipvs.AddVirtualServer": 1, "ipvs.AddDestination": 1, "ipset.AddEntry": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}
	mk.ResetCalls()
	r.Reconcile(ctx)
	if d := cmp.Diff(map[string]int{"link.BindAddress": 1, "ipset.AddEntry": 1}, writes(mk)); d != "" {
		t.Fatalf("full pass repairs (-want +got):\n%s", d)
	}
	st := readState(t, mk)
	if d := cmp.Diff([]string{"198.18.0.10", "198.18.0.11"}, st.Bound); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.0.10,tcp:443", "198.18.0.10,tcp:80", "198.18.0.11,udp:53"}, st.Sets["KUBE-CLUSTER-IP"]); d != "" {
		t.Errorf("KUBE-CLUSTER-IP (-want +got):\n%s", d)
	}
}

// kube-ipvs0 deleted behind the record's back: the bind recreates it.
func TestIncrementalRecreatesDeletedDummy(t *testing.T) {
	mk, c, r := newCounted(t)
	if err := deleteDummy(mk.Kernel(), kernel.DummyDevice); err != nil {
		t.Fatal(err)
	}
	svcC := tcp("c", "198.18.0.12", 443, be("198.19.1.7", 8443))
	ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "c", Resources: []*vsplanev1.Resource{svcC.resource()}})
	mustAck(t, ack)
	if n := c.counts(); len(n) != 0 {
		t.Fatalf("incremental apply listed %v", n)
	}
	if got := ack.GetKernelOperations()[wire.OpCreateDummy]; got != 1 {
		t.Errorf("dummy_create = %d, want 1 (ops %v)", got, ack.GetKernelOperations())
	}
	if d := cmp.Diff([]string{"198.18.0.12"}, readState(t, mk).Bound); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
}

// A pass with a kernel error forgets the record: the next incremental
// pass lists again instead of trusting what may be half-written.
func TestKernelErrorForgetsRecord(t *testing.T) {
	mk, c, r := newCounted(t)
	ctx := context.Background()
	boom := fmt.Errorf("injected: %w", kernel.ErrBusy)
	mk.SetFault(func(op string) error {
		if op == "ipset.AddEntry" {
			return boom
		}
		return nil
	})
	svcC := tcp("c", "198.18.0.12", 443, be("198.19.1.7", 8443))
	if ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "c", Resources: []*vsplanev1.Resource{svcC.resource()}}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("want NACK, got %v", ack.GetStatus())
	}
	mk.SetFault(nil)
	c.reset()
	svcD := tcp("d", "198.18.0.13", 443, be("198.19.1.8", 8443))
	mustAck(t, r.Apply(ctx, &vsplanev1.Delta{Nonce: "d", Resources: []*vsplanev1.Resource{svcD.resource()}}))
	if n := c.counts(); n["link.BoundAddresses"] != 1 || n["ipset.ListSets"] != 1 || n["ipset.ListEntries"] == 0 {
		t.Errorf("after an error the next pass should list again, read %v", n)
	}
	// Once listed, the record is trusted again.
	c.reset()
	svcE := tcp("e", "198.18.0.14", 443, be("198.19.1.9", 8443))
	mustAck(t, r.Apply(ctx, &vsplanev1.Delta{Nonce: "e", Resources: []*vsplanev1.Resource{svcE.resource()}}))
	if n := c.counts(); len(n) != 0 {
		t.Errorf("incremental apply listed %v", n)
	}
}
