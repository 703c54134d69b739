package model

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Fuzz targets: the objects are built from fuzzed JSON (inputs that do not
// unmarshal are skipped); each checks what the conversion promises in its
// doc comments and model.go. Run one at a time:
// go test -run '^$' -fuzz '^FuzzConvertService$' ./controlplane/model

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// plainIP is what parseIP promises: valid, no zone, not IPv4-mapped, not
// unspecified.
func plainIP(a netip.Addr) bool {
	return a.IsValid() && a.Zone() == "" && !a.Is4In6() && !a.IsUnspecified()
}

func checkProblems(t *testing.T, ps []Problem, kind, object string, whole bool) {
	t.Helper()
	for i, p := range ps {
		if p.Kind != kind || p.Object != object || p.Reason == "" || p.Detail == "" {
			t.Fatalf("problem %d incomplete: %+v (want kind %s object %s)", i, p, kind, object)
		}
		if p.Dropped == whole {
			t.Fatalf("problem %d: Dropped=%v, but the object was skipped=%v: %+v", i, p.Dropped, whole, p)
		}
	}
}

func FuzzConvertService(f *testing.F) {
	f.Add(mustJSON(svc(nil)))
	f.Add(mustJSON(svc(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ClusterIPs = []string{"198.18.0.1", "2001:2:0:1::1"}
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053},
			corev1.ServicePort{Name: "bad", Protocol: "ICMP", Port: 1})
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
		s.Spec.ExternalIPs = []string{"198.18.100.1", "2001:2:0:1::100", "127.0.0.1", "fe80::1%eth0"}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32000
		s.Spec.LoadBalancerSourceRanges = []string{" 198.18.2.0/24 ", "bad", "::ffff:198.18.0.0/112"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.200.1"}, {Hostname: "lb.example"},
			{IP: "198.18.200.2", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}, {IP: "198.18.200.1"}}
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		s.Spec.TrafficDistribution = ptr.To("PreferClose")
	})))
	f.Add(mustJSON(svc(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports = []corev1.ServicePort{{Name: "a", Port: 80, NodePort: 30080}, {Name: "b", Port: 81, NodePort: 30080}, {Name: "a", Port: 82}}
	})))
	f.Add(mustJSON(svc(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"198.18.0.300"} })))
	f.Add(mustJSON(svc(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", nil })))
	f.Add([]byte(`{"metadata":{"name":"x","namespace":"y"},"spec":{"clusterIP":"::ffff:198.18.0.1","ports":[{"port":70000,"nodePort":-1}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s corev1.Service
		if json.Unmarshal(b, &s) != nil {
			return
		}
		out, ps := ConvertService(&s)
		out2, ps2 := ConvertService(&s)
		if d := cmp.Diff(out, out2, addrCmp, prefixCmp); d != "" || !slices.Equal(ps, ps2) {
			t.Fatalf("not deterministic: %s", d)
		}
		key := ServiceKey{Namespace: s.Namespace, Name: s.Name}
		if out == nil {
			if len(ps) > 0 {
				checkProblems(t, ps, "Service", key.String(), true)
			}
			return
		}
		checkProblems(t, ps, "Service", key.String(), false)
		checkService(t, &s, out, len(ps) > 0)
	})
}

// checkService checks the promises of model.Service and that nothing is
// dropped silently (hasProblems).
func checkService(t *testing.T, s *corev1.Service, out *Service, hasProblems bool) {
	t.Helper()
	if out.Key != (ServiceKey{Namespace: s.Namespace, Name: s.Name}) {
		t.Fatalf("key %v", out.Key)
	}
	dropped := func(what string) {
		t.Helper()
		if !hasProblems {
			t.Fatalf("%s dropped without a problem", what)
		}
	}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{s.Spec.ClusterIP}
	}
	if len(out.ClusterIPs) == 0 || len(out.ClusterIPs) > 2 {
		t.Fatalf("%d cluster IPs", len(out.ClusterIPs))
	}
	if len(out.ClusterIPs) < len(ips) {
		dropped("cluster IP")
	}
	fams := map[Family]bool{}
	for _, ip := range out.ClusterIPs {
		if !plainIP(ip) || fams[FamilyOf(ip)] {
			t.Fatalf("cluster IP %v (bad, or second of its family)", ip)
		}
		fams[FamilyOf(ip)] = true
	}
	for _, set := range [][]netip.Addr{out.ExternalIPs, out.LoadBalancerIPs} {
		seen := map[netip.Addr]bool{}
		for _, ip := range set {
			if !plainIP(ip) || notSpecial(ip) != nil || !fams[FamilyOf(ip)] || seen[ip] {
				t.Fatalf("external/LB IP %v: bad, special, duplicate or of a family without cluster IP", ip)
			}
			seen[ip] = true
		}
		if len(seen) != len(set) {
			t.Fatal("duplicates")
		}
	}
	if len(out.ExternalIPs) < len(s.Spec.ExternalIPs) {
		dropped("external IP")
	}
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
			continue
		}
		ip, err := netip.ParseAddr(ing.IP)
		if err != nil || !slices.Contains(out.LoadBalancerIPs, ip) {
			dropped("load balancer IP " + ing.IP)
		}
	}
	seenR := map[netip.Prefix]bool{}
	for _, p := range out.LoadBalancerSourceRanges {
		if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" || p.Addr().Is4In6() || seenR[p] {
			t.Fatalf("source range %v: invalid, unmasked, zoned, mapped or duplicate", p)
		}
		seenR[p] = true
	}
	for _, r := range s.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil || !seenR[p.Masked()] {
			dropped("source range " + r)
		}
	}
	if len(out.Ports) < len(s.Spec.Ports) {
		dropped("port")
	}
	type named struct {
		name  string
		proto Protocol
	}
	type numbered struct {
		port  uint16
		proto Protocol
	}
	byPort, byName, byNodePort := map[numbered]bool{}, map[named]bool{}, map[numbered]bool{}
	for _, p := range out.Ports {
		if p.Port == 0 || p.Protocol == ProtocolUnknown || byPort[numbered{p.Port, p.Protocol}] || byName[named{p.Name, p.Protocol}] {
			t.Fatalf("port %+v: zero, unknown protocol or duplicate", p)
		}
		byPort[numbered{p.Port, p.Protocol}], byName[named{p.Name, p.Protocol}] = true, true
		if p.NodePort != 0 {
			if out.Type == ServiceTypeClusterIP || byNodePort[numbered{p.NodePort, p.Protocol}] {
				t.Fatalf("nodePort %d on a ClusterIP Service or twice", p.NodePort)
			}
			byNodePort[numbered{p.NodePort, p.Protocol}] = true
		}
	}
	for _, sp := range s.Spec.Ports {
		if sp.NodePort == 0 {
			continue
		}
		if !slices.ContainsFunc(out.Ports, func(p ServicePort) bool { return int32(p.NodePort) == sp.NodePort && int32(p.Port) == sp.Port }) {
			dropped("nodePort")
		}
	}
	if out.Sticky != (s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP) ||
		(out.Sticky && (out.StickyTimeoutSeconds < 1 || out.StickyTimeoutSeconds > maxStickyTimeoutSeconds)) ||
		(!out.Sticky && out.StickyTimeoutSeconds != 0) {
		t.Fatalf("sticky %v timeout %d", out.Sticky, out.StickyTimeoutSeconds)
	}
	if c := s.Spec.SessionAffinityConfig; out.Sticky && c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil &&
		int64(*c.ClientIP.TimeoutSeconds) != int64(out.StickyTimeoutSeconds) {
		dropped("affinity timeout")
	}
	external := out.Type != ServiceTypeClusterIP || len(out.ExternalIPs) > 0
	if out.ExternalTrafficPolicy == PolicyLocal && !external {
		t.Fatal("external policy Local on a Service not reachable from outside")
	}
	if out.HealthCheckNodePort != 0 && (out.Type != ServiceTypeLoadBalancer || out.ExternalTrafficPolicy != PolicyLocal) {
		t.Fatalf("health check port %d without LB+Local", out.HealthCheckNodePort)
	}
	if out.Type == ServiceTypeLoadBalancer && out.ExternalTrafficPolicy == PolicyLocal && out.HealthCheckNodePort == 0 {
		dropped("health check node port")
	}
}

func FuzzConvertEndpointSlice(f *testing.F) {
	slice := func(mut func(*discoveryv1.EndpointSlice)) []byte {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "s-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "s"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"198.19.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node1"), Zone: ptr.To("zone-a"),
					Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}},
				{Addresses: []string{"198.19.2.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
			},
		}
		if mut != nil {
			mut(es)
		}
		return mustJSON(es)
	}
	f.Add(slice(nil))
	f.Add(slice(func(es *discoveryv1.EndpointSlice) {
		es.AddressType = discoveryv1.AddressTypeIPv6
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"2001:2:0:100::2"}}, discoveryv1.Endpoint{Addresses: []string{"fe80::1%eth0"}})
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: nil, Port: ptr.To[int32](1)}, discoveryv1.EndpointPort{Name: ptr.To("x"), Port: ptr.To[int32](0)})
	}))
	f.Add(slice(func(es *discoveryv1.EndpointSlice) { es.AddressType = discoveryv1.AddressTypeFQDN }))
	f.Add(slice(func(es *discoveryv1.EndpointSlice) { es.Labels = nil }))
	f.Fuzz(func(t *testing.T, b []byte) {
		var es discoveryv1.EndpointSlice
		if json.Unmarshal(b, &es) != nil {
			return
		}
		out, ps := ConvertEndpointSlice(&es)
		key := SliceKey{Namespace: es.Namespace, Name: es.Name}.String()
		if out == nil {
			if len(ps) > 0 {
				checkProblems(t, ps, "EndpointSlice", key, true)
			}
			return
		}
		checkProblems(t, ps, "EndpointSlice", key, false)
		want := map[discoveryv1.AddressType]Family{discoveryv1.AddressTypeIPv4: IPv4, discoveryv1.AddressTypeIPv6: IPv6}[es.AddressType]
		if out.Family != want || out.Service.Name == "" || out.Service.Namespace != es.Namespace {
			t.Fatalf("family %v (want %v), service %v", out.Family, want, out.Service)
		}
		for _, e := range out.Endpoints {
			if !plainIP(e.Address) || FamilyOf(e.Address) != out.Family {
				t.Fatalf("endpoint address %v in a %v slice", e.Address, out.Family)
			}
		}
		for _, p := range out.Ports {
			if p.Port == 0 || p.Protocol == ProtocolUnknown {
				t.Fatalf("port %+v", p)
			}
		}
		if (len(out.Endpoints) < len(es.Endpoints) || len(out.Ports) < len(es.Ports)) && len(ps) == 0 {
			t.Fatal("endpoint or port dropped without a problem")
		}
	})
}

func FuzzConvertNode(f *testing.F) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{LabelZone: "zone-a"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: TaintToBeDeletedByClusterAutoscaler, Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "198.19.0.11"}, {Type: corev1.NodeInternalIP, Address: "2001:2::11"},
			{Type: corev1.NodeExternalIP, Address: "198.19.0.11"}, {Type: corev1.NodeHostName, Address: "node1"},
			{Type: corev1.NodeExternalIP, Address: "fe80::1%eth0"}}}}
	f.Add(mustJSON(node))
	f.Add([]byte(`{"metadata":{"name":"n","deletionTimestamp":"2026-01-01T00:00:00Z"},"status":{"addresses":[{"type":"InternalIP","address":"::"}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var n corev1.Node
		if json.Unmarshal(b, &n) != nil {
			return
		}
		out, ps := ConvertNode(&n)
		checkProblems(t, ps, "Node", n.Name, false)
		if out.Name != n.Name || out.Zone != n.Labels[LabelZone] || (n.DeletionTimestamp != nil && !out.Deleting) {
			t.Fatalf("node %+v from %+v", out, n.ObjectMeta)
		}
		seen := map[netip.Addr]bool{}
		for _, a := range out.Addresses {
			if !plainIP(a) || seen[a] {
				t.Fatalf("address %v bad or duplicate", a)
			}
			seen[a] = true
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); (err != nil || !seen[ip]) && len(ps) == 0 {
				t.Fatalf("address %q dropped without a problem", a.Address)
			}
		}
	})
}
