package protocol_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vsplane/vsplane/controlplane/stream/streamtest"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
)

// A real agent logs its cold start once, as the first Delta is applied:
// every step in the order it was reached, each its own share, adding up to
// the time since the process started (here: a given second ago).
func TestAgentLogsItsColdStart(t *testing.T) {
	src := streamtest.New()
	src.SetResource("n1", serviceResource(1), time.Time{})
	cp := startCP(t, src, "127.0.0.1:0")
	core, logs := observer.New(zapcore.InfoLevel)
	mem := memory.New()
	k := mem.Kernel()
	ctx, cancel := context.WithCancel(context.Background())
	started := time.Now().Add(-time.Second)
	a, err := agent.New(ctx, agent.Config{ControlPlane: []string{cp.addr}, NodeName: "n1", Kernel: &k, ProcessStart: started,
		Reconcile: reconcile.Config{Period: time.Hour}, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, func() bool { return logs.FilterMessage("cold start").Len() > 0 })

	// A reconnect and its first Delta log nothing more.
	cp.srv.Shutdown()
	cp.gs.Stop(time.Second)
	src.SetResource("n1", serviceResource(2), time.Time{})
	cp2 := startCP(t, src, cp.addr)
	waitFor(t, func() bool {
		info, ok := cp2.srv.Registry().Agent("n1")
		return ok && info.GetPendingResources() == 0 && info.GetLastAck() != nil
	})
	entries := logs.FilterMessage("cold start").All()
	if len(entries) != 1 {
		t.Fatalf("%d cold start lines, want 1", len(entries))
	}
	var steps []string
	var sum, total time.Duration
	for _, f := range entries[0].Context {
		if f.Type != zapcore.DurationType {
			continue
		}
		d := time.Duration(f.Integer)
		if d < 0 {
			t.Errorf("step %s took %v", f.Key, d)
		}
		if f.Key == "total" {
			total = d
			continue
		}
		steps = append(steps, f.Key)
		sum += d
	}
	want := []string{"startup", "kernel", "wiring", "connected", "handshake", "hello_sent", "first_response", "first_delta_applied"}
	if !slices.Equal(steps, want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	if total != sum || total < time.Second {
		t.Fatalf("total %v, steps add up to %v; the process started 1 s before New", total, sum)
	}
}
