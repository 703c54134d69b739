package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// nodePortRes is a NodePort Service as the control plane sends it: a TCP
// NodePort marker (with its bitmap entry) and an SCTP one (with its hash
// entry marker), both IPv4, plus the ClusterIP.
func nodePortRes(name string, tcpPort, sctpPort uint32, backend string) *vsplanev1.Resource {
	rs := []*vsplanev1.RealServer{{Address: backend, Port: 8080, Weight: 1}}
	marker := func(port uint32, proto vsplanev1.Protocol) *vsplanev1.VirtualServer {
		return &vsplanev1.VirtualServer{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT, NodePortAddresses: true,
			Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Port: port, Protocol: proto,
			Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_NONE, RealServers: rs}
	}
	svc := &vsplanev1.ServiceState{Namespace: "default", Name: name,
		VirtualServers: []*vsplanev1.VirtualServer{marker(tcpPort, vsplanev1.Protocol_PROTOCOL_TCP)},
		IpsetEntries: []*vsplanev1.IPSetEntry{
			{Set: vsplanev1.IPSet_IP_SET_NODE_PORT_TCP, Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Port: tcpPort},
		},
	}
	if sctpPort != 0 {
		svc.VirtualServers = append(svc.VirtualServers, marker(sctpPort, vsplanev1.Protocol_PROTOCOL_SCTP))
		svc.IpsetEntries = append(svc.IpsetEntries, &vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_NODE_PORT_SCTP_HASH,
			Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Port: sctpPort, Protocol: vsplanev1.Protocol_PROTOCOL_SCTP, NodePortAddresses: true})
	}
	return &vsplanev1.Resource{Name: "service/default/" + name, Version: fmt.Sprintf("%s-%d-%d-%s", name, tcpPort, sctpPort, backend),
		Body: &vsplanev1.Resource_Service{Service: svc}}
}

// nodeInterfaces gives mk a node's interfaces: two NodePort-eligible
// addresses, loopback, an IPv6 link-local one and a ClusterIP on kube-ipvs0.
func nodeInterfaces(mk *memory.Kernel) {
	mk.AddInterface("lo", "loopback", netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("::1/128"))
	mk.AddInterface("eth0", "veth", netip.MustParsePrefix("198.19.0.11/24"), netip.MustParsePrefix("fe80::11/64"),
		netip.MustParsePrefix("2001:2:0:100::11/64"))
	mk.AddInterface("eth1", "veth", netip.MustParsePrefix("198.19.0.21/24"))
}

func TestSelectNodePortAddrs(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	mk.AddInterface(kernel.DummyDevice, "dummy", netip.MustParsePrefix("198.18.0.10/32"))
	list, err := mk.Kernel().Links.LocalAddresses()
	if err != nil {
		t.Fatal(err)
	}
	both := familySet{kernel.FamilyIPv4, kernel.FamilyIPv6}
	a := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		cidrs []string
		want  nodePortAddrs
	}{
		{"all", nil, nodePortAddrs{4: a("198.19.0.11", "198.19.0.21"), 6: a("2001:2:0:100::11")}},
		{"v4 cidr, v6 all", []string{"198.19.0.16/28"}, nodePortAddrs{4: a("198.19.0.21"), 6: a("2001:2:0:100::11")}},
		{"cidr matching nothing", []string{"198.18.200.0/24", "2001:2:0:100::/64"}, nodePortAddrs{4: nil, 6: a("2001:2:0:100::11")}},
		{"loopback cidr still excludes loopback", []string{"127.0.0.0/8"}, nodePortAddrs{4: nil, 6: a("2001:2:0:100::11")}},
	} {
		var cidrs []netip.Prefix
		for _, c := range tc.cidrs {
			cidrs = append(cidrs, netip.MustParsePrefix(c))
		}
		got := selectNodePortAddrs(list, cidrs, both)
		if d := cmp.Diff(tc.want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}

func TestNodePortExpansion(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), nodePortRes("np", 30080, 30081, "198.19.1.9"))))
	wantState(t, mk, kernelState{
		Services: map[string][]string{
			"tcp/198.18.0.10:80 rr":     {"198.19.1.2:8080 w1", "198.19.2.3:8080 w1"},
			"tcp/198.19.0.11:30080 rr":  {"198.19.1.9:8080 w1"},
			"tcp/198.19.0.21:30080 rr":  {"198.19.1.9:8080 w1"},
			"sctp/198.19.0.11:30081 rr": {"198.19.1.9:8080 w1"},
			"sctp/198.19.0.21:30081 rr": {"198.19.1.9:8080 w1"},
		},
		// NodePort addresses are never bound to kube-ipvs0.
		Bound: []string{"198.18.0.10"},
		Sets: map[string][]string{
			"KUBE-CLUSTER-IP":          {"198.18.0.10,tcp:80"},
			"KUBE-IPVS-IPS":            {"198.18.0.10"},
			"KUBE-NODE-PORT-TCP":       {"30080"},
			"KUBE-NODE-PORT-SCTP-HASH": {"198.19.0.11,sctp:30081", "198.19.0.21,sctp:30081"},
		},
	})
	addrs, restricted := r.NodePortAddresses()
	if fmt.Sprint(addrs) != "[198.19.0.11 198.19.0.21]" || restricted {
		t.Errorf("NodePortAddresses = %v, %v", addrs, restricted)
	}
	// A restart with the same state writes nothing.
	mk.ResetCalls()
	r2 := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r2, full(settingsRes(defaultNodeSettings()), svcA.resource(), nodePortRes("np", 30080, 30081, "198.19.1.9"))))
	if w := writes(mk); len(w) != 0 {
		t.Errorf("restart wrote %v", w)
	}
}

func TestNodePortFollowsInterfaceAddresses(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	ctx := context.Background()
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), nodePortRes("np", 30080, 30081, "198.19.1.9"))))

	// An address added: the next Apply (of an unrelated change) expands
	// onto it, touching nothing else.
	mk.AddInterface("eth2", "veth", netip.MustParsePrefix("198.19.0.31/24"))
	mk.ResetCalls()
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "b", Resources: []*vsplanev1.Resource{svcB.resource()}})
	mustAck(t, ack)
	want := map[string]int{
		"ipvs.AddVirtualServer": 3, "ipvs.AddDestination": 3, // svcB + tcp and sctp on .31
		"link.BindAddress": 1, "ipset.AddEntry": 3, // svcB: bind, CLUSTER-IP, IPVS-IPS; SCTP hash entry
	}
	if d := cmp.Diff(want, writes(mk)); d != "" {
		t.Errorf("writes after an address appeared (-want +got):\n%s", d)
	}
	st := readState(t, mk)
	if _, ok := st.Services["tcp/198.19.0.31:30080 rr"]; !ok {
		t.Errorf("no NodePort on the new address: %v", st.Services)
	}
	if !strings.Contains(fmt.Sprint(st.Sets["KUBE-NODE-PORT-SCTP-HASH"]), "198.19.0.31,sctp:30081") {
		t.Errorf("SCTP hash set = %v", st.Sets["KUBE-NODE-PORT-SCTP-HASH"])
	}

	// An address removed: the periodic full reconcile notices it.
	if err := unbindAddr(mk.Kernel(), "eth1", netip.MustParseAddr("198.19.0.21")); err != nil {
		t.Fatal(err)
	}
	mk.ResetCalls()
	r.Reconcile(ctx)
	if d := cmp.Diff(map[string]int{"ipvs.DeleteVirtualServer": 2, "ipset.DelEntry": 1}, writes(mk)); d != "" {
		t.Errorf("writes after an address went away (-want +got):\n%s", d)
	}
	st = readState(t, mk)
	for key := range st.Services {
		if strings.Contains(key, "198.19.0.21") {
			t.Errorf("NodePort left on a removed address: %s", key)
		}
	}
	if len(r.Failed()) != 0 {
		t.Errorf("failed: %v", r.Failed())
	}
}

func TestNodePortSettingsCIDRChange(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), nodePortRes("np", 30080, 30081, "198.19.1.9"))))
	ns := defaultNodeSettings()
	ns.NodePortAddresses = []string{"198.19.0.11/32"}
	mk.ResetCalls()
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "s", Resources: []*vsplanev1.Resource{settingsRes(ns)}})
	mustAck(t, ack)
	// Only the NodePorts on the address now excluded go; nothing else is
	// rewritten.
	if d := cmp.Diff(map[string]int{"ipvs.DeleteVirtualServer": 2, "ipset.DelEntry": 1}, writes(mk)); d != "" {
		t.Errorf("writes (-want +got):\n%s", d)
	}
	st := readState(t, mk)
	if d := cmp.Diff([]string{"198.19.0.11,sctp:30081"}, st.Sets["KUBE-NODE-PORT-SCTP-HASH"]); d != "" {
		t.Errorf("SCTP hash (-want +got):\n%s", d)
	}
	if len(st.Services) != 3 {
		t.Errorf("services = %v", st.Services)
	}
	if addrs, restricted := r.NodePortAddresses(); fmt.Sprint(addrs) != "[198.19.0.11]" || !restricted {
		t.Errorf("NodePortAddresses = %v, %v", addrs, restricted)
	}
	// Back to all addresses.
	mk.ResetCalls()
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "s2", Resources: []*vsplanev1.Resource{settingsRes(defaultNodeSettings())}}))
	if d := cmp.Diff(map[string]int{"ipvs.AddVirtualServer": 2, "ipvs.AddDestination": 2, "ipset.AddEntry": 1}, writes(mk)); d != "" {
		t.Errorf("writes (-want +got):\n%s", d)
	}
}

// An ExternalIP equal to a node address on the NodePort's port: the
// explicit virtual server is programmed, the NodePort Service is NACKed
// with the reason, and recovers when the other Service goes away.
func TestNodePortCollision(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	ext := &vsplanev1.Resource{Name: "service/default/ext", Version: "1", Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
		VirtualServers: []*vsplanev1.VirtualServer{{
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP, Address: "198.19.0.11", Port: 30080,
			Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL,
			RealServers: []*vsplanev1.RealServer{{Address: "198.19.2.2", Port: 80, Weight: 1}},
		}},
	}}}
	// "np" sorts after "ext", but the explicit one must win even when the
	// NodePort's resource sorts first: use "aaa-np" too.
	for _, npName := range []string{"np", "aaa-np"} {
		t.Run(npName, func(t *testing.T) {
			mk := memory.New()
			nodeInterfaces(mk)
			r := newReconciler(t, mk, Config{})
			ack := apply(t, r, full(settingsRes(defaultNodeSettings()), ext, nodePortRes(npName, 30080, 0, "198.19.1.9")))
			if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK || len(ack.GetErrors()) != 1 ||
				ack.GetErrors()[0].GetName() != "service/default/"+npName ||
				!strings.Contains(ack.GetErrors()[0].GetMessage(), "collides with the virtual server of service/default/ext") {
				t.Fatalf("ack = %v", ack)
			}
			st := readState(t, mk)
			if d := cmp.Diff([]string{"198.19.2.2:80 w1"}, st.Services["tcp/198.19.0.11:30080 rr"]); d != "" {
				t.Errorf("colliding VS (-want +got):\n%s", d)
			}
			if d := cmp.Diff([]string{"198.19.1.9:8080 w1"}, st.Services["tcp/198.19.0.21:30080 rr"]); d != "" {
				t.Errorf("other NodePort address (-want +got):\n%s", d)
			}
			if len(st.Bound) != 0 {
				t.Errorf("node address bound to kube-ipvs0: %v", st.Bound)
			}
			// The other Service goes: the NodePort takes the address over and
			// its resource is ACKed in the same Apply.
			mk.ResetCalls()
			ack = apply(t, r, &vsplanev1.Delta{Nonce: "rm", Removed: []string{"service/default/ext"}})
			mustAck(t, ack)
			if _, ok := r.Versions()["service/default/"+npName]; !ok {
				t.Errorf("NodePort Service still failed: %v", r.Failed())
			}
			if d := cmp.Diff([]string{"198.19.1.9:8080 w1"}, readState(t, mk).Services["tcp/198.19.0.11:30080 rr"]); d != "" {
				t.Errorf("after removal (-want +got):\n%s", d)
			}
		})
	}
	// Duplicate NodePorts (the control plane should never send them): the
	// first Service by name is programmed, the other NACKed.
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), nodePortRes("a", 30080, 0, "198.19.1.9"))))
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "dup", Resources: []*vsplanev1.Resource{nodePortRes("b", 30080, 0, "198.19.1.7")}})
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetName() != "service/default/b" ||
		!strings.Contains(ack.GetErrors()[0].GetMessage(), "duplicate NodePort") {
		t.Fatalf("ack = %v", ack)
	}
	if d := cmp.Diff([]string{"198.19.1.9:8080 w1"}, readState(t, mk).Services["tcp/198.19.0.11:30080 rr"]); d != "" {
		t.Errorf("duplicate NodePort (-want +got):\n%s", d)
	}
}

func TestNodePortMarkerBadInput(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	bad := nodePortRes("bad", 30080, 30081, "198.19.1.9")
	svc := bad.GetService()
	svc.VirtualServers[0].Family = vsplanev1.IPFamily_IP_FAMILY_UNSPECIFIED
	svc.VirtualServers[1].Address = "198.19.0.11"
	svc.IpsetEntries[1].Ip = "198.19.0.11"
	ack := apply(t, r, full(bad, svcA.resource()))
	if len(ack.GetErrors()) != 1 {
		t.Fatalf("ack = %v", ack)
	}
	msg := ack.GetErrors()[0].GetMessage()
	for _, want := range []string{"without family", "must be empty", "only a port and protocol"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if _, ok := r.Versions()[svcA.resource().GetName()]; !ok {
		t.Error("good Service not applied")
	}
}

// TestRestartRemovesNodePortsDroppedMeanwhile: a NodePort Service turned
// ClusterIP while the agent was down leaves its NodePort virtual servers
// on the node's addresses, which no state of the restarted agent names;
// its first full pass deletes them (as kube-proxy deletes every virtual
// server it does not want), and leaves a virtual server on an address
// that is not the node's alone.
func TestRestartRemovesNodePortsDroppedMeanwhile(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), nodePortRes("np", 30080, 0, "198.19.1.9"))))
	foreign := kernel.VirtualServer{Key: kernel.AddrKey(netip.MustParseAddr("198.19.250.5"), kernel.ProtocolTCP, 80),
		Scheduler: "rr"}
	if err := addVS(mk.Kernel(), foreign); err != nil {
		t.Fatal(err)
	}

	r2 := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r2, full(settingsRes(defaultNodeSettings()), svcA.resource())))
	got := readState(t, mk).Services
	want := map[string][]string{
		"tcp/198.18.0.10:80 rr":  {"198.19.1.2:8080 w1", "198.19.2.3:8080 w1"},
		"tcp/198.19.250.5:80 rr": nil,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the restart the kernel holds %v, want %v", got, want)
	}
}
