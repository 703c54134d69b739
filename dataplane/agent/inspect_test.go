package agent

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// inspectService is a ClusterIP Service resource with one TCP virtual
// server 198.18.0.10:80 and the given backends on port 8080.
func inspectService(version string, backends ...string) *vsplanev1.Resource {
	vs := &vsplanev1.VirtualServer{
		Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: "198.18.0.10",
		Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
		Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS,
	}
	for _, b := range backends {
		vs.RealServers = append(vs.RealServers, &vsplanev1.RealServer{Address: b, Port: 8080, Weight: 1, Ready: true})
	}
	return &vsplanev1.Resource{Name: "service/default/web", Version: version,
		Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
			Namespace: "default", Name: "web", VirtualServers: []*vsplanev1.VirtualServer{vs}}}}
}

// inspectSummary renders a GetKernelState response as key -> status (real
// servers as "vs -> address", addresses as "addr a").
func inspectSummary(resp *vsplanev1.GetKernelStateResponse) map[string]string {
	out := map[string]string{}
	for _, vs := range resp.GetVirtualServers() {
		out[vs.GetKey()] = vs.GetStatus().String()
		for _, rs := range vs.GetRealServers() {
			v := rs.GetStatus().String()
			if rs.GetDraining() {
				v += " draining"
			}
			out[vs.GetKey()+" -> "+rs.GetAddress()] = v
		}
	}
	for _, a := range resp.GetAddresses() {
		out["addr "+a.GetAddress()] = a.GetStatus().String()
	}
	return out
}

// TestInspectListener checks the wiring: Config.InspectListener serves
// AgentInspectService over this agent's reconciler and kernel until Run
// ends. What a Delta applied to the agent programmed is reported as in sync
// (so the endpoint reads the same kernel the reconciler wrote), and a real
// server drained by the agent shows up in ListDrains.
func TestInspectListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mk := memory.New()
	k := mk.Kernel()
	ctx, cancel := context.WithCancel(context.Background())
	// No control plane listens there: the client keeps retrying, which is
	// fine; inspection works without a stream. No periodic reconcile runs
	// during the test.
	a, err := New(ctx, Config{ControlPlane: []string{"127.0.0.1:1"}, NodeName: "node1", Kernel: &k,
		Reconcile: reconcile.Config{Period: time.Hour}, InspectListener: ln, Logger: zaptest.NewLogger(t)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := vsplanev1.NewAgentInspectServiceClient(conn)
	resp, err := c.GetKernelState(ctx, &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetVirtualServers()) != 0 || resp.GetDifferences() != 0 || len(resp.GetReadErrors()) != 0 {
		t.Fatalf("empty agent: %v", resp)
	}

	settings := &vsplanev1.Resource{Name: reconcile.SettingsResource, Version: "s1",
		Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{DefaultScheduler: "rr",
			ClusterCidrs: []string{"198.19.0.0/16"}}}}
	ack := a.Reconciler.Apply(ctx, &vsplanev1.Delta{Nonce: "1", ReplaceAll: true,
		Resources: []*vsplanev1.Resource{settings, inspectService("v1", "198.19.1.2", "198.19.2.3")}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	resp, err = c.GetKernelState(ctx, &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"tcp/198.18.0.10:80":               "ITEM_STATUS_IN_SYNC",
		"tcp/198.18.0.10:80 -> 198.19.1.2": "ITEM_STATUS_IN_SYNC",
		"tcp/198.18.0.10:80 -> 198.19.2.3": "ITEM_STATUS_IN_SYNC",
		"addr 198.18.0.10":                 "ITEM_STATUS_IN_SYNC",
	}
	if d := cmp.Diff(want, inspectSummary(resp)); d != "" {
		t.Fatalf("kernel state after the Delta (-want +got):\n%s", d)
	}
	if resp.GetDifferences() != 0 || len(resp.GetReadErrors()) != 0 {
		t.Fatalf("differences %d, read errors %v", resp.GetDifferences(), resp.GetReadErrors())
	}
	if vs := resp.GetVirtualServers()[0]; vs.GetKernel().GetScheduler() != "rr" ||
		!cmp.Equal(vs.GetResources(), []string{"service/default/web"}) {
		t.Fatalf("virtual server detail: %v", vs)
	}
	if got := resp.GetVersions()["service/default/web"]; got != "v1" {
		t.Fatalf("applied version of service/default/web = %q, want v1 (versions %v)", got, resp.GetVersions())
	}

	// 198.19.2.3 leaves while it has connections: the agent drains it.
	vsKey := kernel.AddrKey(netip.MustParseAddr("198.18.0.10"), kernel.ProtocolTCP, 80)
	if err := mk.SetConnections(vsKey, kernel.DestinationKey{Address: netip.MustParseAddr("198.19.2.3"), Port: 8080}, 1, 2); err != nil {
		t.Fatal(err)
	}
	ack = a.Reconciler.Apply(ctx, &vsplanev1.Delta{Nonce: "2",
		Resources: []*vsplanev1.Resource{inspectService("v2", "198.19.1.2")}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	drains, err := c.ListDrains(ctx, &vsplanev1.ListDrainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(drains.GetDraining()) != 1 {
		t.Fatalf("draining = %v, want one real server", drains.GetDraining())
	}
	if d := drains.GetDraining()[0]; d.GetVirtualServer() != "tcp/198.18.0.10:80" || d.GetAddress() != "198.19.2.3" ||
		d.GetPort() != 8080 || d.GetActiveConnections() != 1 || d.GetInactiveConnections() != 2 {
		t.Fatalf("drain: %v", d)
	}
	resp, err = c.GetKernelState(ctx, &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := inspectSummary(resp)["tcp/198.18.0.10:80 -> 198.19.2.3"]; got != "ITEM_STATUS_EXTRA_IN_KERNEL draining" {
		t.Fatalf("drained real server: %q, want extra in kernel and draining", got)
	}
}
