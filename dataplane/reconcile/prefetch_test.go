package reconcile

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// gatedKernel blocks the n-th call of one read (ListDestinations or
// ListEntries) until released, so a test can act while a full pass is
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
		// Some servers' real servers read before the Delta, some after.
		{"during the IPVS read", "ListDestinations", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := memory.New()
			g := &gatedKernel{read: tc.read, n: tc.n, reached: make(chan struct{}), release: make(chan struct{})}
			k := mk.Kernel()
			k.IPVS, k.IPSets = gatedIPVS{k.IPVS, g}, gatedIPSets{k.IPSets, g}
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
