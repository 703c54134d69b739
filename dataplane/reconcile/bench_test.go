package reconcile

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// benchServices builds n ClusterIP services in 198.18.0.0/16 with 3
// endpoints each.
func benchServices(n int) []*vsplanev1.Resource {
	out := make([]*vsplanev1.Resource, 0, n)
	for i := range n {
		vip := fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)
		s := tcp(fmt.Sprintf("s%d", i), vip, 80,
			be(fmt.Sprintf("198.19.1.%d", i%250+1), 8080),
			be(fmt.Sprintf("198.19.2.%d", i%250+1), 8080),
			be(fmt.Sprintf("198.19.3.%d", i%250+1), 8080))
		out = append(out, s.resource())
	}
	return out
}

func benchSetup(b *testing.B, n int) (*memory.Kernel, *Reconciler, []*vsplanev1.Resource) {
	b.Helper()
	mk := memory.New()
	r, err := New(mk.Kernel(), Config{}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	res := benchServices(n)
	if ack := r.Apply(context.Background(), full(res...)); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		b.Fatalf("setup: %v", ack.GetErrors())
	}
	return mk, r, res
}

// BenchmarkApplyOneEndpointChange: cost of one changed Service among n
// ClusterIP Services, which must not grow with n (flat between
// 1,000 and 10,000): only the touched items are synced, nothing is listed
// but the destinations of the one virtual server.
func BenchmarkApplyOneEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			_, r, _ := benchSetup(b, n)
			b.ReportAllocs()
			ctx := context.Background()
			variants := [2]*vsplanev1.Resource{
				tcp("s0", "198.18.0.1", 80, be("198.19.1.1", 8080)).resource(),
				tcp("s0", "198.18.0.1", 80, be("198.19.9.9", 8080)).resource(),
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "x", Resources: []*vsplanev1.Resource{variants[i%2]}})
				if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
					b.Fatal(ack.GetErrors())
				}
			}
		})
	}
}

// BenchmarkFullReconcileClean: a periodic pass over n services with no
// drift (reads only).
func BenchmarkFullReconcileClean(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			mk, r, _ := benchSetup(b, n)
			mk.ResetCalls()
			for b.Loop() {
				r.Reconcile(context.Background())
			}
			if w := writes(mk); len(w) != 0 {
				b.Fatalf("clean reconcile wrote %v", w)
			}
		})
	}
}

// BenchmarkApplyOneServiceAddRemove: add then remove one ClusterIP Service
// among n (binds/unbinds its address, adds/deletes its set entries); the
// reconciler must not list kube-ipvs0 or whole sets for it.
func BenchmarkApplyOneServiceAddRemove(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			_, r, _ := benchSetup(b, n)
			b.ReportAllocs()
			ctx := context.Background()
			add := &vsplanev1.Delta{Nonce: "add", Resources: []*vsplanev1.Resource{
				tcp("extra", "198.18.255.1", 80, be("198.19.1.1", 8080)).resource()}}
			rm := &vsplanev1.Delta{Nonce: "rm", Removed: []string{"service/default/extra"}}
			for b.Loop() {
				for _, d := range []*vsplanev1.Delta{add, rm} {
					if ack := r.Apply(ctx, d); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
						b.Fatal(ack.GetErrors())
					}
				}
			}
		})
	}
}

// BenchmarkColdStartInDeltas: a cold start of 1,000 Services (2 ports x 10
// endpoints, like bench-kubeproxy's) into an empty in-memory kernel, in
// Deltas of 160 Services as the control plane's budget splits it: the
// reconciler's own cost per kernel write (the in-memory kernel's writes
// are cheap), which with the kernel's batched writes makes the agent's
// cold start (#27 item 2).
func BenchmarkColdStartInDeltas(b *testing.B) {
	const services, perDelta = 1000, 160
	var res []*vsplanev1.Resource
	for i := range services {
		vip := fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)
		for _, port := range []uint32{80, 443} {
			var bes []backend
			for j := range 10 {
				bes = append(bes, be(fmt.Sprintf("198.19.%d.%d", 100+j, i%250+1), 8000+port))
			}
			res = append(res, tcp(fmt.Sprintf("s%d-%d", i, port), vip, port, bes...).resource())
		}
	}
	b.ReportAllocs()
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		mk := memory.New()
		r, err := New(mk.Kernel(), Config{}, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		first := true
		for start := 0; start < len(res); start += 2 * perDelta {
			chunk := res[start:min(start+2*perDelta, len(res))]
			d := &vsplanev1.Delta{Nonce: fmt.Sprint(start), Resources: chunk}
			if first {
				d.Resources = append([]*vsplanev1.Resource{settingsRes(defaultNodeSettings())}, chunk...)
				d.ReplaceAll, first = true, false
			}
			if ack := r.Apply(ctx, d); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
				b.Fatal(ack.GetErrors())
			}
		}
	}
}
