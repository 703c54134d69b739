package vmtests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
)

// Addresses the Services below use (contract: external IPs 198.18.100.x,
// LB IPs 198.18.200.x).
const (
	extIP = "198.18.100.1"
	// extLocalIP is also on node2's eth0: node2 must not bind it to kube-ipvs0.
	extLocalIP  = "198.18.100.2"
	lbIP        = "198.18.200.1"
	lbLocalIP   = "198.18.200.2"
	sctpPackage = "./e2e/vm/cmd/sctphelper"
)

// TestVMServiceSemantics proves kube-proxy's IPVS Service semantics (issue
// 4) with real traffic through real agents: two nodes in two zones, dual
// stack; pods pod-a, pod-a2 on node1 (zone-a), pod-b on node2 (zone-b);
// client routes the Service ranges via node1, client2 via node2. Every
// Service is created up front so that the cluster converges once; each
// subtest then checks one rule with traffic that would go elsewhere (or
// nowhere) without it.
func TestVMServiceSemantics(t *testing.T) {
	run := newVMRun(t, 9*time.Minute)
	ctx, phase := run.ctx, run.phase

	c := run.startCluster(cluster.Options{
		Nodes:           2,
		Pods:            [][]string{{"pod-a", "pod-a2"}, {"pod-b"}},
		Zones:           []string{"zone-a", "zone-b"},
		IPv6:            true,
		GoPackages:      []string{sctpPackage},
		ReconcilePeriod: reconcilePeriod,
		Log:             zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	e := &semEnv{c: c, ctx: ctx, client: c.Client, node1: c.Nodes[0], node2: c.Nodes[1]}
	var err error
	if e.client2, err = c.Topo.AddClient(ctx, "client2", e.node2); err != nil {
		t.Fatal(err)
	}
	phase("apiserver+control plane+VM+agents")

	s := e.createAll(t)
	phase("create Services and EndpointSlices")

	t.Run("NodePort TCP from a client and another node, UDP, split across backends", func(t *testing.T) { e.nodePort(t, s) })
	phase("NodePort")
	t.Run("ExternalIP from clients via either node", func(t *testing.T) { e.externalIP(t, s) })
	phase("ExternalIP")
	t.Run("LoadBalancer IP with loadBalancerSourceRanges allows and drops", func(t *testing.T) { e.loadBalancer(t, s) })
	phase("LoadBalancer source ranges")
	t.Run("ClientIP affinity sticks per client", func(t *testing.T) { e.affinity(t, s) })
	phase("affinity")
	t.Run("ETP Local keeps the client IP and rejects without local endpoint", func(t *testing.T) { e.etpLocal(t, s) })
	phase("ETP Local")
	t.Run("in-cluster clients of ETP Local addresses get Cluster semantics", func(t *testing.T) { e.inClusterLocal(t, s) })
	phase("ETP Local, in-cluster clients")
	t.Run("healthCheckNodePort answers 200/503 like kube-proxy", func(t *testing.T) { e.healthCheck(t, s) })
	phase("healthCheckNodePort")
	t.Run("ITP Local keeps ClusterIP traffic on the node's endpoints", func(t *testing.T) { e.itpLocal(t, s) })
	phase("ITP Local")
	t.Run("Pods of every cluster CIDR keep their source address to a ClusterIP", func(t *testing.T) { e.everyClusterCIDR(t, s) })
	phase("every cluster CIDR")
	t.Run("Services of another proxy are ignored", func(t *testing.T) { e.ignored(t, s) })
	phase("ignored Service")
	t.Run("terminating endpoints serve when none is ready", func(t *testing.T) { e.terminating(t, s) })
	phase("terminating fallback")
	t.Run("zone hints keep traffic in the node's zone", func(t *testing.T) { e.zones(t, s) })
	phase("zones")
	t.Run("IPv6 ClusterIP of a dual-stack Service", func(t *testing.T) { e.ipv6(t, s) })
	phase("IPv6")
	t.Run("SCTP ClusterIP and NodePort", func(t *testing.T) { e.sctp(t) })
	phase("SCTP")
}

// services holds the Services createAll made, as the apiserver returned them.
type services struct {
	np, ext, ext2, lb, aff, loc, loc6, term, zone, dual, itp, other *corev1.Service
}

func (e *semEnv) createAll(t *testing.T) *services {
	s := &services{}
	both := e.pods(t, false, "pod-a", "pod-b")

	s.np = e.create(t, service("np", corev1.ServiceTypeNodePort, 80, corev1.ProtocolTCP, corev1.ProtocolUDP))
	e.slice(t, s.np, discoveryv1.AddressTypeIPv4, both...)

	ext := service("ext", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP)
	ext.Spec.ExternalIPs = []string{extIP}
	s.ext = e.create(t, ext)
	e.slice(t, s.ext, discoveryv1.AddressTypeIPv4, both...)

	if _, err := e.c.RunInNode(e.ctx, "node2", "/usr/sbin/ip addr add "+extLocalIP+"/32 dev eth0"); err != nil {
		t.Fatal(err)
	}
	ext2 := service("ext2", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP)
	ext2.Spec.ExternalIPs = []string{extLocalIP}
	s.ext2 = e.create(t, ext2)
	e.slice(t, s.ext2, discoveryv1.AddressTypeIPv4, both...)

	lb := service("lb", corev1.ServiceTypeLoadBalancer, 80, corev1.ProtocolTCP)
	lb.Spec.LoadBalancerSourceRanges = []string{e.client.IP + "/32"}
	s.lb = e.create(t, lb)
	s.lb = e.setIngress(t, s.lb, lbIP)
	e.slice(t, s.lb, discoveryv1.AddressTypeIPv4, both...)

	aff := service("aff", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP)
	aff.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	s.aff = e.create(t, aff)
	e.slice(t, s.aff, discoveryv1.AddressTypeIPv4, e.pods(t, false, "pod-a", "pod-a2", "pod-b")...)

	loc := service("loc", corev1.ServiceTypeLoadBalancer, 80, corev1.ProtocolTCP)
	loc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	s.loc = e.create(t, loc)
	s.loc = e.setIngress(t, s.loc, lbLocalIP)
	e.slice(t, s.loc, discoveryv1.AddressTypeIPv4, e.pods(t, false, "pod-a", "pod-a2")...)

	// Dual-stack, ETP Local: one local endpoint per family on node1.
	loc6 := service("loc6", corev1.ServiceTypeLoadBalancer, 80, corev1.ProtocolTCP)
	loc6.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	dualPolicy := corev1.IPFamilyPolicyRequireDualStack
	loc6.Spec.IPFamilyPolicy = &dualPolicy
	s.loc6 = e.create(t, loc6)
	e.slice(t, s.loc6, discoveryv1.AddressTypeIPv4, e.pods(t, false, "pod-a")...)
	e.slice(t, s.loc6, discoveryv1.AddressTypeIPv6, e.pods(t, true, "pod-a")...)

	s.term = e.create(t, service("term", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP))
	e.slice(t, s.term, discoveryv1.AddressTypeIPv4, e.terminatingEndpoints(t)...)

	zone := service("zone", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP)
	pc := corev1.ServiceTrafficDistributionPreferClose
	zone.Spec.TrafficDistribution = &pc
	s.zone = e.create(t, zone)
	za, zb := e.pods(t, false, "pod-a")[0], e.pods(t, false, "pod-b")[0]
	za.Zone, za.HintZones = "zone-a", []string{"zone-a"}
	zb.Zone, zb.HintZones = "zone-b", []string{"zone-b"}
	e.slice(t, s.zone, discoveryv1.AddressTypeIPv4, za, zb)

	dual := service("dual", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP)
	req := corev1.IPFamilyPolicyRequireDualStack
	dual.Spec.IPFamilyPolicy = &req
	dual.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	s.dual = e.create(t, dual)
	e.slice(t, s.dual, discoveryv1.AddressTypeIPv4, both...)
	e.slice(t, s.dual, discoveryv1.AddressTypeIPv6, e.pods(t, true, "pod-a", "pod-b")...)

	itp := service("itp", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP)
	local := corev1.ServiceInternalTrafficPolicyLocal
	itp.Spec.InternalTrafficPolicy = &local
	s.itp = e.create(t, itp)
	e.slice(t, s.itp, discoveryv1.AddressTypeIPv4, both...)

	// kube-proxy ignores Services of another proxy (service-proxy-name label).
	other := service("other", corev1.ServiceTypeClusterIP, 80, corev1.ProtocolTCP)
	other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
	s.other = e.create(t, other)
	e.slice(t, s.other, discoveryv1.AddressTypeIPv4, both...)

	// Each client reaches the external and LB IPs through a chosen node.
	for _, r := range []struct {
		from *vm.Netns
		dst  string
		via  *vm.Node
	}{
		{e.client, "198.18.100.0/24", e.node1}, {e.client2, "198.18.100.0/24", e.node2},
		// Source ranges are enforced by node1 for both clients.
		{e.client, lbIP + "/32", e.node1}, {e.client2, lbIP + "/32", e.node1},
		{e.client, lbLocalIP + "/32", e.node1}, {e.client2, lbLocalIP + "/32", e.node2},
		// Affinity: both clients through node1's IPVS.
		{e.client2, s.aff.Spec.ClusterIP + "/32", e.node1},
	} {
		if err := r.from.RouteVia(e.ctx, r.dst, r.via); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func nodePortOf(t *testing.T, svc *corev1.Service, proto corev1.Protocol) int32 {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Protocol == proto && p.NodePort != 0 {
			return p.NodePort
		}
	}
	t.Fatalf("Service %s has no %s nodePort: %+v", svc.Name, proto, svc.Spec.Ports)
	return 0
}

func hostPort(ip string, port int32) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

func (e *semEnv) nodePort(t *testing.T, s *services) {
	tcp, udp := nodePortOf(t, s.np, corev1.ProtocolTCP), nodePortOf(t, s.np, corev1.ProtocolUDP)
	_, out := e.await(t, e.client, "tcp", hostPort(e.node1.IP, tcp), 20, only("pod-a", "pod-b"))
	// ETP Cluster: external NodePort traffic is masqueraded (kube-proxy's KUBE-NODE-PORT).
	for b, srcs := range peers(out) {
		if slices.Contains(srcs, e.client.IP) {
			t.Errorf("%s saw the client's own address %s through an ETP Cluster NodePort (want it masqueraded): %v", b, e.client.IP, srcs)
		}
	}
	e.await(t, e.nodeNs(e.node2), "tcp", hostPort(e.node1.IP, tcp), 10, only("pod-a", "pod-b"))
	e.await(t, e.client, "tcp", hostPort(e.node2.IP, tcp), 10, only("pod-a", "pod-b"))
	// Empty nodePortAddresses: every node address, the pod gateway on the
	// pod veths too (TestVMNodeSettings checks the restricted case).
	e.await(t, e.client, "tcp", hostPort(e.node1.PodGW, tcp), 10, only("pod-a", "pod-b"))
	e.await(t, e.client, "udp", hostPort(e.node1.IP, udp), 20, only("pod-a", "pod-b"))
	e.await(t, e.nodeNs(e.node1), "udp", hostPort(e.node2.IP, udp), 10, only("pod-a", "pod-b"))
	addrs, err := e.kubeIPVS0(e.ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(addrs, " "+e.node1.IP+"/") {
		t.Errorf("node1's own address is bound to kube-ipvs0 (NodePorts must never be):\n%s", addrs)
	}
}

func (e *semEnv) externalIP(t *testing.T, s *services) {
	e.await(t, e.client, "tcp", hostPort(extIP, 80), 20, only("pod-a", "pod-b"))
	e.await(t, e.client2, "tcp", hostPort(extIP, 80), 10, only("pod-a", "pod-b"))
	addrs, err := e.kubeIPVS0(e.ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(addrs, " "+extIP+"/32 ") || !strings.Contains(addrs, " "+extLocalIP+"/32 ") {
		t.Errorf("external IPs %s and %s are not both bound to node1's kube-ipvs0 (no other interface holds them):\n%s", extIP, extLocalIP, addrs)
	}
	// node2 holds extLocalIP on eth0: served, but not bound to kube-ipvs0.
	e.await(t, e.client2, "tcp", hostPort(extLocalIP, 80), 10, only("pod-a", "pod-b"))
	if addrs, err = e.kubeIPVS0(e.ctx, "node2"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(addrs, " "+extLocalIP+"/") {
		t.Errorf("node2 bound %s to kube-ipvs0 although its eth0 holds it:\n%s", extLocalIP, addrs)
	}
	if !strings.Contains(addrs, " "+extIP+"/32 ") {
		t.Errorf("external IP %s is not bound to node2's kube-ipvs0:\n%s", extIP, addrs)
	}
}

func (e *semEnv) loadBalancer(t *testing.T, s *services) {
	lb := hostPort(lbIP, 80)
	e.await(t, e.client, "tcp", lb, 10, only("pod-a", "pod-b"))
	if err := e.c.AwaitAcked(e.ctx, semConverge); err != nil {
		t.Fatal(err)
	}
	out := e.mustFail(t, e.client2, "tcp", lb, 3, "1s")
	t.Logf("client2 (%s, not in loadBalancerSourceRanges) -> %s: %q", e.client2.IP, lb, failLines(out))
	out = e.mustFail(t, e.nodeNs(e.node1), "tcp", lb, 3, "1s")
	t.Logf("node1 (not in loadBalancerSourceRanges) -> %s: %q", lb, failLines(out))
	// The allowed client still gets through.
	e.await(t, e.client, "tcp", lb, 10, only("pod-a", "pod-b"))

	// A range holding node1's address lets node1 itself in (kube-proxy's
	// KUBE-LOAD-BALANCER-SOURCE-IP entry), still not client2.
	cur, err := e.c.Kube.CoreV1().Services(ns).Get(e.ctx, "lb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.LoadBalancerSourceRanges = []string{e.client.IP + "/32", e.node1.IP + "/32"}
	if _, err := e.c.Kube.CoreV1().Services(ns).Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.await(t, e.nodeNs(e.node1), "tcp", lb, 10, only("pod-a", "pod-b"))
	if err := e.c.AwaitAcked(e.ctx, semConverge); err != nil {
		t.Fatal(err)
	}
	e.mustFail(t, e.client2, "tcp", lb, 3, "1s")
}

func (e *semEnv) affinity(t *testing.T, s *services) {
	vip := s.aff.Spec.ClusterIP
	addr := hostPort(vip, 80)
	all := []string{"pod-a", "pod-a2", "pod-b"}
	// The first burst may start before the Service is programmed.
	first, _ := e.await(t, e.client, "tcp", addr, 5, anyOf(all...))
	t.Logf("client's first burst: %v", first.Backends)
	tab, err := e.table(e.ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range tab.Find(vip, 80) {
		keys = append(keys, k)
	}
	if len(keys) != 1 || !strings.Contains(keys[0], "persistent 10800") {
		t.Errorf("want one virtual server on %s with persistent 10800 (the default timeoutSeconds), have %v", addr, keys)
	}
	if len(keys) == 1 && strings.Fields(keys[0])[2] != "rr" {
		t.Errorf("session affinity must keep the default scheduler rr: %s", keys[0])
	}
	s1, _ := e.try(t, e.client, "tcp", addr, 30, "2s")
	s2, _ := e.try(t, e.client2, "tcp", addr, 30, "2s")
	if s1.OK != 30 || len(s1.Backends) != 1 {
		t.Errorf("client: 30 requests want one backend, got %d ok, %v", s1.OK, s1.Backends)
	}
	if s2.OK != 30 || len(s2.Backends) != 1 {
		t.Errorf("client2: 30 requests want one backend, got %d ok, %v", s2.OK, s2.Backends)
	}
	// rr picks the next real server for a client without a persistence
	// template, so the second client lands elsewhere.
	if fmt.Sprint(s1.Backends) == fmt.Sprint(s2.Backends) {
		t.Errorf("both clients were sent to the same backend %v: affinity must be per client", s1.Backends)
	}
}

func (e *semEnv) etpLocal(t *testing.T, s *services) {
	// Everything programmed first: a NodePort virtual server answering
	// before its KUBE-NODE-PORT-LOCAL-TCP entry exists masquerades (seen
	// when this subtest ran alone).
	if err := e.c.AwaitAcked(e.ctx, semConverge); err != nil {
		t.Fatal(err)
	}
	np := nodePortOf(t, s.loc, corev1.ProtocolTCP)
	check := func(out, what string) {
		for b, srcs := range peers(out) {
			if !slices.Equal(srcs, []string{e.client.IP}) {
				t.Errorf("%s: backend %s saw sources %v, want only the client's %s (no SNAT with ETP Local)", what, b, srcs, e.client.IP)
			}
		}
	}
	_, out := e.await(t, e.client, "tcp", hostPort(e.node1.IP, np), 10, anyOf("pod-a", "pod-a2"))
	check(out, "NodePort on node1")
	_, out = e.await(t, e.client, "tcp", hostPort(lbLocalIP, 80), 10, anyOf("pod-a", "pod-a2"))
	check(out, "LB IP via node1")

	// node2 has no local endpoint: its virtual servers exist with no real
	// server, and IPVS answers with a port-unreachable (connection refused).
	if rs := e.awaitVS(t, "node2", "tcp", e.node2.IP, np); len(rs) != 0 {
		t.Errorf("node2 NodePort virtual server has real servers %v, want none (ETP Local, no local endpoint)", rs)
	}
	if rs := e.awaitVS(t, "node2", "tcp", lbLocalIP, 80); len(rs) != 0 {
		t.Errorf("node2 LB virtual server has real servers %v, want none (ETP Local, no local endpoint)", rs)
	}
	// Refused, not timed out, and fast: every request must fail with
	// "connection refused" (a dropped SYN fails with a timeout instead), and
	// the whole burst must end within half of ONE request's timeout. The
	// time includes starting e2ehelper in the guest, a few hundred ms on TCG
	// and more on a loaded host, so the bound is generous; yet a single
	// request that waited for its timeout exceeds it.
	const requests, perRequest = 5, 10 * time.Second
	refusalBound := perRequest / 2
	for _, target := range []struct {
		from *vm.Netns
		addr string
	}{{e.client, hostPort(e.node2.IP, np)}, {e.client2, hostPort(lbLocalIP, 80)}} {
		began := time.Now()
		out := e.mustFail(t, target.from, "tcp", target.addr, requests, perRequest.String())
		took := time.Since(began)
		fails := failLines(out)
		if len(fails) != requests {
			t.Errorf("%s -> %s: %d failed requests, want all %d refused:\n%s", target.from.Name, target.addr, len(fails), requests, tail(out, 8))
		}
		for _, f := range fails {
			if !strings.Contains(f, "connection refused") {
				t.Errorf("%s -> %s: want a fast connection refused, got %q", target.from.Name, target.addr, f)
			}
		}
		if took > refusalBound {
			t.Errorf("%s -> %s: %d refusals took %v, want under %v (one request's timeout is %v): not a fast refusal",
				target.from.Name, target.addr, len(fails), took.Round(time.Millisecond), refusalBound, perRequest)
		}
		t.Logf("%s -> %s: %d refusals in %v: %q", target.from.Name, target.addr, len(fails), took.Round(time.Millisecond), fails)
	}
}

// inClusterLocal: the Local policy is for external clients; in-cluster ones
// get Cluster semantics. node2 has no endpoint of loc or loc6, so etpLocal's
// outside clients are refused there, but node2's Pod and node2 itself reach
// the endpoints on node1, masqueraded to node2's address (the connection
// crosses nodes); on node1 a Pod gets them too. A Pod of node1 reaching
// node2's NodePort is external there, as upstream's e2e ("should fallback
// to local terminating endpoints ... externalTrafficPolicy=Local") expects:
// refused.
func (e *semEnv) inClusterLocal(t *testing.T, s *services) {
	np := nodePortOf(t, s.loc, corev1.ProtocolTCP)
	var np6 int32
	for _, p := range s.loc6.Spec.Ports {
		np6 = p.NodePort // one port, both families
	}
	podA, podB := e.c.Pods["pod-a"], e.c.Pods["pod-b"]
	node2 := &e.node2.Netns
	for _, c := range []struct {
		from      *vm.Netns
		addr, src string
		backends  []string
	}{
		{&podB.Netns, hostPort(lbLocalIP, 80), e.node2.IP, []string{"pod-a", "pod-a2"}},
		{&podB.Netns, hostPort(e.node2.IP, np), e.node2.IP, []string{"pod-a", "pod-a2"}},
		{node2, hostPort(lbLocalIP, 80), e.node2.IP, []string{"pod-a", "pod-a2"}},
		{node2, hostPort(e.node2.IP, np), e.node2.IP, []string{"pod-a", "pod-a2"}},
		{&podB.Netns, hostPort(e.node2.IP6, np6), e.node2.IP6, []string{"pod-a"}},
		{&podA.Netns, hostPort(lbLocalIP, 80), "", []string{"pod-a", "pod-a2"}},
	} {
		_, out := e.await(t, c.from, "tcp", c.addr, 6, anyOf(c.backends...))
		if c.src == "" {
			continue
		}
		for b, srcs := range peers(out) {
			if !slices.Equal(srcs, []string{c.src}) {
				t.Errorf("%s -> %s: backend %s saw sources %v, want only node2's %s (masqueraded)", c.from.Name, c.addr, b, srcs, c.src)
			}
		}
	}
	out := e.mustFail(t, &podA.Netns, "tcp", hostPort(e.node2.IP, np), 3, "2s")
	for _, f := range failLines(out) {
		if !strings.Contains(f, "connection refused") {
			t.Errorf("pod-a -> node2's NodePort: want connection refused (external: no local endpoint), got %q", f)
		}
	}
}

func (e *semEnv) healthCheck(t *testing.T, s *services) {
	hc := s.loc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatalf("Service loc (LoadBalancer, ETP Local) got no healthCheckNodePort from the apiserver")
	}
	for _, n := range []struct {
		node          *vm.Node
		status, local int
	}{{e.node1, 200, 2}, {e.node2, 503, 0}} {
		addr := hostPort(n.node.IP, hc)
		var last error // the last answer, not the deadline cutting a call short
		err := cluster.Await(e.ctx, semConverge, poll, func(ctx context.Context) error {
			r, err := e.c.HTTPGet(ctx, e.client, addr, "/", 3)
			if err == nil {
				err = checkHC(r, "loc", n.status, n.local)
			}
			if ctx.Err() == nil {
				last = err
			}
			return err
		})
		if err != nil {
			t.Errorf("health check %s (%s): %v; last answer: %v", addr, n.node.Name, err, last)
		} else {
			t.Logf("health check %s (%s): %d, localEndpoints %d", addr, n.node.Name, n.status, n.local)
		}
	}
	// A dual-stack Service answers per family, like kube-proxy's per-family
	// health servers: node1 has one local endpoint of each family.
	hc6 := s.loc6.Spec.HealthCheckNodePort
	for _, addr := range []string{hostPort(e.node1.IP, hc6), net.JoinHostPort(e.node1.IP6, fmt.Sprint(hc6))} {
		var last error
		if err := cluster.Await(e.ctx, semConverge, poll, func(ctx context.Context) error {
			r, err := e.c.HTTPGet(ctx, e.client, addr, "/", 3)
			if err == nil {
				err = checkHC(r, "loc6", 200, 1)
			}
			if ctx.Err() == nil {
				last = err
			}
			return err
		}); err != nil {
			t.Errorf("dual-stack health check %s: %v; last answer: %v", addr, err, last)
		} else {
			t.Logf("dual-stack health check %s: 200, localEndpoints 1", addr)
		}
	}
	// The node's own /healthz on kube-proxy's port 10256, which load
	// balancers of ETP Cluster Services probe.
	addr := hostPort(e.node1.IP, 10256)
	var last error
	err := cluster.Await(e.ctx, semConverge, poll, func(ctx context.Context) error {
		r, err := e.c.HTTPGet(ctx, e.client, addr, "/healthz", 3)
		if err == nil {
			var b struct {
				LastUpdated  string `json:"lastUpdated"`
				CurrentTime  string `json:"currentTime"`
				NodeEligible *bool  `json:"nodeEligible"`
				Healthy      *bool  `json:"healthy"`
				Status       map[string]struct {
					Healthy bool `json:"healthy"`
				} `json:"status"`
			}
			switch err = json.Unmarshal([]byte(r.Body), &b); {
			case err != nil:
			case r.Status != 200:
				err = fmt.Errorf("status %d", r.Status)
			case b.LastUpdated == "" || b.CurrentTime == "" || b.NodeEligible == nil || !*b.NodeEligible ||
				b.Healthy == nil || !*b.Healthy || len(b.Status) != 2 || !b.Status["IPv4"].Healthy || !b.Status["IPv6"].Healthy:
				// kube-proxy v1.37's body; this dual-stack agent reports both families.
				err = fmt.Errorf("body %q is not kube-proxy's healthy /healthz", r.Body)
			}
		}
		if ctx.Err() == nil {
			last = err
		}
		return err
	})
	if err != nil {
		t.Errorf("node /healthz %s: %v; last answer: %v", addr, err, last)
	}
}

// terminatingEndpoints: pod-a and pod-b terminating but serving, pod-a2
// terminating and not serving; none ready.
func (e *semEnv) terminatingEndpoints(t *testing.T) []cluster.Endpoint {
	eps := e.pods(t, false, "pod-a", "pod-b", "pod-a2")
	for i := range eps {
		eps[i].NotReady, eps[i].Terminating = true, true
	}
	eps[2].NotServing = true
	return eps
}

func (e *semEnv) terminating(t *testing.T, s *services) {
	addr := hostPort(s.term.Spec.ClusterIP, 80)
	e.await(t, e.client, "tcp", addr, 20, only("pod-a", "pod-b"))
	// A ready endpoint wins over serving terminating ones.
	eps := e.terminatingEndpoints(t)
	eps[2].NotReady, eps[2].NotServing, eps[2].Terminating = false, false, false
	e.slice(t, s.term, discoveryv1.AddressTypeIPv4, eps...)
	e.await(t, e.client, "tcp", addr, 10, only("pod-a2"))
}

func (e *semEnv) zones(t *testing.T, s *services) {
	addr := hostPort(s.zone.Spec.ClusterIP, 80)
	e.await(t, e.client, "tcp", addr, 20, only("pod-a"))
	e.await(t, e.client2, "tcp", addr, 20, only("pod-b"))
	for node, want := range map[string]string{"node1": e.ip("pod-a"), "node2": e.ip("pod-b")} {
		if rs := e.awaitVS(t, node, "tcp", s.zone.Spec.ClusterIP, 80); !slices.Equal(rs, []string{want + ":8080 w=1"}) {
			t.Errorf("%s (zone %s) serves %v, want only its zone's %s", node, map[string]string{"node1": "zone-a", "node2": "zone-b"}[node], rs, want)
		}
	}
}

func (e *semEnv) ipv6(t *testing.T, s *services) {
	// The agents run with --ipv6 auto: they found the nodes' global IPv6
	// addresses and said so in their capabilities.
	for _, n := range []string{"node1", "node2"} {
		if a, ok := e.c.Replica.Streams.Registry().Agent(n); !ok || !a.GetCapabilities().GetIpv6() {
			t.Fatalf("%s's agent did not detect IPv6 (capabilities %v)", n, a.GetCapabilities())
		}
	}
	var v4, v6 string
	for _, ip := range s.dual.Spec.ClusterIPs {
		if strings.Contains(ip, ":") {
			v6 = ip
		} else {
			v4 = ip
		}
	}
	if v4 == "" || v6 == "" {
		t.Fatalf("dual-stack Service got ClusterIPs %v, want one per family", s.dual.Spec.ClusterIPs)
	}
	_, out := e.await(t, e.client, "tcp", hostPort(v6, 80), 20, only("pod-a", "pod-b"))
	for b, srcs := range peers(out) {
		for _, src := range srcs {
			if !strings.Contains(src, ":") {
				t.Errorf("%s answered an IPv6 request from IPv4 source %s", b, src)
			}
		}
	}
	e.await(t, e.client, "tcp", hostPort(v4, 80), 10, only("pod-a", "pod-b"))
	e.await(t, e.client2, "tcp", hostPort(v6, 80), 10, only("pod-a", "pod-b"))
	addrs, err := e.kubeIPVS0(e.ctx, "node1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(addrs, " "+v6+"/128 ") {
		t.Errorf("IPv6 ClusterIP %s not bound to node1's kube-ipvs0:\n%s", v6, addrs)
	}
}

// sctp needs the sctp module and IPVS's SCTP support in the test bed's
// kernel; without them it fails (never skips).
func (e *semEnv) sctp(t *testing.T) {
	res, err := e.c.VM.Run(e.ctx, `modprobe sctp; test -d /sys/module/sctp || { echo "no sctp module: $(ls /lib/modules/*/kernel/net/sctp 2>&1)"; exit 1; }
ipvsadm -A --sctp-service 198.18.0.250:9 && ipvsadm -D --sctp-service 198.18.0.250:9 || { echo "IPVS has no SCTP support"; exit 1; }`)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("the VM test bed lost SCTP (scripts/vm/build-initramfs.sh must ship kernel/net/sctp; the kernel needs CONFIG_IP_VS_PROTO_SCTP): %v", err)
	}
	for _, p := range []string{"pod-a", "pod-b"} {
		proc, err := e.c.Pods[p].Start(e.ctx, "sctp-"+p, fmt.Sprintf("sctphelper serve --name %s --addr :%d", p, cluster.ServePort))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := proc.AwaitLog(e.ctx, "ready"); err != nil {
			t.Fatalf("SCTP server in %s: %v", p, err)
		}
	}
	svc := e.create(t, service("sctp", corev1.ServiceTypeNodePort, 80, corev1.ProtocolSCTP))
	e.slice(t, svc, discoveryv1.AddressTypeIPv4, e.pods(t, false, "pod-a", "pod-b")...)
	np := nodePortOf(t, svc, corev1.ProtocolSCTP)
	e.await(t, e.client, "sctp", hostPort(svc.Spec.ClusterIP, 80), 10, only("pod-a", "pod-b"))
	e.await(t, e.client, "sctp", hostPort(e.node1.IP, np), 10, only("pod-a", "pod-b"))
	e.await(t, e.nodeNs(e.node1), "sctp", hostPort(e.node2.IP, np), 10, only("pod-a", "pod-b"))
	// SCTP NodePorts live in the hash:ip,port set, one entry per node address.
	sets, err := e.c.RunInNode(e.ctx, "node1", "ipset list KUBE-NODE-PORT-SCTP-HASH")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s,sctp:%d", e.node1.IP, np); !strings.Contains(sets, want) {
		t.Errorf("KUBE-NODE-PORT-SCTP-HASH on node1 lacks %s:\n%s", want, sets)
	}
}

func (e *semEnv) itpLocal(t *testing.T, s *services) {
	addr := hostPort(s.itp.Spec.ClusterIP, 80)
	e.await(t, e.client, "tcp", addr, 10, only("pod-a"))
	e.await(t, e.client2, "tcp", addr, 10, only("pod-b"))
}

// everyClusterCIDR: the cluster CIDRs are both nodes' pod CIDRs (two per
// family), so pod-b's addresses are in the second of each family. Its
// connections to ClusterIPs whose endpoints are on node1 must keep its
// source address (no masquerade), over IPv4 and IPv6.
func (e *semEnv) everyClusterCIDR(t *testing.T, s *services) {
	pod := e.c.Pods["pod-b"]
	var v6 string
	for _, ip := range s.loc6.Spec.ClusterIPs {
		if strings.Contains(ip, ":") {
			v6 = ip
		}
	}
	for _, c := range []struct{ addr, src string }{
		{hostPort(s.loc.Spec.ClusterIP, 80), pod.IP}, // pod-a, pod-a2
		{hostPort(v6, 80), pod.IP6},                  // pod-a
	} {
		_, out := e.await(t, &pod.Netns, "tcp", c.addr, 6, nil)
		for b, srcs := range peers(out) {
			for _, src := range srcs {
				if src != c.src {
					t.Errorf("%s saw %s from pod-b (%s) through ClusterIP %s: masqueraded (pod-b is in the second cluster CIDR)", b, src, c.src, c.addr)
				}
			}
		}
	}
}

func (e *semEnv) ignored(t *testing.T, s *services) {
	// Everything else is programmed and acknowledged by now.
	if err := e.c.AwaitAcked(e.ctx, semConverge); err != nil {
		t.Fatal(err)
	}
	vip := s.other.Spec.ClusterIP
	for _, n := range []string{"node1", "node2"} {
		tab, err := e.table(e.ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if got := tab.Find(vip, 80); len(got) != 0 {
			t.Errorf("%s programmed Service other (service-proxy-name someone-else): %v", n, got)
		}
	}
	e.mustFail(t, e.client, "tcp", hostPort(vip, 80), 2, "1s")
}
