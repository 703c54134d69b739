package translate

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/vsplane/vsplane/controlplane/model"
	pb "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Nodes of the feature tests: n1 and n3 in zone-a, n2 in zone-b.
var (
	fn1 = &model.Node{Name: "n1", Zone: "zone-a", Addresses: []netip.Addr{ip("198.19.0.11"), ip("2001:2:0:100::11")}}
	fn2 = &model.Node{Name: "n2", Zone: "zone-b", Addresses: []netip.Addr{ip("198.19.0.12"), ip("2001:2:0:100::12")}}
	fn3 = &model.Node{Name: "n3", Zone: "zone-a", Addresses: []netip.Addr{ip("198.19.0.13")}}
	fn4 = &model.Node{Name: "n4", Zone: "zone-c"} // no addresses, no endpoints
)

const (
	kCIP  = pb.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP
	kEXT  = pb.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP
	kLB   = pb.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER
	kNP   = pb.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT
	bNone = pb.AddressBinding_ADDRESS_BINDING_NONE
	bUL   = pb.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL
)

// vsOf builds an expected virtual server of port "http" (TCP unless
// changed): family from addr (IPv4 for NodePort markers unless changed),
// binding from kind.
func vsOf(kind pb.VirtualServerKind, addr string, port uint32, pol pb.TrafficPolicy, rss ...*pb.RealServer) *pb.VirtualServer {
	vs := &pb.VirtualServer{Kind: kind, Address: addr, Family: v4, Port: port, Protocol: tcp, PortName: "http",
		TrafficPolicy: pol, RealServers: rss}
	if a, err := netip.ParseAddr(addr); err == nil && a.Is6() {
		vs.Family = v6
	}
	switch kind {
	case kCIP:
		vs.Binding = always
	case kNP:
		vs.Binding, vs.NodePortAddresses = bNone, true
	default:
		vs.Binding = bUL
	}
	if pol == local && len(rss) == 0 {
		vs.Reject = true
	}
	return vs
}

func with(vs *pb.VirtualServer, f func(*pb.VirtualServer)) *pb.VirtualServer { f(vs); return vs }

// noLocalExternal marks st as having no local endpoint for its Local
// external policy while the cluster has some.
func noLocalExternal(st *pb.ServiceState) *pb.ServiceState {
	st.NoLocalEndpointsExternal = true
	return st
}

// inCluster sets the real servers of in-cluster clients (Local policy).
func inCluster(vs *pb.VirtualServer, rss ...*pb.RealServer) *pb.VirtualServer {
	vs.InClusterRealServers = rss
	return vs
}

func rsr(addr string, isLocal bool, reason string) *pb.RealServer {
	r := rs(addr, 8080, isLocal)
	r.Reason = reason
	if reason == ReasonTerminatingFallback {
		r.Ready, r.Terminating = false, true
	}
	return r
}

func ent(set pb.IPSet, fam pb.IPFamily, addr string, port uint32) *pb.IPSetEntry {
	return &pb.IPSetEntry{Set: set, Family: fam, Ip: addr, Port: port, Protocol: tcp}
}

func bitmap(set pb.IPSet, fam pb.IPFamily, port uint32) *pb.IPSetEntry {
	return &pb.IPSetEntry{Set: set, Family: fam, Port: port}
}

func slice(name string, fam model.Family, eps ...model.Endpoint) *model.EndpointSlice {
	return &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: name}, Service: web.Key, Family: fam,
		Ports: []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}}, Endpoints: eps}
}

func hinted(e model.Endpoint, zones []string, nodes ...string) model.Endpoint {
	e.ForZones, e.ForNodes = zones, nodes
	return e
}

func service(mut func(*model.Service)) *model.Service {
	s := *web
	s.Ports = []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}}
	mut(&s)
	return &s
}

var (
	readyN1 = ep("198.19.1.5", "n1", true, true, false)
	readyN2 = ep("198.19.2.5", "n2", true, true, false)
	termN1  = ep("198.19.1.7", "n1", false, true, true)
	termN2  = ep("198.19.2.7", "n2", false, true, true)
	// Two-node slice: one ready endpoint on n1 and one on n2.
	twoNodes = slice("web-1", model.IPv4, readyN1, readyN2)
)

type featureCase struct {
	name string
	in   Input
	node *model.Node
	cfg  Config
	want *pb.ServiceState
}

func featureCases() []featureCase {
	cip := func(rss ...*pb.RealServer) *pb.VirtualServer { return vsOf(kCIP, "198.18.0.10", 80, cluster, rss...) }
	both := []*pb.RealServer{rs("198.19.1.5", 8080, true), rs("198.19.2.5", 8080, false)}
	bothRemote := []*pb.RealServer{rs("198.19.1.5", 8080, false), rs("198.19.2.5", 8080, false)}
	loopN1 := loopEntry(v4, "198.19.1.5", 8080, tcp)
	cipE := cipEntry(v4, "198.18.0.10", 80, tcp)
	st := func(local uint32, vss []*pb.VirtualServer, ents ...*pb.IPSetEntry) *pb.ServiceState {
		return &pb.ServiceState{Namespace: "default", Name: "web", LocalEndpoints: local, VirtualServers: vss, IpsetEntries: ents}
	}

	extIP := service(func(s *model.Service) { s.ExternalIPs = []netip.Addr{ip("198.18.100.1")} })
	extLocal := service(func(s *model.Service) {
		s.ExternalIPs = []netip.Addr{ip("198.18.100.1")}
		s.ExternalTrafficPolicy = model.PolicyLocal
	})
	lbRanges := service(func(s *model.Service) {
		s.Type = model.ServiceTypeLoadBalancer
		s.LoadBalancerIPs = []netip.Addr{ip("198.18.200.1")}
		s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.18.50.0/24"), netip.MustParsePrefix("198.19.0.0/24"),
			netip.MustParsePrefix("2001:2:0:200::/64")}
	})
	lbOpen := service(func(s *model.Service) {
		s.Type = model.ServiceTypeLoadBalancer
		s.LoadBalancerIPs = []netip.Addr{ip("198.18.200.1")}
		s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.18.50.0/24"), netip.MustParsePrefix("0.0.0.0/0")}
	})
	npTCP := service(func(s *model.Service) { s.Type = model.ServiceTypeNodePort; s.Ports[0].NodePort = 30080 })
	npSCTP := service(func(s *model.Service) {
		s.Type = model.ServiceTypeNodePort
		s.Ports = []model.ServicePort{{Name: "http", Protocol: model.SCTP, Port: 80, NodePort: 30081}}
	})
	sctpSlice := &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: "web-s"}, Service: web.Key, Family: model.IPv4,
		Ports: []model.EndpointPort{{Name: "http", Protocol: model.SCTP, Port: 8080}}, Endpoints: []model.Endpoint{readyN2}}
	lbLocal := service(func(s *model.Service) {
		s.Type = model.ServiceTypeLoadBalancer
		s.Ports = []model.ServicePort{{Name: "http", Protocol: model.UDP, Port: 80, NodePort: 30082}}
		s.LoadBalancerIPs = []netip.Addr{ip("198.18.200.2")}
		s.ExternalTrafficPolicy = model.PolicyLocal
		s.HealthCheckNodePort = 32001
	})
	udpSlice := &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: "web-u"}, Service: web.Key, Family: model.IPv4,
		Ports: []model.EndpointPort{{Name: "http", Protocol: model.UDP, Port: 8080}}, Endpoints: []model.Endpoint{readyN1, readyN2}}
	asUDP := func(vs *pb.VirtualServer) *pb.VirtualServer { vs.Protocol = udp; return vs }
	stickyAll := service(func(s *model.Service) {
		s.Type = model.ServiceTypeLoadBalancer
		s.Ports[0].NodePort = 30083
		s.ExternalIPs = []netip.Addr{ip("198.18.100.3")}
		s.LoadBalancerIPs = []netip.Addr{ip("198.18.200.3")}
		s.ExternalTrafficPolicy = model.PolicyLocal
		s.HealthCheckNodePort = 32003
		s.Sticky, s.StickyTimeoutSeconds = true, 300
	})
	sticky := func(vs *pb.VirtualServer) *pb.VirtualServer {
		vs.Flags = []pb.VirtualServerFlag{pb.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT}
		vs.PersistenceTimeoutSeconds = 300
		return vs
	}
	npLocal := service(func(s *model.Service) {
		s.Type = model.ServiceTypeNodePort
		s.Ports[0].NodePort = 30084
		s.ExternalTrafficPolicy = model.PolicyLocal
	})
	itpLocal := service(func(s *model.Service) { s.InternalTrafficPolicy = model.PolicyLocal })
	dualNP := service(func(s *model.Service) {
		s.Type = model.ServiceTypeNodePort
		s.ClusterIPs = []netip.Addr{ip("198.18.0.10"), ip("2001:2:0:1::10")}
		s.Ports[0].NodePort = 30085
	})
	dualLB := service(func(s *model.Service) {
		s.Type = model.ServiceTypeLoadBalancer
		s.ClusterIPs = []netip.Addr{ip("198.18.0.10"), ip("2001:2:0:1::10")}
		s.LoadBalancerIPs = []netip.Addr{ip("2001:2:0:1::200"), ip("198.18.200.6")}
		s.ExternalIPs = []netip.Addr{ip("2001:2:0:1::100")}
		s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.18.50.0/24"), netip.MustParsePrefix("2001:2:0:100::/64")}
	})
	v6Slice := slice("web-6", model.IPv6, ep("2001:2:0:102::5", "n2", true, true, false))
	rs6 := rs("2001:2:0:102::5", 8080, false)
	npOnNode := service(func(s *model.Service) {
		s.Type = model.ServiceTypeNodePort
		s.Ports = []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30086}, {Name: "alt", Protocol: model.TCP, Port: 30086}}
		s.ExternalIPs = []netip.Addr{ip("198.19.0.11"), ip("198.18.100.7")}
	})
	altSlice := &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: "web-alt"}, Service: web.Key, Family: model.IPv4,
		Ports:     []model.EndpointPort{{Name: "http", Protocol: model.TCP, Port: 8080}, {Name: "alt", Protocol: model.TCP, Port: 8080}},
		Endpoints: []model.Endpoint{readyN2}}
	alt := func(vs *pb.VirtualServer) *pb.VirtualServer { vs.PortName = "alt"; return vs }
	extIsLB := service(func(s *model.Service) {
		s.Type = model.ServiceTypeLoadBalancer
		s.ExternalIPs = []netip.Addr{ip("198.18.200.8")}
		s.LoadBalancerIPs = []netip.Addr{ip("198.18.200.8")}
	})

	zoneSlice := slice("web-z", model.IPv4,
		hinted(readyN1, []string{"zone-a"}), hinted(readyN2, []string{"zone-b"}), hinted(ep("198.19.3.5", "n3", true, true, false), []string{"zone-a"}))
	partialHints := slice("web-z", model.IPv4, hinted(readyN1, []string{"zone-a"}), readyN2)
	nodeHints := slice("web-z", model.IPv4,
		hinted(readyN1, []string{"zone-a"}, "n1"), hinted(readyN2, []string{"zone-b"}, "n2"))

	return []featureCase{{
		name: "externalIP, Cluster policy: KUBE-EXTERNAL-IP, all ready endpoints",
		in:   Input{Service: extIP, Slices: []*model.EndpointSlice{twoNodes}}, node: fn1,
		want: st(1, []*pb.VirtualServer{cip(both...), vsOf(kEXT, "198.18.100.1", 80, cluster, both...)},
			loopN1, cipE, ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.18.100.1", 80)),
	}, {
		name: "externalIP, ETP Local: KUBE-EXTERNAL-IP-LOCAL only, local endpoints; ClusterIP keeps all",
		in:   Input{Service: extLocal, Slices: []*model.EndpointSlice{twoNodes}}, node: fn1,
		want: st(1, []*pb.VirtualServer{cip(both...), inCluster(vsOf(kEXT, "198.18.100.1", 80, local, rs("198.19.1.5", 8080, true)), both...)},
			loopN1, cipE, ent(pb.IPSet_IP_SET_EXTERNAL_IP_LOCAL, v4, "198.18.100.1", 80)),
	}, {
		name: "externalIP, ETP Local, no local endpoint: reject with no real servers",
		in:   Input{Service: extLocal, Slices: []*model.EndpointSlice{twoNodes}}, node: fn3,
		want: noLocalExternal(st(0, []*pb.VirtualServer{cip(bothRemote...), inCluster(vsOf(kEXT, "198.18.100.1", 80, local), bothRemote...)},
			cipE, ent(pb.IPSet_IP_SET_EXTERNAL_IP_LOCAL, v4, "198.18.100.1", 80))),
	}, {
		name: "LB source ranges containing the node: FW, SOURCE-CIDR per range of the family, SOURCE-IP",
		in:   Input{Service: lbRanges, Slices: []*model.EndpointSlice{twoNodes}}, node: fn2,
		want: st(1, []*pb.VirtualServer{cip(rs("198.19.1.5", 8080, false), rs("198.19.2.5", 8080, true)),
			with(vsOf(kLB, "198.18.200.1", 80, cluster, rs("198.19.1.5", 8080, false), rs("198.19.2.5", 8080, true)),
				func(vs *pb.VirtualServer) { vs.SourceRanges = []string{"198.18.50.0/24", "198.19.0.0/24"} })},
			loopEntry(v4, "198.19.2.5", 8080, tcp), cipE,
			ent(pb.IPSet_IP_SET_LOAD_BALANCER, v4, "198.18.200.1", 80),
			ent(pb.IPSet_IP_SET_LOAD_BALANCER_FW, v4, "198.18.200.1", 80),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_IP, v4, "198.18.200.1", 80), func(e *pb.IPSetEntry) { e.Ip2 = "198.18.200.1" }),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR, v4, "198.18.200.1", 80), func(e *pb.IPSetEntry) { e.Net = "198.18.50.0/24" }),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR, v4, "198.18.200.1", 80), func(e *pb.IPSetEntry) { e.Net = "198.19.0.0/24" })),
	}, {
		name: "LB source ranges not containing the node: no SOURCE-IP entry",
		in:   Input{Service: lbRanges, Slices: []*model.EndpointSlice{twoNodes}}, node: fn4,
		want: st(0, []*pb.VirtualServer{cip(bothRemote...),
			with(vsOf(kLB, "198.18.200.1", 80, cluster, bothRemote...),
				func(vs *pb.VirtualServer) { vs.SourceRanges = []string{"198.18.50.0/24", "198.19.0.0/24"} })},
			cipE,
			ent(pb.IPSet_IP_SET_LOAD_BALANCER, v4, "198.18.200.1", 80),
			ent(pb.IPSet_IP_SET_LOAD_BALANCER_FW, v4, "198.18.200.1", 80),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR, v4, "198.18.200.1", 80), func(e *pb.IPSetEntry) { e.Net = "198.18.50.0/24" }),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR, v4, "198.18.200.1", 80), func(e *pb.IPSetEntry) { e.Net = "198.19.0.0/24" })),
	}, {
		name: "LB source range 0.0.0.0/0 allows everyone: no firewall entries",
		in:   Input{Service: lbOpen, Slices: []*model.EndpointSlice{twoNodes}}, node: fn4,
		want: st(0, []*pb.VirtualServer{cip(bothRemote...), vsOf(kLB, "198.18.200.1", 80, cluster, bothRemote...)},
			cipE, ent(pb.IPSet_IP_SET_LOAD_BALANCER, v4, "198.18.200.1", 80)),
	}, {
		name: "NodePort TCP: marker virtual server and KUBE-NODE-PORT-TCP",
		in:   Input{Service: npTCP, Slices: []*model.EndpointSlice{twoNodes}}, node: fn3,
		want: st(0, []*pb.VirtualServer{cip(bothRemote...), vsOf(kNP, "", 30080, cluster, bothRemote...)},
			cipE, bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v4, 30080)),
	}, {
		name: "NodePort SCTP: hash entries expanded by the agent",
		in:   Input{Service: npSCTP, Slices: []*model.EndpointSlice{sctpSlice}}, node: fn3,
		want: st(0, []*pb.VirtualServer{
			with(vsOf(kCIP, "198.18.0.10", 80, cluster, rs("198.19.2.5", 8080, false)), func(vs *pb.VirtualServer) { vs.Protocol = sctp }),
			with(vsOf(kNP, "", 30081, cluster, rs("198.19.2.5", 8080, false)), func(vs *pb.VirtualServer) { vs.Protocol = sctp })},
			cipEntry(v4, "198.18.0.10", 80, sctp),
			&pb.IPSetEntry{Set: pb.IPSet_IP_SET_NODE_PORT_SCTP_HASH, Family: v4, Port: 30081, Protocol: sctp, NodePortAddresses: true}),
	}, {
		name: "LB UDP, ETP Local: LOCAL sets, health check port, local endpoints only",
		in:   Input{Service: lbLocal, Slices: []*model.EndpointSlice{udpSlice}}, node: fn1,
		want: &pb.ServiceState{Namespace: "default", Name: "web", LocalEndpoints: 1, HealthCheckNodePort: 32001,
			VirtualServers: []*pb.VirtualServer{
				asUDP(vsOf(kCIP, "198.18.0.10", 80, cluster, both...)),
				asUDP(inCluster(vsOf(kLB, "198.18.200.2", 80, local, rs("198.19.1.5", 8080, true)), both...)),
				asUDP(inCluster(vsOf(kNP, "", 30082, local, rs("198.19.1.5", 8080, true)), both...))},
			IpsetEntries: []*pb.IPSetEntry{
				loopEntry(v4, "198.19.1.5", 8080, udp), cipEntry(v4, "198.18.0.10", 80, udp),
				{Set: pb.IPSet_IP_SET_LOAD_BALANCER, Family: v4, Ip: "198.18.200.2", Port: 80, Protocol: udp},
				{Set: pb.IPSet_IP_SET_LOAD_BALANCER_LOCAL, Family: v4, Ip: "198.18.200.2", Port: 80, Protocol: udp},
				bitmap(pb.IPSet_IP_SET_NODE_PORT_UDP, v4, 30082), bitmap(pb.IPSet_IP_SET_NODE_PORT_LOCAL_UDP, v4, 30082),
				bitmap(pb.IPSet_IP_SET_HEALTH_CHECK_NODE_PORT, v4, 32001)}},
	}, {
		name: "ETP Local + session affinity: persistent on every virtual server; node without local endpoints rejects",
		in:   Input{Service: stickyAll, Slices: []*model.EndpointSlice{twoNodes}}, node: fn3,
		want: &pb.ServiceState{Namespace: "default", Name: "web", HealthCheckNodePort: 32003, NoLocalEndpointsExternal: true,
			VirtualServers: []*pb.VirtualServer{
				sticky(cip(bothRemote...)),
				sticky(inCluster(vsOf(kEXT, "198.18.100.3", 80, local), bothRemote...)),
				sticky(inCluster(vsOf(kLB, "198.18.200.3", 80, local), bothRemote...)),
				sticky(inCluster(vsOf(kNP, "", 30083, local), bothRemote...))},
			IpsetEntries: []*pb.IPSetEntry{cipE,
				ent(pb.IPSet_IP_SET_EXTERNAL_IP_LOCAL, v4, "198.18.100.3", 80),
				ent(pb.IPSet_IP_SET_LOAD_BALANCER, v4, "198.18.200.3", 80),
				ent(pb.IPSet_IP_SET_LOAD_BALANCER_LOCAL, v4, "198.18.200.3", 80),
				bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v4, 30083), bitmap(pb.IPSet_IP_SET_NODE_PORT_LOCAL_TCP, v4, 30083),
				bitmap(pb.IPSet_IP_SET_HEALTH_CHECK_NODE_PORT, v4, 32003)}},
	}, {
		name: "no ready endpoint anywhere: serving+terminating ones (terminating fallback)",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{slice("web-t", model.IPv4, termN1, termN2, ep("198.19.2.8", "n2", false, false, true))}},
		node: fn3,
		want: st(0, []*pb.VirtualServer{cip(rsr("198.19.1.7", false, ReasonTerminatingFallback), rsr("198.19.2.7", false, ReasonTerminatingFallback))}, cipE),
	}, {
		name: "terminating fallback under ETP Local: local terminating endpoint, ClusterIP keeps remote ready one",
		in:   Input{Service: npLocal, Slices: []*model.EndpointSlice{slice("web-t", model.IPv4, termN1, readyN2)}}, node: fn1,
		want: st(0, []*pb.VirtualServer{cip(rs("198.19.2.5", 8080, false)),
			inCluster(vsOf(kNP, "", 30084, local, rsr("198.19.1.7", true, ReasonTerminatingFallback)), rs("198.19.2.5", 8080, false))},
			loopEntry(v4, "198.19.1.7", 8080, tcp), cipE,
			bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v4, 30084), bitmap(pb.IPSet_IP_SET_NODE_PORT_LOCAL_TCP, v4, 30084)),
	}, {
		name: "terminating fallback under ITP Local",
		in:   Input{Service: itpLocal, Slices: []*model.EndpointSlice{slice("web-t", model.IPv4, termN1, readyN2)}}, node: fn1,
		want: st(0, []*pb.VirtualServer{vsOf(kCIP, "198.18.0.10", 80, local, rsr("198.19.1.7", true, ReasonTerminatingFallback))},
			loopEntry(v4, "198.19.1.7", 8080, tcp), cipE),
	}, {
		name: "zone hints: only endpoints hinted for the node's zone",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{zoneSlice}}, node: fn3,
		want: st(1, []*pb.VirtualServer{cip(rsr("198.19.1.5", false, ReasonZoneHint), rsr("198.19.3.5", true, ReasonZoneHint))},
			loopEntry(v4, "198.19.3.5", 8080, tcp), cipE),
	}, {
		name: "zone hints: only ready endpoints need hints (an unhinted terminating one does not disable topology)",
		in: Input{Service: web, Slices: []*model.EndpointSlice{zoneSlice,
			slice("web-zt", model.IPv4, ep("198.19.2.9", "n2", false, false, true))}}, node: fn3,
		want: st(1, []*pb.VirtualServer{cip(rsr("198.19.1.5", false, ReasonZoneHint), rsr("198.19.3.5", true, ReasonZoneHint))},
			loopEntry(v4, "198.19.3.5", 8080, tcp), cipE),
	}, {
		name: "zone hints: no endpoint for the node's zone ignores hints",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{zoneSlice}}, node: fn4,
		want: st(0, []*pb.VirtualServer{cip(rs("198.19.1.5", 8080, false), rs("198.19.2.5", 8080, false), rs("198.19.3.5", 8080, false))}, cipE),
	}, {
		name: "zone hints missing on some endpoints: hints ignored",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{partialHints}}, node: fn3,
		want: st(0, []*pb.VirtualServer{cip(bothRemote...)}, cipE),
	}, {
		name: "zone hints do not narrow a Local policy",
		in:   Input{Service: npLocal, Slices: []*model.EndpointSlice{slice("web-z", model.IPv4, hinted(readyN1, []string{"zone-b"}), hinted(readyN2, []string{"zone-a"}))}},
		node: fn1,
		want: st(1, []*pb.VirtualServer{cip(rsr("198.19.2.5", false, ReasonZoneHint)), inCluster(vsOf(kNP, "", 30084, local, rs("198.19.1.5", 8080, true)), rsr("198.19.2.5", false, ReasonZoneHint))},
			loopN1, cipE, bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v4, 30084), bitmap(pb.IPSet_IP_SET_NODE_PORT_LOCAL_TCP, v4, 30084)),
	}, {
		name: "PreferSameNode: node hints for this node",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{nodeHints}}, node: fn1,
		want: st(1, []*pb.VirtualServer{cip(rsr("198.19.1.5", true, ReasonNodeHint))}, loopN1, cipE),
	}, {
		name: "PreferSameNode: node not hinted falls back to zone hints",
		in:   Input{Service: web, Slices: []*model.EndpointSlice{nodeHints}}, node: fn3,
		want: st(0, []*pb.VirtualServer{cip(rsr("198.19.1.5", false, ReasonZoneHint))}, cipE),
	}, {
		name: "dual-stack NodePort: one marker per family, entries per family",
		in:   Input{Service: dualNP, Slices: []*model.EndpointSlice{v6Slice, twoNodes}}, node: fn3,
		want: st(0, []*pb.VirtualServer{cip(bothRemote...), vsOf(kNP, "", 30085, cluster, bothRemote...),
			vsOf(kCIP, "2001:2:0:1::10", 80, cluster, rs6), with(vsOf(kNP, "", 30085, cluster, rs6), func(vs *pb.VirtualServer) { vs.Family = v6 })},
			cipE, cipEntry(v6, "2001:2:0:1::10", 80, tcp),
			bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v4, 30085), bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v6, 30085)),
	}, {
		name: "dual-stack LB with source ranges: each family gets its own IPs and ranges; node IPv6 in range",
		in:   Input{Service: dualLB, Slices: []*model.EndpointSlice{v6Slice, twoNodes}}, node: fn1,
		want: st(1, []*pb.VirtualServer{cip(both...),
			with(vsOf(kLB, "198.18.200.6", 80, cluster, both...), func(vs *pb.VirtualServer) { vs.SourceRanges = []string{"198.18.50.0/24"} }),
			vsOf(kCIP, "2001:2:0:1::10", 80, cluster, rs6),
			vsOf(kEXT, "2001:2:0:1::100", 80, cluster, rs6),
			with(vsOf(kLB, "2001:2:0:1::200", 80, cluster, rs6), func(vs *pb.VirtualServer) { vs.SourceRanges = []string{"2001:2:0:100::/64"} })},
			loopN1, cipE, cipEntry(v6, "2001:2:0:1::10", 80, tcp),
			ent(pb.IPSet_IP_SET_EXTERNAL_IP, v6, "2001:2:0:1::100", 80),
			ent(pb.IPSet_IP_SET_LOAD_BALANCER, v4, "198.18.200.6", 80),
			ent(pb.IPSet_IP_SET_LOAD_BALANCER, v6, "2001:2:0:1::200", 80),
			ent(pb.IPSet_IP_SET_LOAD_BALANCER_FW, v4, "198.18.200.6", 80),
			ent(pb.IPSet_IP_SET_LOAD_BALANCER_FW, v6, "2001:2:0:1::200", 80),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_IP, v6, "2001:2:0:1::200", 80), func(e *pb.IPSetEntry) { e.Ip2 = "2001:2:0:1::200" }),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR, v4, "198.18.200.6", 80), func(e *pb.IPSetEntry) { e.Net = "198.18.50.0/24" }),
			with2(ent(pb.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR, v6, "2001:2:0:1::200", 80), func(e *pb.IPSetEntry) { e.Net = "2001:2:0:100::/64" })),
	}, {
		name: "externalIP that is this node's address on one of the Service's NodePorts: reported, rest programmed",
		in:   Input{Service: npOnNode, Slices: []*model.EndpointSlice{altSlice}}, node: fn1,
		want: &pb.ServiceState{Namespace: "default", Name: "web",
			Problems: []string{"port alt/TCP externalIP 198.19.0.11: this node's NodePort address 198.19.0.11 and port 30086/TCP are NodePort 30086 of port http/TCP; served as NodePort only"},
			VirtualServers: []*pb.VirtualServer{
				cip(rs("198.19.2.5", 8080, false)),
				vsOf(kEXT, "198.19.0.11", 80, cluster, rs("198.19.2.5", 8080, false)),
				vsOf(kEXT, "198.18.100.7", 80, cluster, rs("198.19.2.5", 8080, false)),
				vsOf(kNP, "", 30086, cluster, rs("198.19.2.5", 8080, false)),
				alt(vsOf(kCIP, "198.18.0.10", 30086, cluster, rs("198.19.2.5", 8080, false))),
				alt(vsOf(kEXT, "198.18.100.7", 30086, cluster, rs("198.19.2.5", 8080, false)))},
			IpsetEntries: []*pb.IPSetEntry{cipE, cipEntry(v4, "198.18.0.10", 30086, tcp),
				ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.18.100.7", 80), ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.18.100.7", 30086),
				ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.19.0.11", 80),
				bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v4, 30086)}},
	}, {
		name: "same collision outside nodePortAddresses: no problem",
		in:   Input{Service: npOnNode, Slices: []*model.EndpointSlice{altSlice}}, node: fn1,
		cfg: Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.19.0.12/32")}},
		want: &pb.ServiceState{Namespace: "default", Name: "web",
			VirtualServers: []*pb.VirtualServer{
				cip(rs("198.19.2.5", 8080, false)),
				vsOf(kEXT, "198.19.0.11", 80, cluster, rs("198.19.2.5", 8080, false)),
				vsOf(kEXT, "198.18.100.7", 80, cluster, rs("198.19.2.5", 8080, false)),
				vsOf(kNP, "", 30086, cluster, rs("198.19.2.5", 8080, false)),
				alt(vsOf(kCIP, "198.18.0.10", 30086, cluster, rs("198.19.2.5", 8080, false))),
				alt(vsOf(kEXT, "198.19.0.11", 30086, cluster, rs("198.19.2.5", 8080, false))),
				alt(vsOf(kEXT, "198.18.100.7", 30086, cluster, rs("198.19.2.5", 8080, false)))},
			IpsetEntries: []*pb.IPSetEntry{cipE, cipEntry(v4, "198.18.0.10", 30086, tcp),
				ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.18.100.7", 80), ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.18.100.7", 30086),
				ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.19.0.11", 80), ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.19.0.11", 30086),
				bitmap(pb.IPSet_IP_SET_NODE_PORT_TCP, v4, 30086)}},
	}, {
		name: "externalIP equal to a load-balancer IP: one virtual server, reported",
		in:   Input{Service: extIsLB, Slices: []*model.EndpointSlice{twoNodes}}, node: fn4,
		want: &pb.ServiceState{Namespace: "default", Name: "web",
			Problems:       []string{"port http/TCP loadBalancer IP 198.18.200.8: same virtual server as port http/TCP externalIP 198.18.200.8; not programmed twice"},
			VirtualServers: []*pb.VirtualServer{cip(bothRemote...), vsOf(kEXT, "198.18.200.8", 80, cluster, bothRemote...)},
			IpsetEntries:   []*pb.IPSetEntry{cipE, ent(pb.IPSet_IP_SET_EXTERNAL_IP, v4, "198.18.200.8", 80)}},
	}}
}

func with2(e *pb.IPSetEntry, f func(*pb.IPSetEntry)) *pb.IPSetEntry { f(e); return e }

func TestServiceFeatures(t *testing.T) {
	for _, tc := range featureCases() {
		t.Run(tc.name, func(t *testing.T) {
			got := Service(tc.in, tc.node, tc.cfg)
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Service() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestVariantsContract checks, for every feature case's input, that nodes
// with equal keys get equal output, and that the keys separate what they
// must.
func TestVariantsContract(t *testing.T) {
	nodes := []*model.Node{fn1, fn2, fn3, fn4,
		{Name: "n5", Zone: "zone-a", Addresses: []netip.Addr{ip("198.19.0.15")}},
		{Name: "n6", Zone: "zone-a"},
		{Name: "n7", Zone: "zone-c", Addresses: []netip.Addr{ip("198.18.60.1")}},
		{Name: "n8"}}
	for _, tc := range featureCases() {
		t.Run(tc.name, func(t *testing.T) {
			v := VariantsOf(tc.in)
			byKey := map[string]*pb.ServiceState{}
			for _, n := range nodes {
				got := Service(tc.in, n, tc.cfg)
				k := v.Key(n)
				if prev, ok := byKey[k]; ok {
					if diff := cmp.Diff(prev, got, protocmp.Transform()); diff != "" {
						t.Errorf("nodes with key %q differ (-first +%s):\n%s", k, n.Name, diff)
					}
				}
				byKey[k] = got
			}
		})
	}
}

func TestVariantsKeys(t *testing.T) {
	n5 := &model.Node{Name: "n5", Zone: "zone-a", Addresses: []netip.Addr{ip("198.19.0.15")}}
	n6 := &model.Node{Name: "n6", Zone: "zone-a"}
	n7 := &model.Node{Name: "n7", Zone: "zone-b"}
	n8 := &model.Node{Name: "n8", Zone: "zone-c"}
	zoned := VariantsOf(Input{Service: web, Slices: []*model.EndpointSlice{slice("z", model.IPv4,
		hinted(readyN1, []string{"zone-a"}), hinted(readyN2, []string{"zone-b"}))}})
	for _, c := range []struct {
		v    Variants
		node *model.Node
		want string
	}{
		{zoned, fn1, "node/n1"},
		{zoned, n5, "zone/zone-a"},
		{zoned, n6, "zone/zone-a"},
		{zoned, n7, "zone/zone-b"},
		{zoned, n8, ""}, // unhinted zone: hints ignored, like a node without zone
		{zoned, fn4, ""},
		{VariantsOf(Input{Service: web, Slices: []*model.EndpointSlice{twoNodes}}), n5, ""}, // no hints: zones do not matter
	} {
		if got := c.v.Key(c.node); got != c.want {
			t.Errorf("Key(%s) = %q, want %q", c.node.Name, got, c.want)
		}
	}
	lb := VariantsOf(Input{Service: service(func(s *model.Service) {
		s.LoadBalancerIPs = []netip.Addr{ip("198.18.200.1")}
		s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24")}
	})})
	if a, b := lb.Key(n5), lb.Key(n6); a == b {
		t.Errorf("node inside the LB source range and node outside share key %q", a)
	}
	// A rollout step asks every reached node's key of every selected
	// Service: one-part keys are built once, not per call.
	rolled := VariantsOf(Input{Service: web, Slices: []*model.EndpointSlice{twoNodes},
		Rollouts: []*Rollout{{Name: "to-mh", Scheduler: "mh", Nodes: map[string]struct{}{"n7": {}}}}})
	for _, c := range []struct {
		v    Variants
		node *model.Node
		want string
	}{{rolled, n7, "rollout/to-mh"}, {rolled, n8, ""}, {zoned, n6, "zone/zone-a"}} {
		if got := c.v.Key(c.node); got != c.want {
			t.Errorf("Key(%s) = %q, want %q", c.node.Name, got, c.want)
		}
		if a := testing.AllocsPerRun(20, func() { c.v.Key(c.node) }); a != 0 {
			t.Errorf("Key(%s) = %q allocates %v times", c.node.Name, c.want, a)
		}
	}
}

// The scheduler a Service's virtual servers carry: its own (annotation)
// everywhere; else a rollout's on the nodes it reached; else none (the node
// default). Nodes with equal variant keys still get equal output.
func TestSchedulerChoiceAndVariants(t *testing.T) {
	rollout := &Rollout{Name: "to-mh", Scheduler: "mh", Flags: []model.SchedulerFlag{model.FlagMHFallback},
		Nodes: map[string]struct{}{"n1": {}, "n5": {}, "n6": {}}}
	own := service(func(s *model.Service) { s.Scheduler, s.SchedulerFlags = "sh", []model.SchedulerFlag{model.FlagSHPort} })
	nodes := []*model.Node{fn1, fn2, fn3, fn4, {Name: "n5"}, {Name: "n6"}, {Name: "n7"}}
	for _, tc := range []struct {
		name   string
		in     Input
		sched  map[string]string // node -> scheduler ("" default)
		source map[string]string
	}{
		{"rollout reaches some nodes", Input{Service: web, Slices: []*model.EndpointSlice{twoNodes}, Rollouts: []*Rollout{rollout}},
			map[string]string{"n1": "mh", "n5": "mh", "n6": "mh"},
			map[string]string{"n1": "SchedulerRollout to-mh", "n5": "SchedulerRollout to-mh", "n6": "SchedulerRollout to-mh"}},
		{"the Service's own scheduler wins everywhere", Input{Service: own, Slices: []*model.EndpointSlice{twoNodes}, Rollouts: []*Rollout{rollout}},
			map[string]string{"n1": "sh", "n2": "sh", "n3": "sh", "n4": "sh", "n5": "sh", "n6": "sh", "n7": "sh"},
			map[string]string{"n1": SchedulerSourceAnnotation, "n2": SchedulerSourceAnnotation, "n3": SchedulerSourceAnnotation,
				"n4": SchedulerSourceAnnotation, "n5": SchedulerSourceAnnotation, "n6": SchedulerSourceAnnotation, "n7": SchedulerSourceAnnotation}},
		{"no rollout, no annotation", Input{Service: web, Slices: []*model.EndpointSlice{twoNodes}}, nil, nil},
		{"a newer rollout layers over an older one", Input{Service: web, Slices: []*model.EndpointSlice{twoNodes},
			Rollouts: []*Rollout{{Name: "to-wlc", Scheduler: "wlc", Nodes: map[string]struct{}{"n1": {}, "n7": {}}}, rollout}},
			map[string]string{"n1": "wlc", "n7": "wlc", "n5": "mh", "n6": "mh"},
			map[string]string{"n1": "SchedulerRollout to-wlc", "n7": "SchedulerRollout to-wlc", "n5": "SchedulerRollout to-mh", "n6": "SchedulerRollout to-mh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := VariantsOf(tc.in)
			byKey := map[string]*pb.ServiceState{}
			for _, n := range nodes {
				got := Service(tc.in, n, Config{})
				if got.GetSchedulerSource() != tc.source[n.Name] {
					t.Errorf("%s: source %q, want %q", n.Name, got.GetSchedulerSource(), tc.source[n.Name])
				}
				for _, vs := range got.GetVirtualServers() {
					if vs.GetScheduler() != tc.sched[n.Name] {
						t.Errorf("%s: %s scheduler %q, want %q", n.Name, vs.GetAddress(), vs.GetScheduler(), tc.sched[n.Name])
					}
					wantFlag := map[string]pb.VirtualServerFlag{"mh": pb.VirtualServerFlag_VIRTUAL_SERVER_FLAG_MH_FALLBACK,
						"sh": pb.VirtualServerFlag_VIRTUAL_SERVER_FLAG_SH_PORT}[tc.sched[n.Name]]
					if wantFlag != 0 && !slices.Contains(vs.GetFlags(), wantFlag) {
						t.Errorf("%s: flags %v lack %v", n.Name, vs.GetFlags(), wantFlag)
					}
				}
				k := v.Key(n)
				if prev, ok := byKey[k]; ok {
					if diff := cmp.Diff(prev, got, protocmp.Transform()); diff != "" {
						t.Errorf("nodes with key %q differ (-first +%s):\n%s", k, n.Name, diff)
					}
				}
				byKey[k] = got
			}
		})
	}
}
