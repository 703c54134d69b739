//go:build vmbench

package vmbench

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/e2e/cluster"
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
	c, err := cluster.Start(ctx, cluster.Options{
		Nodes: 1,
		Pods:  [][]string{{"pod-a", "pod-b"}},
		StreamHooks: stream.Hooks{OnAck: func(ev stream.AckEvent) {
			select {
			case acks <- ev:
			default: // never block a stream; a lost event fails the wait below
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
	defer func() { _ = c.Stop() }()
	rep := EndToEnd{Time: time.Now().UTC().Format(time.RFC3339), LoadAvg: loadavg()}

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
	rep.MedianMS, rep.P90MS = msOf(quantileOf(lat, 0.5)), msOf(quantileOf(lat, 0.9))
	rep.MinMS, rep.MaxMS = msOf(slices.Min(lat)), msOf(slices.Max(lat))
	rep.ApplyMS, rep.TriggerMS = msOf(quantileOf(apply, 0.5)), msOf(quantileOf(trig, 0.5))
	t.Logf("one-endpoint change, EndpointSlice write answered -> node Ack: median %.1f ms, p90 %.1f ms, min %.1f, max %.1f; agent apply median %.2f ms; watch event -> Ack median %.1f ms",
		rep.MedianMS, rep.P90MS, rep.MinMS, rep.MaxMS, rep.ApplyMS, rep.TriggerMS)
	root, err := vm.FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "_out", "vmbench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "e2e.json"), append(js, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

func quantileOf(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	idx := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(idx, len(s)-1))]
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
