package inspect

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

var (
	vsA   = kernel.AddrKey(netip.MustParseAddr("198.18.0.10"), kernel.ProtocolTCP, 80)
	vsB   = kernel.AddrKey(netip.MustParseAddr("198.18.0.11"), kernel.ProtocolTCP, 443)
	rsA1  = kernel.DestinationKey{Address: netip.MustParseAddr("198.19.1.2"), Port: 8080}
	rsA2  = kernel.DestinationKey{Address: netip.MustParseAddr("198.19.2.3"), Port: 8080}
	extra = kernel.AddrKey(netip.MustParseAddr("198.18.0.99"), kernel.ProtocolUDP, 53)
)

// service builds a ClusterIP resource with one TCP virtual server.
func service(name, vip string, port uint32, backends ...string) *vsplanev1.Resource {
	vs := &vsplanev1.VirtualServer{
		Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: vip,
		Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Port: port, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
		Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS,
	}
	for _, b := range backends {
		vs.RealServers = append(vs.RealServers, &vsplanev1.RealServer{Address: b, Port: 8080, Weight: 1, Ready: true})
	}
	return &vsplanev1.Resource{Name: "service/default/" + name, Version: name + "-" + vip + "-" + string(rune('0'+len(backends))),
		Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
			Namespace: "default", Name: name, VirtualServers: []*vsplanev1.VirtualServer{vs}}}}
}

func settings() *vsplanev1.Resource {
	return &vsplanev1.Resource{Name: reconcile.SettingsResource, Version: "s1",
		Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{DefaultScheduler: "rr",
			ClusterCidrs: []string{"198.19.0.0/16"}}}}
}

// setup programs settings, service a (two backends) and b (one) into a
// memory kernel and returns a client of an inspection server over bufconn.
func setup(t *testing.T) (*memory.Kernel, *reconcile.Reconciler, vsplanev1.AgentInspectServiceClient) {
	t.Helper()
	mk := memory.New()
	r, err := reconcile.New(mk.Kernel(), reconcile.Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{
		settings(), service("a", "198.18.0.10", 80, "198.19.1.2", "198.19.2.3"), service("b", "198.18.0.11", 443, "198.19.1.4")}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	return mk, r, serve(t, r, mk)
}

func serve(t *testing.T, r *reconcile.Reconciler, mk *memory.Kernel) vsplanev1.AgentInspectServiceClient {
	t.Helper()
	k := mk.Kernel()
	s, err := New(r, Readers{IPVS: k.IPVS, Links: k.Links, IPSets: k.IPSets, IPTables: k.IPTables})
	if err != nil {
		t.Fatal(err)
	}
	ln := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, s, zaptest.NewLogger(t)) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return vsplanev1.NewAgentInspectServiceClient(conn)
}

// summary is a compact comparable view of a response.
func summary(resp *vsplanev1.GetKernelStateResponse) map[string]string {
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

func requireNoWrites(t *testing.T, mk *memory.Kernel) {
	t.Helper()
	if calls := mk.Calls(); len(calls) != 0 {
		t.Fatalf("inspection wrote to the kernel: %v", calls)
	}
}

func TestInSync(t *testing.T) {
	mk, _, c := setup(t)
	mk.ResetCalls()
	resp, err := c.GetKernelState(context.Background(), &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"tcp/198.18.0.10:80":                "ITEM_STATUS_IN_SYNC",
		"tcp/198.18.0.10:80 -> 198.19.1.2":  "ITEM_STATUS_IN_SYNC",
		"tcp/198.18.0.10:80 -> 198.19.2.3":  "ITEM_STATUS_IN_SYNC",
		"tcp/198.18.0.11:443":               "ITEM_STATUS_IN_SYNC",
		"tcp/198.18.0.11:443 -> 198.19.1.4": "ITEM_STATUS_IN_SYNC",
		"addr 198.18.0.10":                  "ITEM_STATUS_IN_SYNC",
		"addr 198.18.0.11":                  "ITEM_STATUS_IN_SYNC",
	}
	if d := cmp.Diff(want, summary(resp)); d != "" {
		t.Fatalf("statuses (-want +got):\n%s", d)
	}
	if resp.GetDifferences() != 0 || len(resp.GetReadErrors()) != 0 {
		t.Fatalf("differences %d, read errors %v", resp.GetDifferences(), resp.GetReadErrors())
	}
	if got := resp.GetVersions()["service/default/a"]; got == "" {
		t.Fatalf("versions lack service/default/a: %v", resp.GetVersions())
	}
	vs := resp.GetVirtualServers()[0]
	if vs.GetKernel().GetScheduler() != "rr" || vs.GetDesired().GetScheduler() != "rr" ||
		vs.GetAddress() != "198.18.0.10" || vs.GetProtocol() != "tcp" || vs.GetPort() != 80 ||
		!cmp.Equal(vs.GetResources(), []string{"service/default/a"}) {
		t.Fatalf("virtual server detail: %v", vs)
	}
	requireNoWrites(t, mk)
}

// TestDifferences changes the kernel behind the reconciler's back and checks
// every kind of difference is reported, without a single kernel write.
func TestDifferences(t *testing.T) {
	mk, _, c := setup(t)
	k := mk.Kernel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ipvs := func(op kernel.IPVSOp) error { return k.IPVS.Apply([]kernel.IPVSOp{op})[0] }
	addrs := func(op kernel.AddressOp) error {
		return k.Links.ApplyAddresses(kernel.DummyDevice, []kernel.AddressOp{op})[0]
	}
	must(ipvs(kernel.IPVSOp{Kind: kernel.DeleteDestination, Server: kernel.VirtualServer{Key: vsA},
		Destination: kernel.Destination{Address: rsA1.Address, Port: rsA1.Port}})) // missing real server
	must(ipvs(kernel.IPVSOp{Kind: kernel.UpdateDestination, Server: kernel.VirtualServer{Key: vsA},
		Destination: kernel.Destination{Address: rsA2.Address, Port: 8080, Weight: 7}})) // differs
	must(ipvs(kernel.IPVSOp{Kind: kernel.UpdateVirtualServer, Server: kernel.VirtualServer{Key: vsB, Scheduler: "wrr"}})) // differs
	must(ipvs(kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: kernel.VirtualServer{Key: extra, Scheduler: "rr"}}))   // extra
	must(addrs(kernel.AddressOp{Kind: kernel.UnbindAddress, Addr: netip.MustParseAddr("198.18.0.11")}))                   // missing address
	must(addrs(kernel.AddressOp{Kind: kernel.BindAddress, Addr: netip.MustParseAddr("198.18.0.77")}))                     // extra address
	must(mk.SetConnections(vsA, rsA2, 3, 4))
	if len(mk.Calls()) == 0 {
		t.Fatal("the write counter did not count the test's own writes; requireNoWrites would prove nothing")
	}
	mk.ResetCalls()

	resp, err := c.GetKernelState(context.Background(), &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"tcp/198.18.0.10:80":                "ITEM_STATUS_DIFFERS",
		"tcp/198.18.0.10:80 -> 198.19.1.2":  "ITEM_STATUS_MISSING_IN_KERNEL",
		"tcp/198.18.0.10:80 -> 198.19.2.3":  "ITEM_STATUS_DIFFERS",
		"tcp/198.18.0.11:443":               "ITEM_STATUS_DIFFERS",
		"tcp/198.18.0.11:443 -> 198.19.1.4": "ITEM_STATUS_IN_SYNC",
		"udp/198.18.0.99:53":                "ITEM_STATUS_EXTRA_IN_KERNEL",
		"addr 198.18.0.10":                  "ITEM_STATUS_IN_SYNC",
		"addr 198.18.0.11":                  "ITEM_STATUS_MISSING_IN_KERNEL",
		"addr 198.18.0.77":                  "ITEM_STATUS_EXTRA_IN_KERNEL",
	}
	if d := cmp.Diff(want, summary(resp)); d != "" {
		t.Fatalf("statuses (-want +got):\n%s", d)
	}
	// 3 virtual servers + 2 real servers + 2 addresses.
	if resp.GetDifferences() != 7 {
		t.Fatalf("differences = %d, want 7", resp.GetDifferences())
	}
	rs := resp.GetVirtualServers()[0].GetRealServers()[1]
	if rs.GetKernelWeight() != 7 || rs.GetDesiredWeight() != 1 || rs.GetActiveConnections() != 3 || rs.GetInactiveConnections() != 4 {
		t.Fatalf("real server detail: %v", rs)
	}
	if missing := resp.GetVirtualServers()[0].GetRealServers()[0]; missing.GetKernelWeight() != -1 {
		t.Fatalf("missing real server kernel_weight = %d, want -1", missing.GetKernelWeight())
	}
	if vb := resp.GetVirtualServers()[1]; vb.GetKernel().GetScheduler() != "wrr" || vb.GetDesired().GetScheduler() != "rr" {
		t.Fatalf("scheduler difference not shown: %v", vb)
	}
	if _, err := c.ListDrains(context.Background(), &vsplanev1.ListDrainsRequest{}); err != nil {
		t.Fatal(err)
	}
	requireNoWrites(t, mk)
}

func TestDrains(t *testing.T) {
	mk, r, c := setup(t)
	if err := mk.SetConnections(vsA, rsA2, 1, 2); err != nil {
		t.Fatal(err)
	}
	// rsA2 leaves the desired state while it has connections: it drains.
	ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "2",
		Resources: []*vsplanev1.Resource{service("a", "198.18.0.10", 80, "198.19.1.2")}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	mk.ResetCalls()

	drains, err := c.ListDrains(context.Background(), &vsplanev1.ListDrainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(drains.GetDraining()) != 1 {
		t.Fatalf("draining = %v, want one", drains.GetDraining())
	}
	d := drains.GetDraining()[0]
	if d.GetVirtualServer() != "tcp/198.18.0.10:80" || d.GetAddress() != "198.19.2.3" || d.GetPort() != 8080 ||
		d.GetActiveConnections() != 1 || d.GetInactiveConnections() != 2 || d.GetSince() == nil {
		t.Fatalf("drain: %v", d)
	}
	resp, err := c.GetKernelState(context.Background(), &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(resp)["tcp/198.18.0.10:80 -> 198.19.2.3"]; got != "ITEM_STATUS_EXTRA_IN_KERNEL draining" {
		t.Fatalf("draining real server status = %q", got)
	}
	// A drain is expected, not a difference.
	if resp.GetDifferences() != 0 || summary(resp)["tcp/198.18.0.10:80"] != "ITEM_STATUS_IN_SYNC" {
		t.Fatalf("differences = %d, statuses %v\n%v", resp.GetDifferences(), summary(resp), resp)
	}
	requireNoWrites(t, mk)
}

func TestFailedAndReadErrors(t *testing.T) {
	mk := memory.New()
	r, err := reconcile.New(mk.Kernel(), reconcile.Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	bad := service("bad", "not-an-ip", 80, "198.19.1.2")
	r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{settings(), bad}})
	c := serve(t, r, mk)
	mk.ResetCalls()
	resp, err := c.GetKernelState(context.Background(), &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetFailed()["service/default/bad"] == "" {
		t.Fatalf("failed = %v, want service/default/bad with its error", resp.GetFailed())
	}
	requireNoWrites(t, mk)
}

func TestNewRejectsNil(t *testing.T) {
	if _, err := New(nil, Readers{}); err == nil {
		t.Fatal("New(nil, Readers{}) succeeded")
	}
	k := memory.New().Kernel()
	r, err := reconcile.New(k, reconcile.Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(r, Readers{IPVS: k.IPVS, Links: k.Links, IPSets: k.IPSets}); err == nil {
		t.Fatal("New without an iptables reader succeeded")
	}
}

func TestListen(t *testing.T) {
	dir := t.TempDir()
	sock := dir + "/sub/inspect.sock"
	ln, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	// Leave a stale socket behind, as a crashed agent would.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = ln.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	if ln, err = Listen("unix://" + sock); err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	defer ln.Close()
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi, err)
	}
	file := dir + "/file"
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"unix://relative.sock", "nonsense", "unix://" + dir, "unix://" + file, "0.0.0.0:0", ":0", "198.18.0.1:10263"} {
		if l, err := Listen(bad); err == nil {
			_ = l.Close()
			t.Errorf("Listen(%q) succeeded", bad)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Fatalf("a regular file at the socket path was touched: %q %v", b, err)
	}
	tl, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = tl.Close()
}

// TestRejectShown: a Local policy without local endpoints is a virtual
// server with no real servers on purpose, and inspection says so.
func TestRejectShown(t *testing.T) {
	mk := memory.New()
	r, err := reconcile.New(mk.Kernel(), reconcile.Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	rej := service("local", "198.18.0.12", 80)
	vs := rej.GetService().GetVirtualServers()[0]
	vs.Reject, vs.TrafficPolicy = true, vsplanev1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{
		settings(), rej, service("a", "198.18.0.10", 80, "198.19.1.2")}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	resp, err := serve(t, r, mk).GetKernelState(context.Background(), &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, v := range resp.GetVirtualServers() {
		got[v.GetKey()] = v.GetReject()
		if v.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			t.Errorf("%s: %v", v.GetKey(), v.GetStatus())
		}
	}
	if want := map[string]bool{"tcp/198.18.0.12:80": true, "tcp/198.18.0.10:80": false}; !cmp.Equal(want, got) {
		t.Fatalf("reject flags %v, want %v", got, want)
	}
}
