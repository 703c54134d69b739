package translate

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/vsplane/vsplane/controlplane/model"
	pb "github.com/vsplane/vsplane/proto/vsplane/v1"
)

var (
	v4            = pb.IPFamily_IP_FAMILY_IPV4
	v6            = pb.IPFamily_IP_FAMILY_IPV6
	tcp           = pb.Protocol_PROTOCOL_TCP
	udp           = pb.Protocol_PROTOCOL_UDP
	sctp          = pb.Protocol_PROTOCOL_SCTP
	clusterIPKind = pb.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP
	always        = pb.AddressBinding_ADDRESS_BINDING_ALWAYS
	cluster       = pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	local         = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	setCIP        = pb.IPSet_IP_SET_CLUSTER_IP
	setLoop       = pb.IPSet_IP_SET_LOOP_BACK
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(addr, node string, ready, serving, terminating bool) model.Endpoint {
	return model.Endpoint{Address: ip(addr), NodeName: node, Ready: ready, Serving: serving, Terminating: terminating}
}

func rs(addr string, port uint32, isLocal bool) *pb.RealServer {
	return &pb.RealServer{Address: addr, Port: port, Weight: 1, Local: isLocal, Ready: true, Serving: true, Reason: "ready"}
}

func cipEntry(fam pb.IPFamily, addr string, port uint32, proto pb.Protocol) *pb.IPSetEntry {
	return &pb.IPSetEntry{Set: setCIP, Family: fam, Ip: addr, Port: port, Protocol: proto}
}

func loopEntry(fam pb.IPFamily, addr string, port uint32, proto pb.Protocol) *pb.IPSetEntry {
	return &pb.IPSetEntry{Set: setLoop, Family: fam, Ip: addr, Port: port, Protocol: proto, Ip2: addr}
}

var web = &model.Service{
	Key:        model.ServiceKey{Namespace: "default", Name: "web"},
	ClusterIPs: []netip.Addr{ip("198.18.0.10")},
	Ports:      []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}},
}

var webSlice = &model.EndpointSlice{
	Key: model.SliceKey{Namespace: "default", Name: "web-abc"}, Service: web.Key, Family: model.IPv4,
	Ports: []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}},
	Endpoints: []model.Endpoint{
		ep("198.19.1.5", "n1", true, true, false),
		ep("198.19.2.5", "n2", true, true, false),
		ep("198.19.1.6", "n1", false, false, false), // not ready: no real server, still hairpinned
		ep("198.19.2.7", "n2", false, true, true),   // terminating: not used in this issue
	},
}

func TestService(t *testing.T) {
	n1 := &model.Node{Name: "n1"}
	n3 := &model.Node{Name: "n3"}
	dual := &model.Service{
		Key:                  model.ServiceKey{Namespace: "ns", Name: "dual"},
		ClusterIPs:           []netip.Addr{ip("2001:2:0:1::a"), ip("198.18.0.11")},
		Ports:                []model.ServicePort{{Name: "dns", Protocol: model.UDP, Port: 53}, {Name: "sig", Protocol: model.SCTP, Port: 3868}},
		Sticky:               true,
		StickyTimeoutSeconds: 600,
	}
	dualV4 := &model.EndpointSlice{
		Key: model.SliceKey{Namespace: "ns", Name: "dual-4"}, Service: dual.Key, Family: model.IPv4,
		Ports:     []model.EndpointPort{{Name: "dns", Protocol: model.UDP, Port: 5353}, {Name: "sig", Protocol: model.SCTP, Port: 3868}},
		Endpoints: []model.Endpoint{ep("198.19.1.9", "n1", true, true, false)},
	}
	dualV6 := &model.EndpointSlice{
		Key: model.SliceKey{Namespace: "ns", Name: "dual-6"}, Service: dual.Key, Family: model.IPv6,
		Ports:     []model.EndpointPort{{Name: "dns", Protocol: model.UDP, Port: 5353}},
		Endpoints: []model.Endpoint{ep("2001:2:0:2::9", "n2", true, true, false)},
	}
	persistent := []pb.VirtualServerFlag{pb.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT}

	itpLocal := *web
	itpLocal.InternalTrafficPolicy = model.PolicyLocal

	// The same endpoint in two slices: the terminating copy does not replace the ready one.
	dupA := &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: "web-a"}, Service: web.Key, Family: model.IPv4,
		Ports:     []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}},
		Endpoints: []model.Endpoint{ep("198.19.2.5", "n2", true, true, false)}}
	dupB := &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: "web-b"}, Service: web.Key, Family: model.IPv4,
		Ports:     []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}},
		Endpoints: []model.Endpoint{ep("198.19.2.5", "n2", false, true, true)}}

	// Port name or protocol mismatch: no endpoints.
	mismatch := &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: "web-x"}, Service: web.Key, Family: model.IPv4,
		Ports:     []model.EndpointPort{{Name: "http", Protocol: model.UDP, Port: 8080}, {Name: "https", Protocol: model.TCP, Port: 8443}},
		Endpoints: []model.Endpoint{ep("198.19.2.5", "n2", true, true, false)}}

	tests := []struct {
		name string
		in   Input
		node *model.Node
		want *pb.ServiceState
	}{{
		name: "ClusterIP on a node hosting endpoints",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{webSlice}},
		node: n1,
		want: &pb.ServiceState{
			Namespace: "default", Name: "web", LocalEndpoints: 1,
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "198.18.0.10", Family: v4, Port: 80, Protocol: tcp, Binding: always,
				PortName: "http", TrafficPolicy: cluster,
				RealServers: []*pb.RealServer{rs("198.19.1.5", 8080, true), rs("198.19.2.5", 8080, false)},
			}},
			IpsetEntries: []*pb.IPSetEntry{
				loopEntry(v4, "198.19.1.5", 8080, tcp),
				loopEntry(v4, "198.19.1.6", 8080, tcp),
				cipEntry(v4, "198.18.0.10", 80, tcp),
			},
		},
	}, {
		name: "ClusterIP on a node without endpoints",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{webSlice}, Problems: []string{"something dropped"}},
		node: n3,
		want: &pb.ServiceState{
			Namespace: "default", Name: "web", Problems: []string{"something dropped"},
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "198.18.0.10", Family: v4, Port: 80, Protocol: tcp, Binding: always,
				PortName: "http", TrafficPolicy: cluster,
				RealServers: []*pb.RealServer{rs("198.19.1.5", 8080, false), rs("198.19.2.5", 8080, false)},
			}},
			IpsetEntries: []*pb.IPSetEntry{cipEntry(v4, "198.18.0.10", 80, tcp)},
		},
	}, {
		name: "no slices: virtual server without real servers",
		in:   Input{Service: web},
		node: n1,
		want: &pb.ServiceState{
			Namespace: "default", Name: "web",
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "198.18.0.10", Family: v4, Port: 80, Protocol: tcp, Binding: always,
				PortName: "http", TrafficPolicy: cluster,
			}},
			IpsetEntries: []*pb.IPSetEntry{cipEntry(v4, "198.18.0.10", 80, tcp)},
		},
	}, {
		name: "dual-stack UDP+SCTP with ClientIP affinity; families independent",
		in:   Input{Service: dual, Slices: []*model.EndpointSlice{dualV6, dualV4}},
		node: n1,
		want: &pb.ServiceState{
			Namespace: "ns", Name: "dual", LocalEndpoints: 1,
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "2001:2:0:1::a", Family: v6, Port: 53, Protocol: udp, Binding: always,
				PortName: "dns", TrafficPolicy: cluster, Flags: persistent, PersistenceTimeoutSeconds: 600,
				RealServers: []*pb.RealServer{rs("2001:2:0:2::9", 5353, false)},
			}, {
				Kind: clusterIPKind, Address: "2001:2:0:1::a", Family: v6, Port: 3868, Protocol: sctp, Binding: always,
				PortName: "sig", TrafficPolicy: cluster, Flags: persistent, PersistenceTimeoutSeconds: 600,
			}, {
				Kind: clusterIPKind, Address: "198.18.0.11", Family: v4, Port: 53, Protocol: udp, Binding: always,
				PortName: "dns", TrafficPolicy: cluster, Flags: persistent, PersistenceTimeoutSeconds: 600,
				RealServers: []*pb.RealServer{rs("198.19.1.9", 5353, true)},
			}, {
				Kind: clusterIPKind, Address: "198.18.0.11", Family: v4, Port: 3868, Protocol: sctp, Binding: always,
				PortName: "sig", TrafficPolicy: cluster, Flags: persistent, PersistenceTimeoutSeconds: 600,
				RealServers: []*pb.RealServer{rs("198.19.1.9", 3868, true)},
			}},
			IpsetEntries: []*pb.IPSetEntry{
				loopEntry(v4, "198.19.1.9", 3868, sctp),
				loopEntry(v4, "198.19.1.9", 5353, udp),
				cipEntry(v4, "198.18.0.11", 53, udp),
				cipEntry(v4, "198.18.0.11", 3868, sctp),
				cipEntry(v6, "2001:2:0:1::a", 53, udp),
				cipEntry(v6, "2001:2:0:1::a", 3868, sctp),
			},
		},
	}, {
		name: "internalTrafficPolicy Local without local endpoints rejects",
		in:   Input{Service: &itpLocal, Slices: []*model.EndpointSlice{webSlice}},
		node: n3,
		want: &pb.ServiceState{
			Namespace: "default", Name: "web", NoLocalEndpointsInternal: true,
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "198.18.0.10", Family: v4, Port: 80, Protocol: tcp, Binding: always,
				PortName: "http", TrafficPolicy: local, Reject: true,
			}},
			IpsetEntries: []*pb.IPSetEntry{cipEntry(v4, "198.18.0.10", 80, tcp)},
		},
	}, {
		name: "internalTrafficPolicy Local uses only local ready endpoints",
		in:   Input{Service: &itpLocal, Slices: []*model.EndpointSlice{webSlice}},
		node: n1,
		want: &pb.ServiceState{
			Namespace: "default", Name: "web", LocalEndpoints: 1,
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "198.18.0.10", Family: v4, Port: 80, Protocol: tcp, Binding: always,
				PortName: "http", TrafficPolicy: local,
				RealServers: []*pb.RealServer{rs("198.19.1.5", 8080, true)},
			}},
			IpsetEntries: []*pb.IPSetEntry{
				loopEntry(v4, "198.19.1.5", 8080, tcp),
				loopEntry(v4, "198.19.1.6", 8080, tcp),
				cipEntry(v4, "198.18.0.10", 80, tcp),
			},
		},
	}, {
		name: "duplicate endpoint across slices keeps the non-terminating copy",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{dupB, dupA}},
		node: n3,
		want: &pb.ServiceState{
			Namespace: "default", Name: "web",
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "198.18.0.10", Family: v4, Port: 80, Protocol: tcp, Binding: always,
				PortName: "http", TrafficPolicy: cluster,
				RealServers: []*pb.RealServer{rs("198.19.2.5", 8080, false)},
			}},
			IpsetEntries: []*pb.IPSetEntry{cipEntry(v4, "198.18.0.10", 80, tcp)},
		},
	}, {
		name: "slice ports must match name and protocol",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{mismatch}},
		node: n3,
		want: &pb.ServiceState{
			Namespace: "default", Name: "web",
			VirtualServers: []*pb.VirtualServer{{
				Kind: clusterIPKind, Address: "198.18.0.10", Family: v4, Port: 80, Protocol: tcp, Binding: always,
				PortName: "http", TrafficPolicy: cluster,
			}},
			IpsetEntries: []*pb.IPSetEntry{cipEntry(v4, "198.18.0.10", 80, tcp)},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Service(tc.in, tc.node, Config{})
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Service() (-want +got):\n%s", diff)
			}
		})
	}
	if Service(Input{}, n1, Config{}) != nil {
		t.Error("nil Service must give nil")
	}
}

func TestVariants(t *testing.T) {
	in := Input{Service: web, Slices: []*model.EndpointSlice{webSlice}}
	v := VariantsOf(in)
	if diff := cmp.Diff([]string{"n1", "n2"}, slices.Sorted(maps.Keys(v.perNode))); diff != "" {
		t.Fatalf("PerNode (-want +got):\n%s", diff)
	}
	nodes := []*model.Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}, {Name: "n4", Zone: "z"}}
	byKey := map[string]*pb.ServiceState{}
	for _, n := range nodes {
		got := Service(in, n, Config{})
		k := v.Key(n)
		if prev, ok := byKey[k]; ok {
			if diff := cmp.Diff(prev, got, protocmp.Transform()); diff != "" {
				t.Errorf("nodes with key %q differ (-first +%s):\n%s", k, n.Name, diff)
			}
		}
		byKey[k] = got
	}
	if len(byKey) != 3 {
		t.Errorf("want 3 variants (n1, n2, common), got %d", len(byKey))
	}
}

func TestNodeSettings(t *testing.T) {
	n := &model.Node{Name: "n1", Zone: "zone-a", Addresses: []netip.Addr{ip("198.19.0.11"), ip("2001:2::11")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.1.0/24"), netip.MustParsePrefix("2001:2:0:101::/64")}}
	got := NodeSettings(n, Config{
		TCPTimeout: 900 * time.Second, UDPTimeout: 1500 * time.Millisecond, StrictARP: true,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}, ReconcilePeriod: time.Minute,
	})
	want := &pb.NodeSettings{
		DefaultScheduler: "rr", TcpTimeoutSeconds: 900, UdpTimeoutSeconds: 2, StrictArp: true, MasqueradeBit: 14,
		ClusterCidrs: []string{"198.19.0.0/16"}, NodeIps: []string{"198.19.0.11", "2001:2::11"}, Zone: "zone-a",
		ReconcilePeriodSeconds: 60, LocalDetectMode: pb.LocalDetectMode_LOCAL_DETECT_MODE_CLUSTER_CIDR,
		NodePodCidrs: []string{"198.19.1.0/24", "2001:2:0:101::/64"},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("NodeSettings (-want +got):\n%s", diff)
	}
	// Conntrack: sent when anything is set, in whole seconds.
	if s := NodeSettings(n, Config{}); s.Conntrack != nil {
		t.Errorf("conntrack sent unset: %v", s.Conntrack)
	}
	ct := NodeSettings(n, Config{Conntrack: Conntrack{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 1500 * time.Millisecond, UDPStreamTimeout: 2 * time.Minute}}).Conntrack
	if diff := cmp.Diff(&pb.ConntrackSettings{MaxPerCore: 32768, Min: 131072, TcpEstablishedTimeoutSeconds: 86400, TcpCloseWaitTimeoutSeconds: 3600,
		TcpBeLiberal: true, UdpTimeoutSeconds: 2, UdpStreamTimeoutSeconds: 120}, ct, protocmp.Transform()); diff != "" {
		t.Errorf("conntrack (-want +got):\n%s", diff)
	}
	// Local-traffic detection: the node's pod CIDRs always go (they also
	// tell this node's Pods among in-cluster clients), the interface only
	// with the interface modes.
	for _, tc := range []struct {
		ld    LocalDetect
		mode  pb.LocalDetectMode
		cidrs []string
		iface string
	}{
		{LocalDetect{Mode: LocalByNodeCIDR, Interface: "ignored"}, pb.LocalDetectMode_LOCAL_DETECT_MODE_NODE_CIDR, []string{"198.19.1.0/24", "2001:2:0:101::/64"}, ""},
		{LocalDetect{Mode: LocalByBridge, Interface: "cbr0"}, pb.LocalDetectMode_LOCAL_DETECT_MODE_BRIDGE_INTERFACE, []string{"198.19.1.0/24", "2001:2:0:101::/64"}, "cbr0"},
		{LocalDetect{Mode: LocalByInterfacePrefix, Interface: "veth"}, pb.LocalDetectMode_LOCAL_DETECT_MODE_INTERFACE_NAME_PREFIX, []string{"198.19.1.0/24", "2001:2:0:101::/64"}, "veth"},
	} {
		s := NodeSettings(n, Config{LocalDetect: tc.ld})
		if s.GetLocalDetectMode() != tc.mode || !slices.Equal(s.GetNodePodCidrs(), tc.cidrs) || s.GetLocalInterface() != tc.iface {
			t.Errorf("%+v: got mode %v, pod CIDRs %v, interface %q", tc.ld, s.GetLocalDetectMode(), s.GetNodePodCidrs(), s.GetLocalInterface())
		}
	}
	if s := NodeSettings(n, Config{DefaultScheduler: "mh", MasqueradeBit: 3}); s.DefaultScheduler != "mh" || s.MasqueradeBit != 3 {
		t.Errorf("explicit config not kept: %v", s)
	}
}

// noLocalEndpoints counts a Local policy only while the port has usable
// endpoints elsewhere (ready, or serving and terminating), as kube-proxy.
func TestNoLocalEndpoints(t *testing.T) {
	node := &model.Node{Name: "n1"}
	for _, tc := range []struct {
		name string
		eps  []endpoint
		want bool
	}{
		{"none at all", nil, false},
		{"remote ready", []endpoint{{ready: true, nodeName: "n2"}}, true},
		{"remote serving terminating", []endpoint{{serving: true, terminating: true, nodeName: "n2"}}, true},
		{"remote not serving", []endpoint{{nodeName: "n2"}}, false},
		{"local ready", []endpoint{{ready: true, local: true, nodeName: "n1"}}, false},
	} {
		tr := &translation{svc: &model.Service{InternalTrafficPolicy: model.PolicyLocal, ExternalTrafficPolicy: model.PolicyLocal},
			node: node, st: &pb.ServiceState{}}
		sel := categorize(tc.eps, node.Name, "")
		tr.noLocalEndpoints(tc.eps, &sel)
		if tr.st.NoLocalEndpointsInternal != tc.want || tr.st.NoLocalEndpointsExternal != tc.want {
			t.Errorf("%s: internal %v, external %v, want %v", tc.name, tr.st.NoLocalEndpointsInternal, tr.st.NoLocalEndpointsExternal, tc.want)
		}
	}
}

// Conflicts leave out what other Services own exactly as if the Service
// did not ask for it: the same output and the same variants as the Service
// without those parts.
func TestConflictsAreLeftOut(t *testing.T) {
	ip := netip.MustParseAddr
	svc := &model.Service{
		Key: model.ServiceKey{Namespace: "ns", Name: "lb"}, Type: model.ServiceTypeLoadBalancer,
		ClusterIPs: []netip.Addr{ip("198.18.0.10")},
		Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080},
			{Name: "alt", Protocol: model.TCP, Port: 30081, NodePort: 30081}},
		ExternalIPs:     []netip.Addr{ip("198.19.0.1"), ip("198.18.100.1")},
		LoadBalancerIPs: []netip.Addr{ip("198.18.200.5")},
	}
	conflicts := Conflicts{
		NodePorts:   map[NodePort]struct{}{{Protocol: model.TCP, Port: 30080}: {}},
		ExternalIPs: map[netip.Addr]struct{}{ip("198.18.100.1"): {}},
		VIPs: map[model.VIP]struct{}{
			{Addr: ip("198.18.200.5"), Proto: model.TCP, Port: 80}:    {},
			{Addr: ip("198.18.200.5"), Proto: model.TCP, Port: 30081}: {},
		},
	}
	without := *svc
	without.Ports = slices.Clone(svc.Ports)
	without.Ports[0].NodePort = 0
	without.ExternalIPs = []netip.Addr{ip("198.19.0.1")}
	without.LoadBalancerIPs = nil

	in := Input{Service: svc, Conflicts: conflicts}
	want := Input{Service: &without}
	for _, n := range []*model.Node{
		{Name: "n1", Addresses: []netip.Addr{ip("198.19.0.1")}}, // kept external IP on its own NodePort's port
		{Name: "n2", Addresses: []netip.Addr{ip("198.18.100.1")}},
		{Name: "n3"},
	} {
		got := Service(in, n, Config{})
		if diff := cmp.Diff(Service(want, n, Config{}), got, protocmp.Transform()); diff != "" {
			t.Errorf("%s: Service() (-without the parts +with conflicts):\n%s", n.Name, diff)
		}
		if cmp.Equal(Service(Input{Service: svc}, n, Config{}), got, protocmp.Transform()) {
			t.Errorf("%s: the conflicts left nothing out", n.Name)
		}
		if got, want := VariantsOf(in).Key(n), VariantsOf(want).Key(n); got != want {
			t.Errorf("%s: variant key %q, want %q", n.Name, got, want)
		}
	}
}
