package protocol_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/controlplane/stream/streamtest"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func serviceResource(i int) *vsplanev1.Resource {
	return &vsplanev1.Resource{Name: fmt.Sprintf("service/default/s%d", i), Version: "v1",
		Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{Namespace: "default", Name: fmt.Sprintf("s%d", i),
			VirtualServers: []*vsplanev1.VirtualServer{{
				Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: fmt.Sprintf("198.18.0.%d", 10+i),
				Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
				Binding:     vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS,
				RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.1", Port: 8080, Weight: 1, Ready: true, Serving: true}},
			}}}}}
}

// A real agent that reconnects to a control plane whose first Delta would
// remove 8 of its 10 Services holds it: the kernel keeps all 10 virtual
// servers, the control plane sees AgentStatus.held_removal (GetNodeStatus
// shows it), and the agent applies the removal once it is confirmed.
func TestAgentHoldsMassRemovalAndReportsIt(t *testing.T) {
	full := streamtest.New()
	for i := range 10 {
		full.SetResource("n1", serviceResource(i), time.Time{})
	}
	c1 := startCP(t, full, "127.0.0.1:0")
	mem := memory.New()
	k := mem.Kernel()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := agent.New(ctx, agent.Config{ControlPlane: []string{c1.addr}, NodeName: "n1", Kernel: &k,
		Reconcile: reconcile.Config{Period: time.Hour}, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		RemovalConfirmation: 4 * time.Second, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	virtualServers := func() int { vss, _ := k.IPVS.ListVirtualServers(); return len(vss) }
	// The whole first Delta is applied and acknowledged (not just its
	// virtual servers: iptables comes after them) before counting writes.
	waitFor(t, func() bool {
		info, ok := c1.srv.Registry().Agent("n1")
		return ok && info.GetLastAck() != nil && info.GetPendingResources() == 0
	})
	if n := virtualServers(); n != 10 {
		t.Fatalf("%d virtual servers after the first Delta, want 10", n)
	}

	// The replica is replaced by one that (wrongly) knows only 2 Services.
	c1.srv.Shutdown()
	c1.gs.Stop(time.Second)
	partial := streamtest.New()
	for i := range 2 {
		partial.SetResource("n1", serviceResource(i), time.Time{})
	}
	mem.ResetCalls()
	c2 := startCP(t, partial, c1.addr)
	waitFor(t, func() bool { return c2.srv.Registry().LastStatus("n1").GetHeldRemoval() != nil })
	h := c2.srv.Registry().LastStatus("n1").GetHeldRemoval()
	if h.GetRemovals() != 8 || h.GetHeldServices() != 10 || h.GetTarget() != c1.addr {
		t.Fatalf("held removal %v, want 8 of 10 from %s", h, c1.addr)
	}
	if n := virtualServers(); n != 10 || len(mem.Calls()) != 0 {
		t.Fatalf("while holding: %d virtual servers, kernel calls %v; want 10 and none", n, mem.Calls())
	}
	// The control plane says the same after the confirmation period: real.
	waitFor(t, func() bool { return virtualServers() == 2 })
	waitFor(t, func() bool {
		st := c2.srv.Registry().LastStatus("n1")
		return st != nil && st.GetHeldRemoval() == nil
	})
}
