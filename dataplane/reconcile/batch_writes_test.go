package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// batchSets records every ApplyEntries batch; failAdd is an entry whose
// add fails.
type batchSets struct {
	kernel.IPSets
	batches [][]kernel.EntryOp
	failAdd kernel.Entry
}

func (b *batchSets) ApplyEntries(ops []kernel.EntryOp) []error {
	b.batches = append(b.batches, append([]kernel.EntryOp(nil), ops...))
	errs := make([]error, len(ops))
	for i, op := range ops {
		if op.Kind == kernel.AddEntry && op.Entry == b.failAdd {
			errs[i] = fmt.Errorf("netlink: simulated ENOMEM")
			continue
		}
		errs[i] = b.IPSets.ApplyEntries([]kernel.EntryOp{op})[0]
	}
	return errs
}

// batchLinks does the same for ApplyAddresses; failBind is an address
// whose bind fails.
type batchLinks struct {
	kernel.Links
	batches  [][]kernel.AddressOp
	failBind netip.Addr
}

func (b *batchLinks) ApplyAddresses(dev string, ops []kernel.AddressOp) []error {
	b.batches = append(b.batches, append([]kernel.AddressOp(nil), ops...))
	errs := make([]error, len(ops))
	for i, op := range ops {
		if op.Kind == kernel.BindAddress && op.Addr == b.failBind {
			errs[i] = fmt.Errorf("netlink: simulated ENOMEM")
			continue
		}
		errs[i] = b.Links.ApplyAddresses(dev, []kernel.AddressOp{op})[0]
	}
	return errs
}

func newBatchedWrites(t *testing.T) (*memory.Kernel, *batchSets, *batchLinks, *Reconciler) {
	t.Helper()
	mk := memory.New()
	k := mk.Kernel()
	sets, links := &batchSets{IPSets: k.IPSets}, &batchLinks{Links: k.Links}
	k.IPSets, k.Links = sets, links
	r, err := New(k, Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	mustAck(t, r.Apply(context.Background(), full(settingsRes(defaultNodeSettings()), svcA.resource())))
	sets.batches, links.batches = nil, nil
	return mk, sets, links, r
}

func burstServices(n int) []*vsplanev1.Resource {
	var res []*vsplanev1.Resource
	for i := range n {
		s := tcp(fmt.Sprintf("burst%d", i), fmt.Sprintf("198.18.1.%d", i+1), 80, be(fmt.Sprintf("198.19.3.%d", i+1), 8080))
		res = append(res, s.resource())
	}
	return res
}

// A burst of new Services binds its addresses in one ApplyAddresses batch
// and writes its ipset entries (KUBE-CLUSTER-IP and the KUBE-IPVS-IPS
// entries that follow the binds) in one ApplyEntries batch: no single
// calls. A deletion burst goes the same way.
func TestEntriesAndAddressesAreBatched(t *testing.T) {
	mk, sets, links, r := newBatchedWrites(t)
	ctx := context.Background()
	ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "burst", Resources: burstServices(100)})
	mustAck(t, ack)
	if len(links.batches) != 1 || len(links.batches[0]) != 100 {
		t.Fatalf("addresses: %d batches (first of %d), want 1 batch of 100 binds",
			len(links.batches), len(links.batches[0]))
	}
	if len(sets.batches) != 1 || len(sets.batches[0]) != 200 {
		t.Fatalf("entries: %d batches, want 1 batch of 200 adds", len(sets.batches))
	}
	perSet := map[string]int{}
	for _, op := range sets.batches[0] {
		if op.Kind != kernel.AddEntry {
			t.Fatalf("unexpected %v in %+v", op.Kind, op)
		}
		perSet[op.Set.Name]++
	}
	if d := cmp.Diff(map[string]int{"KUBE-CLUSTER-IP": 100, "KUBE-IPVS-IPS": 100}, perSet); d != "" {
		t.Errorf("entries per set (-want +got):\n%s", d)
	}
	if got := ack.GetKernelOperations(); got[wire.OpBind] != 100 || got[wire.OpAddEntry] != 200 {
		t.Errorf("Ack counts %d binds and %d entry adds, want 100 and 200 (ops %v)", got[wire.OpBind], got[wire.OpAddEntry], got)
	}
	st := readState(t, mk)
	if len(st.Bound) != 101 || len(st.Sets["KUBE-IPVS-IPS"]) != 101 || len(st.Sets["KUBE-CLUSTER-IP"]) != 101 {
		t.Errorf("kernel: %d bound, %d KUBE-IPVS-IPS, %d KUBE-CLUSTER-IP; want 101 each",
			len(st.Bound), len(st.Sets["KUBE-IPVS-IPS"]), len(st.Sets["KUBE-CLUSTER-IP"]))
	}

	sets.batches, links.batches = nil, nil
	var gone []string
	for i := range 100 {
		gone = append(gone, fmt.Sprintf("service/default/burst%d", i))
	}
	mustAck(t, r.Apply(ctx, &vsplanev1.Delta{Nonce: "gone", Removed: gone}))
	if len(links.batches) != 1 || len(links.batches[0]) != 100 || len(sets.batches) != 1 || len(sets.batches[0]) != 200 {
		t.Fatalf("removal: %d address batches, %d entry batches; want one batch each (100, 200)",
			len(links.batches), len(sets.batches))
	}
	st = readState(t, mk)
	if d := cmp.Diff([]string{"198.18.0.10"}, st.Bound); d != "" {
		t.Errorf("bound after the removal (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string][]string{"KUBE-CLUSTER-IP": {"198.18.0.10,tcp:80"}, "KUBE-IPVS-IPS": {"198.18.0.10"}}, st.Sets); d != "" {
		t.Errorf("sets after the removal (-want +got):\n%s", d)
	}
}

// A failing entry or bind in a batch NACKs only the Service owning it;
// everything else in the batch applies. A failed bind leaves the address
// out of KUBE-IPVS-IPS (the entry follows the bind), and the retry heals
// both once the kernel stops failing.
func TestBatchedWriteFailureNamesOnlyItsOwner(t *testing.T) {
	mk, sets, links, r := newBatchedWrites(t)
	ctx := context.Background()
	entryBad := tcp("entrybad", "198.18.2.1", 80, be("198.19.5.1", 8080))
	bindBad := tcp("bindbad", "198.18.2.2", 80, be("198.19.5.2", 8080))
	good := tcp("good", "198.18.2.3", 80, be("198.19.5.3", 8080))
	sets.failAdd = kernel.Entry{IP: netip.MustParseAddr("198.18.2.1"), Protocol: kernel.ProtocolTCP, Port: 80}
	links.failBind = netip.MustParseAddr("198.18.2.2")
	ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "x", Resources: []*vsplanev1.Resource{entryBad.resource(), bindBad.resource(), good.resource()}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("want NACK, got %v", ack.GetStatus())
	}
	got := map[string]string{}
	for _, e := range ack.GetErrors() {
		got[e.GetName()] = e.GetMessage()
	}
	if len(got) != 2 {
		t.Fatalf("errors %v, want exactly entrybad and bindbad", got)
	}
	if m := got["service/default/entrybad"]; !strings.Contains(m, "ipset add KUBE-CLUSTER-IP 198.18.2.1,tcp:80") || !strings.Contains(m, "simulated ENOMEM") {
		t.Errorf("entrybad: %q, want the failed ipset add", m)
	}
	if m := got["service/default/bindbad"]; !strings.Contains(m, "bind 198.18.2.2 to kube-ipvs0") || !strings.Contains(m, "simulated ENOMEM") {
		t.Errorf("bindbad: %q, want the failed bind", m)
	}
	if len(links.batches) != 1 || len(sets.batches) != 1 {
		t.Errorf("%d address batches, %d entry batches; want one each", len(links.batches), len(sets.batches))
	}
	st := readState(t, mk)
	if d := cmp.Diff([]string{"198.18.0.10", "198.18.2.1", "198.18.2.3"}, st.Bound); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.0.10", "198.18.2.1", "198.18.2.3"}, st.Sets["KUBE-IPVS-IPS"]); d != "" {
		t.Errorf("KUBE-IPVS-IPS follows the binds that succeeded (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.0.10,tcp:80", "198.18.2.2,tcp:80", "198.18.2.3,tcp:80"}, st.Sets["KUBE-CLUSTER-IP"]); d != "" {
		t.Errorf("KUBE-CLUSTER-IP (-want +got):\n%s", d)
	}

	sets.failAdd, links.failBind = kernel.Entry{}, netip.Addr{}
	r.Reconcile(ctx)
	if f := r.Failed(); len(f) != 0 {
		t.Fatalf("after the retry still failed: %v", f)
	}
	st = readState(t, mk)
	if len(st.Bound) != 4 || len(st.Sets["KUBE-IPVS-IPS"]) != 4 || len(st.Sets["KUBE-CLUSTER-IP"]) != 4 {
		t.Errorf("after the retry: bound %v, KUBE-IPVS-IPS %v, KUBE-CLUSTER-IP %v; want all four Services'",
			st.Bound, st.Sets["KUBE-IPVS-IPS"], st.Sets["KUBE-CLUSTER-IP"])
	}
}

// kube-ipvs0 deleted behind the record's back while a burst binds: every
// bind of the batch finds it missing; it is created once and the binds go
// again as one more batch.
func TestBatchedBindsRecreateDeletedDummyOnce(t *testing.T) {
	mk, _, links, r := newBatchedWrites(t)
	if err := deleteDummy(mk.Kernel(), kernel.DummyDevice); err != nil {
		t.Fatal(err)
	}
	ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "burst", Resources: burstServices(10)})
	mustAck(t, ack)
	if got := ack.GetKernelOperations(); got[wire.OpCreateDummy] != 1 || got[wire.OpBind] != 10 {
		t.Errorf("ops %v: want dummy_create 1 and 10 binds", got)
	}
	if len(links.batches) != 2 || len(links.batches[0]) != 10 || len(links.batches[1]) != 10 {
		t.Errorf("%d address batches, want 2 of 10 (all missing the device, then all again)", len(links.batches))
	}
	st := readState(t, mk)
	if len(st.Bound) != 10 || len(st.Sets["KUBE-IPVS-IPS"]) != 11 {
		t.Errorf("bound %v, KUBE-IPVS-IPS %v: want the 10 new addresses bound and all 11 in the set", st.Bound, st.Sets["KUBE-IPVS-IPS"])
	}
}
