//go:build vmbench

package vmbench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm"
)

// EndToEnd is _out/vmbench/e2e.json: one-endpoint changes measured from
// the EndpointSlice write's response (host clock) to the control plane
// receiving the node's Ack (the agent wrote the kernel before it acks).
type EndToEnd struct {
	Time      string  `json:"time"`
	LoadAvg   string  `json:"host_loadavg_before"`
	Changes   int     `json:"changes"`
	MedianMS  float64 `json:"write_to_ack_median_ms"`
	P90MS     float64 `json:"write_to_ack_p90_ms"`
	MinMS     float64 `json:"write_to_ack_min_ms"`
	MaxMS     float64 `json:"write_to_ack_max_ms"`
	ApplyMS   float64 `json:"agent_apply_median_ms"`
	TriggerMS float64 `json:"watch_event_to_ack_median_ms"`
}

// TestVMBenchEndToEnd: apiserver and control plane on the host, one agent
// in the VM, a ClusterIP Service whose slice alternates between one and two
// endpoints. The agent's own apply time is the floor; the rest is the
// watch, the control plane and the two trips through QEMU's user network.
func TestVMBenchEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const svcName = "service/default/web"
	acks := make(chan stream.AckEvent, 1024)
	c := startBenchCluster(t, ctx, acks)
	rep := EndToEnd{Time: time.Now().UTC().Format(time.RFC3339), LoadAvg: measure.LoadAvgLine()}

	ports := []cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	if _, err := c.CreateService(ctx, "default", "web", ports, nil); err != nil {
		t.Fatal(err)
	}
	var eps []cluster.Endpoint
	for _, p := range []string{"pod-a", "pod-b"} {
		ep, err := c.PodEndpoint(p, false)
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
	}
	write := func(n int) time.Time {
		if err := c.ApplySlice(ctx, "default", "web", "web-1", discoveryv1.AddressTypeIPv4, ports, eps[:n]); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	write(1)
	if err := c.AwaitAcked(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	// awaitAck returns the first Ack after since that carried the Service.
	awaitAck := func(since time.Time) stream.AckEvent {
		timeout := time.NewTimer(time.Minute)
		defer timeout.Stop()
		for {
			select {
			case ev := <-acks:
				if _, ok := ev.TriggerTimes[svcName]; ok && ev.ReceivedAt.After(since) {
					if ev.Status.String() != "ACK_STATUS_ACK" {
						t.Fatalf("change NACKed: %v", ev.Errors)
					}
					return ev
				}
			case <-timeout.C:
				t.Fatal("no Ack carrying the Service within a minute")
			}
		}
	}
	for len(acks) > 0 {
		<-acks
	}
	const changes = 40
	var lat, apply, trig []time.Duration
	for i := range changes {
		before := time.Now()
		answered := write(2 - i%2) // 2, 1, 2, 1, ... after 1: one endpoint added or removed
		ev := awaitAck(before)
		lat = append(lat, ev.ReceivedAt.Sub(answered))
		apply = append(apply, ev.ApplyDuration)
		trig = append(trig, ev.ReceivedAt.Sub(ev.TriggerTimes[svcName]))
	}
	// changes is even, so the last state is one endpoint; one more write
	// makes it two, and the kernel must show both.
	before := time.Now()
	write(2)
	awaitAck(before)
	out, err := c.IPVS(ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range eps {
		if !strings.Contains(out, ep.IP+":8080") {
			t.Fatalf("node1 IPVS lacks %s after the changes:\n%s", ep.IP, out)
		}
	}
	rep.Changes = changes
	rep.MedianMS, rep.P90MS = msOf(Quantile(lat, 0.5)), msOf(Quantile(lat, 0.9))
	rep.MinMS, rep.MaxMS = msOf(slices.Min(lat)), msOf(slices.Max(lat))
	rep.ApplyMS, rep.TriggerMS = msOf(Quantile(apply, 0.5)), msOf(Quantile(trig, 0.5))
	t.Logf("one-endpoint change, EndpointSlice write answered -> node Ack: median %.1f ms, p90 %.1f ms, min %.1f, max %.1f; agent apply median %.2f ms; watch event -> Ack median %.1f ms",
		rep.MedianMS, rep.P90MS, rep.MinMS, rep.MaxMS, rep.ApplyMS, rep.TriggerMS)
	writeJSON(t, "e2e.json", rep)
}

// startBenchCluster starts one node with pods pod-a and pod-b; every Ack
// the in-process replica receives goes to acks (dropped if it is full).
func startBenchCluster(t *testing.T, ctx context.Context, acks chan<- stream.AckEvent) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Start(ctx, cluster.Options{
		Nodes: 1,
		Pods:  [][]string{{"pod-a", "pod-b"}},
		StreamHooks: stream.Hooks{OnAck: func(ev stream.AckEvent) {
			select {
			case acks <- ev:
			default: // never block a stream; a lost event fails the wait
			}
		}},
		Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	if err != nil {
		if errors.Is(err, vm.ErrDepsMissing) {
			t.Fatalf("the VM test bed cannot run here (run bash scripts/vm/deps.sh): %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// writeJSON stores v as _out/vmbench/name.
func writeJSON(t *testing.T, name string, v any) {
	t.Helper()
	root, err := measure.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := measure.WriteJSON(filepath.Join(root, "_out", "vmbench"), name, v); err != nil {
		t.Fatal(err)
	}
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Burst is _out/vmbench/burst-e2e.json: N ClusterIP Services with one
// EndpointSlice of E endpoints each, created through the apiserver (QPS
// 200, 8 writers) while one agent in the VM follows.
type Burst struct {
	Time      string  `json:"time"`
	LoadAvg   string  `json:"host_loadavg_before"`
	Services  int     `json:"services"`
	Endpoints int     `json:"endpoints"`
	CreateS   float64 `json:"create_seconds"`
	// ConvergedAfterLastS: last create answered -> every real server in
	// the node's IPVS (polled every 500 ms).
	ConvergedAfterLastS float64 `json:"converged_after_last_create_seconds"`
	// Latency of each Service's last acknowledged version: its watch event
	// -> the Ack of the Delta that carried it.
	P50MS  float64 `json:"latency_p50_ms"`
	P99MS  float64 `json:"latency_p99_ms"`
	MaxMS  float64 `json:"latency_max_ms"`
	Deltas int     `json:"deltas"`
	// MaxDeltaResources is the largest Delta's resource count.
	MaxDeltaResources int `json:"max_delta_resources"`
}

// TestVMBenchBurstEndToEnd creates VSPLANE_VMBENCH_BURST (default 2000x10)
// Services and slices through the apiserver and measures what the node
// sees: per-Service programming latency and convergence.
func TestVMBenchBurstEndToEnd(t *testing.T) {
	n, e := burstSize(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	acks := make(chan stream.AckEvent, 1<<16)
	c := startBenchCluster(t, ctx, acks)
	rep := Burst{Time: time.Now().UTC().Format(time.RFC3339), LoadAvg: measure.LoadAvgLine(), Services: n, Endpoints: e}
	if err := c.AwaitAcked(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	const ns = "default"
	create := func(i int) error {
		name := fmt.Sprintf("burst-%d", i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromInt32(cluster.ServePort)}}}}
		if _, err := c.Kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return err
		}
		var eps []cluster.Endpoint
		for j := range e {
			// Addresses in the benchmarking range: IPVS does not reach them.
			eps = append(eps, cluster.Endpoint{IP: fmt.Sprintf("198.19.%d.%d", 100+j, i%250+1)})
		}
		return c.ApplySlice(ctx, ns, name, name+"-1", discoveryv1.AddressTypeIPv4,
			[]cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}, eps)
	}
	start := time.Now()
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := create(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		select {
		case work <- i:
		case err := <-errs:
			t.Fatal(err)
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	lastCreate := time.Now()
	rep.CreateS = lastCreate.Sub(start).Seconds()

	err := cluster.Await(ctx, 10*time.Minute, 500*time.Millisecond, func(ctx context.Context) error {
		out, err := c.IPVS(ctx, "node1")
		if err != nil {
			return err
		}
		// The burst's real servers are the only ones in 198.19.1xx.0/24
		// (node1's pods are 198.19.1.x).
		if got := strings.Count(out, "-> 198.19.1") - strings.Count(out, "-> 198.19.1."); got < n*e {
			return fmt.Errorf("%d of %d burst real servers programmed", got, n*e)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rep.ConvergedAfterLastS = time.Since(lastCreate).Seconds()
	// Every Ack so far: the latest acknowledged version of each burst Service.
	latest := map[string]time.Duration{}
	for len(acks) > 0 {
		ev := <-acks
		rep.Deltas++
		rep.MaxDeltaResources = max(rep.MaxDeltaResources, ev.Resources)
		for name, trig := range ev.TriggerTimes {
			if strings.HasPrefix(name, "service/default/burst-") {
				latest[name] = ev.ReceivedAt.Sub(trig)
			}
		}
	}
	if len(latest) != n {
		t.Fatalf("Acks named %d of %d burst Services", len(latest), n)
	}
	lat := slices.Collect(maps.Values(latest))
	rep.P50MS, rep.P99MS, rep.MaxMS = msOf(Quantile(lat, 0.5)), msOf(Quantile(lat, 0.99)), msOf(slices.Max(lat))
	t.Logf("burst %dx%d: created in %.1f s; converged %.1f s after the last create; per-Service latency p50 %.0f ms p99 %.0f ms max %.0f ms; %d Deltas, largest %d resources",
		n, e, rep.CreateS, rep.ConvergedAfterLastS, rep.P50MS, rep.P99MS, rep.MaxMS, rep.Deltas, rep.MaxDeltaResources)
	writeJSON(t, "burst-e2e.json", rep)
}
