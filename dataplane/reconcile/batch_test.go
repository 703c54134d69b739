package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// batchIPVS records every Apply batch given to the wrapped IPVS.
type batchIPVS struct {
	kernel.IPVS
	mu      sync.Mutex
	batches [][]kernel.IPVSOp
}

func (b *batchIPVS) Apply(ops []kernel.IPVSOp) []error {
	b.mu.Lock()
	b.batches = append(b.batches, append([]kernel.IPVSOp(nil), ops...))
	b.mu.Unlock()
	return b.IPVS.Apply(ops)
}

func newBatched(t *testing.T) (*memory.Kernel, *batchIPVS, *Reconciler) {
	t.Helper()
	mk := memory.New()
	k := mk.Kernel()
	b := &batchIPVS{IPVS: k.IPVS}
	k.IPVS = b
	r, err := New(k, Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return mk, b, r
}

// A burst of new Services reaches IPVS as one batch per pass, servers
// before their destinations, with no single writes.
func TestIPVSWritesAreBatched(t *testing.T) {
	mk, b, r := newBatched(t)
	ctx := context.Background()
	mustAck(t, r.Apply(ctx, full(settingsRes(defaultNodeSettings()), svcA.resource())))
	b.batches = nil

	var res []*vsplanev1.Resource
	for i := range 100 {
		s := tcp(fmt.Sprintf("burst%d", i), fmt.Sprintf("198.18.1.%d", i+1), 80,
			be(fmt.Sprintf("198.19.3.%d", i+1), 8080), be(fmt.Sprintf("198.19.4.%d", i+1), 8080))
		res = append(res, s.resource())
	}
	ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "burst", Resources: res})
	mustAck(t, ack)
	if len(b.batches) != 1 {
		t.Fatalf("burst of 100 Services: %d batches, want 1", len(b.batches))
	}
	ops := b.batches[0]
	if len(ops) != 300 {
		t.Fatalf("batch has %d ops, want 300 (100 servers + 200 destinations)", len(ops))
	}
	added := map[kernel.VirtualServerKey]bool{}
	for i, op := range ops {
		switch op.Kind {
		case kernel.AddVirtualServer:
			added[op.Server.Key] = true
		case kernel.AddDestination:
			if !added[op.Server.Key] {
				t.Fatalf("op %d adds a destination of %v before its server", i, op.Server.Key)
			}
		default:
			t.Fatalf("op %d: unexpected %v", i, op.Kind)
		}
	}
	if n := ack.GetKernelOperations()[wire.OpAddDestination]; n != 200 {
		t.Errorf("Ack counts %d destination adds, want 200", n)
	}
	st := readState(t, mk)
	if got := len(st.Services); got != 101 {
		t.Errorf("kernel holds %d virtual servers, want 101", got)
	}
}

// A server whose add fails in a batch is reported once, with the kernel's
// error, to its Service only; the rest of the batch applies, and the
// destinations that could not follow it are not reported as errors of
// their own.
func TestBatchedAddFailureNamesOnlyItsService(t *testing.T) {
	mk, _, r := newBatched(t)
	ctx := context.Background()
	mustAck(t, r.Apply(ctx, full(settingsRes(defaultNodeSettings()))))
	bad := tcp("bad", "198.18.2.1", 80, be("198.19.5.1", 8080), be("198.19.5.2", 8080))
	good := tcp("good", "198.18.2.2", 80, be("198.19.5.3", 8080))
	badKey := kernel.AddrKey(netip.MustParseAddr("198.18.2.1"), kernel.ProtocolTCP, 80)
	fault := &failAdd{IPVS: mk.Kernel().IPVS, key: badKey}
	r.k.IPVS = fault
	ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "x", Resources: []*vsplanev1.Resource{bad.resource(), good.resource()}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("want NACK, got %v", ack.GetStatus())
	}
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetName() != "service/default/bad" {
		t.Fatalf("errors %v, want exactly one, for service/default/bad", ack.GetErrors())
	}
	msg := ack.GetErrors()[0].GetMessage()
	if !strings.Contains(msg, "simulated ENOMEM") || strings.Contains(msg, "destination") {
		t.Errorf("error %q: want the add failure only, no echo of its destinations", msg)
	}
	st := readState(t, mk)
	if got := st.Services["tcp/198.18.2.2:80 rr"]; len(got) != 1 {
		t.Errorf("good Service's server: %v, want its one destination (state %v)", got, st.Services)
	}
}

// failAdd fails the add of one virtual server.
type failAdd struct {
	kernel.IPVS
	key kernel.VirtualServerKey
}

func (f *failAdd) Apply(ops []kernel.IPVSOp) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		if op.Kind == kernel.AddVirtualServer && op.Server.Key.Normalize() == f.key {
			errs[i] = fmt.Errorf("netlink: simulated ENOMEM")
			continue
		}
		errs[i] = f.IPVS.Apply([]kernel.IPVSOp{op})[0]
	}
	return errs
}
