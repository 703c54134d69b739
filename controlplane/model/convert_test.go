package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
var prefixCmp = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

func svc(mut func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "198.18.0.1", ClusterIPs: []string{"198.18.0.1"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	if mut != nil {
		mut(s)
	}
	return s
}

func reasons(ps []Problem) []Reason {
	var out []Reason
	for _, p := range ps {
		out = append(out, p.Reason)
	}
	return out
}

func TestConvertService(t *testing.T) {
	k := ServiceKey{Namespace: "ns", Name: "s"}
	tests := []struct {
		name    string
		in      *corev1.Service
		want    *Service
		reasons []Reason
	}{{
		name: "plain ClusterIP",
		in:   svc(nil),
		want: &Service{Key: k, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")},
			Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}},
	}, {
		name: "headless skipped silently",
		in:   svc(func(s *corev1.Service) { s.Spec.ClusterIP = "None"; s.Spec.ClusterIPs = []string{"None"} }),
	}, {
		name: "ExternalName skipped silently",
		in:   svc(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }),
	}, {
		name: "other proxy skipped silently",
		in:   svc(func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} }),
	}, {
		name:    "bad cluster IP skips the Service",
		in:      svc(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"198.18.0.300"} }),
		reasons: []Reason{ReasonBadIP, ReasonBadIP},
	}, {
		name: "family mismatch drops that IP only",
		in: svc(func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"198.18.0.1", "198.18.0.2"}
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		}),
		want: &Service{Key: k, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")},
			Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}},
		reasons: []Reason{ReasonFamilyMismatch},
	}, {
		name: "bad port and protocol dropped, good ones kept; dual stack, affinity, LB",
		in: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ClusterIPs = []string{"198.18.0.1", "2001:2:0:1::1"}
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
			s.Spec.Ports = append(s.Spec.Ports,
				corev1.ServicePort{Name: "big", Protocol: corev1.ProtocolTCP, Port: 70000},
				corev1.ServicePort{Name: "icmp", Protocol: "ICMP", Port: 1},
				corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053})
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.ExternalIPs = []string{"198.18.1.1", "nope"}
			s.Spec.LoadBalancerSourceRanges = []string{" 198.18.2.0/24 ", "bad"}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.TrafficDistribution = ptr.To("PreferClose")
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
				{IP: "198.18.3.1"}, {Hostname: "lb.example"},
				{IP: "198.18.3.2", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
		}),
		want: &Service{Key: k, Type: ServiceTypeLoadBalancer,
			ClusterIPs:               []netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:2:0:1::1")},
			Ports:                    []ServicePort{{Name: "http", Protocol: TCP, Port: 80}, {Name: "dns", Protocol: UDP, Port: 53, NodePort: 30053}},
			Sticky:                   true,
			StickyTimeoutSeconds:     10800,
			ExternalIPs:              []netip.Addr{netip.MustParseAddr("198.18.1.1")},
			LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr("198.18.3.1")},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.2.0/24")},
			ExternalTrafficPolicy:    PolicyLocal, InternalTrafficPolicy: PolicyLocal,
			HealthCheckNodePort: 32000, TrafficDistribution: "PreferClose"},
		reasons: []Reason{ReasonBadPort, ReasonBadProtocol, ReasonBadIP, ReasonBadCIDR},
	}, {
		name: "affinity timeout kept",
		in: svc(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		}),
		want: &Service{Key: k, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")},
			Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80}}, Sticky: true, StickyTimeoutSeconds: 60},
	}, {
		name:    "no usable port skips the Service",
		in:      svc(func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }),
		reasons: []Reason{ReasonBadPort, ReasonNoPorts},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, probs := ConvertService(tc.in)
			if diff := cmp.Diff(tc.want, got, addrCmp, prefixCmp); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.reasons, reasons(probs)); diff != "" {
				t.Errorf("reasons (-want +got):\n%s\n%v", diff, probs)
			}
			for _, p := range probs {
				if p.Dropped != (got != nil) {
					t.Errorf("problem %v: Dropped=%v but service nil=%v", p, p.Dropped, got == nil)
				}
			}
		})
	}
}

func TestConvertEndpointSlice(t *testing.T) {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "s-1", Labels: map[string]string{discoveryv1.LabelServiceName: "s"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To[int32](8080)},
			{Name: ptr.To("bad"), Port: ptr.To[int32](0)},
			{Name: ptr.To("x"), Port: ptr.To[int32](1), Protocol: ptr.To[corev1.Protocol]("ICMP")},
		},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.19.1.5"}, NodeName: ptr.To("n1"), Zone: ptr.To("z1"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)},
				Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "n1"}}}},
			{Addresses: []string{"2001:2::5"}},
			{Addresses: []string{"not-an-ip"}},
			{},
		},
	}
	got, probs := ConvertEndpointSlice(es)
	want := &EndpointSlice{Key: SliceKey{Namespace: "ns", Name: "s-1"}, Service: ServiceKey{Namespace: "ns", Name: "s"}, Family: IPv4,
		Ports: []EndpointPort{{Name: "http", Protocol: TCP, Port: 8080}},
		Endpoints: []Endpoint{{Address: netip.MustParseAddr("198.19.1.5"), Ready: false, Serving: true, Terminating: true,
			NodeName: "n1", Zone: "z1", ForZones: []string{"z1"}, ForNodes: []string{"n1"}}}}
	if diff := cmp.Diff(want, got, addrCmp); diff != "" {
		t.Errorf("slice (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Reason{ReasonBadPort, ReasonBadProtocol, ReasonFamilyMismatch, ReasonBadIP, ReasonBadIP}, reasons(probs)); diff != "" {
		t.Errorf("reasons (-want +got):\n%s", diff)
	}

	noLabel := es.DeepCopy()
	noLabel.Labels = nil
	if got, probs := ConvertEndpointSlice(noLabel); got != nil || len(probs) != 1 || probs[0].Reason != ReasonNoServiceLabel {
		t.Errorf("no label: %v %v", got, probs)
	}
	fqdn := es.DeepCopy()
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	if got, probs := ConvertEndpointSlice(fqdn); got != nil || probs != nil {
		t.Errorf("FQDN: %v %v", got, probs)
	}
}

func TestConvertNode(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{LabelZone: "z1"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n1"},
			{Type: corev1.NodeExternalIP, Address: "198.18.9.1"},
			{Type: corev1.NodeInternalIP, Address: "198.19.0.11"},
			{Type: corev1.NodeInternalIP, Address: "bogus"},
			{Type: corev1.NodeExternalIP, Address: "198.19.0.11"},
		}},
	}
	got, probs := ConvertNode(n)
	want := &Node{Name: "n1", Zone: "z1", Labels: map[string]string{LabelZone: "z1"}, Addresses: []netip.Addr{netip.MustParseAddr("198.19.0.11"), netip.MustParseAddr("198.18.9.1")}}
	if diff := cmp.Diff(want, got, addrCmp, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("node (-want +got):\n%s", diff)
	}
	if len(probs) != 1 || probs[0].Reason != ReasonBadIP || !probs[0].Dropped {
		t.Errorf("problems %v", probs)
	}
	if got.Deleting {
		t.Errorf("node without deletion timestamp or taint is Deleting")
	}
	n.Spec.Taints = []corev1.Taint{{Key: TaintToBeDeletedByClusterAutoscaler, Effect: corev1.TaintEffectNoSchedule}}
	if got, _ := ConvertNode(n); !got.Deleting {
		t.Errorf("node tainted %s is not Deleting", TaintToBeDeletedByClusterAutoscaler)
	}
	n.Spec.Taints = nil
	n.DeletionTimestamp = &metav1.Time{}
	if got, _ := ConvertNode(n); !got.Deleting {
		t.Errorf("node with deletion timestamp is not Deleting")
	}
}

func TestConvertServiceKubeProxyRules(t *testing.T) {
	k := ServiceKey{Namespace: "ns", Name: "s"}
	v4 := netip.MustParseAddr("198.18.0.1")
	http := ServicePort{Name: "http", Protocol: TCP, Port: 80}
	tests := []struct {
		name    string
		in      *corev1.Service
		want    *Service
		reasons []Reason
	}{{
		name: "duplicate port/protocol dropped, same port other protocol kept",
		in: svc(func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports,
				corev1.ServicePort{Name: "again", Protocol: corev1.ProtocolTCP, Port: 80},
				corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolUDP, Port: 80},
				corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 81})
		}),
		want:    &Service{Key: k, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http, {Name: "http", Protocol: UDP, Port: 80}}},
		reasons: []Reason{ReasonDuplicate, ReasonDuplicate},
	}, {
		name: "duplicate nodePort within the Service: second NodePort dropped, port kept",
		in: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30001
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "b", Protocol: corev1.ProtocolTCP, Port: 81, NodePort: 30001})
		}),
		want: &Service{Key: k, Type: ServiceTypeNodePort, ClusterIPs: []netip.Addr{v4},
			Ports: []ServicePort{{Name: "http", Protocol: TCP, Port: 80, NodePort: 30001}, {Name: "b", Protocol: TCP, Port: 81}}},
		reasons: []Reason{ReasonDuplicate},
	}, {
		name: "SingleStack keeps the first cluster IP; ipFamilies shorter than clusterIPs",
		in: svc(func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"198.18.0.1", "2001:2:0:1::1"}
			s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		}),
		want:    &Service{Key: k, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http}},
		reasons: []Reason{ReasonFamilyMismatch},
	}, {
		name: "clusterIP without ipFamilies entry dropped",
		in:   svc(func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"198.18.0.1", "2001:2:0:1::1"} }),
		want: &Service{Key: k, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http}}, reasons: []Reason{ReasonFamilyMismatch},
	}, {
		name: "external and LB IPs of a family without cluster IP dropped; duplicates dropped",
		in: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalIPs = []string{"198.18.100.1", "2001:2:0:1::100", "198.18.100.1", "127.0.0.1", "169.254.1.1", "224.0.0.1"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "2001:2:0:1::200"}, {IP: "198.18.200.1"}, {IP: "198.18.200.1"}, {IP: "127.0.0.2"}}
		}),
		want: &Service{Key: k, Type: ServiceTypeLoadBalancer, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http},
			ExternalIPs: []netip.Addr{netip.MustParseAddr("198.18.100.1")}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.18.200.1")}},
		reasons: []Reason{ReasonFamilyMismatch, ReasonDuplicate, ReasonBadIP, ReasonBadIP, ReasonBadIP, ReasonFamilyMismatch, ReasonBadIP},
	}, {
		name: "ETP Local and health check ignored on an internal ClusterIP Service",
		in: svc(func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
		}),
		want: &Service{Key: k, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http}},
	}, {
		name: "ETP Local NodePort: no health check port (only LoadBalancers get one)",
		in: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
		}),
		want: &Service{Key: k, Type: ServiceTypeNodePort, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http}, ExternalTrafficPolicy: PolicyLocal},
	}, {
		name: "ETP Local LoadBalancer without healthCheckNodePort reported",
		in: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}),
		want:    &Service{Key: k, Type: ServiceTypeLoadBalancer, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http}, ExternalTrafficPolicy: PolicyLocal},
		reasons: []Reason{ReasonBadPort},
	}, {
		name: "source ranges: bad CIDR reported, duplicates merged, masked",
		in: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerSourceRanges = []string{"198.18.50.7/24", "198.18.50.0/24", "198.18.51.1", "2001:2:0:200::/64"}
		}),
		want: &Service{Key: k, Type: ServiceTypeLoadBalancer, ClusterIPs: []netip.Addr{v4}, Ports: []ServicePort{http},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.50.0/24"), netip.MustParsePrefix("2001:2:0:200::/64")}},
		reasons: []Reason{ReasonBadCIDR},
	}, {
		name: "headless dual-stack Service skipped silently",
		in: svc(func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"}
			s.Spec.Type = corev1.ServiceTypeClusterIP
		}),
	}, {
		name: "LoadBalancer handed to another proxy skipped silently",
		in: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Labels = map[string]string{LabelServiceProxyName: "other"}
		}),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, probs := ConvertService(tc.in)
			if diff := cmp.Diff(tc.want, got, addrCmp, prefixCmp, cmpopts.IgnoreFields(Service{}, "Created")); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.reasons, reasons(probs)); diff != "" {
				t.Errorf("reasons (-want +got):\n%s\n%v", diff, probs)
			}
		})
	}
}

func TestSchedulerAnnotation(t *testing.T) {
	for _, tc := range []struct {
		ann       map[string]string
		sched     string
		flags     []SchedulerFlag
		problem   string
		wantLabel bool
	}{
		{ann: nil},
		{ann: map[string]string{AnnotationScheduler: "mh"}, sched: "mh"},
		{ann: map[string]string{AnnotationScheduler: "sh", AnnotationSchedulerFlags: "sh-port, sh-fallback,sh-port"}, sched: "sh",
			flags: []SchedulerFlag{FlagSHFallback, FlagSHPort}},
		{ann: map[string]string{AnnotationScheduler: "fancy"}, problem: `"fancy" is not an IPVS scheduler`},
		{ann: map[string]string{AnnotationScheduler: "rr", AnnotationSchedulerFlags: "mh-port"}, problem: `flag "mh-port" does not apply to scheduler "rr"`},
		{ann: map[string]string{AnnotationSchedulerFlags: "sh-port"}, problem: "without scheduler.vsplane.io/name"},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Annotations: tc.ann, Labels: map[string]string{"app": "x"}},
			Spec: corev1.ServiceSpec{ClusterIP: "198.18.0.1", Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}}}
		got, probs := ConvertService(svc)
		if got == nil {
			t.Fatalf("%v: Service skipped: %v", tc.ann, probs)
		}
		if got.Scheduler != tc.sched || !slices.Equal(got.SchedulerFlags, tc.flags) || got.Labels["app"] != "x" {
			t.Errorf("%v: scheduler %q flags %v labels %v", tc.ann, got.Scheduler, got.SchedulerFlags, got.Labels)
		}
		found := false
		for _, p := range probs {
			if p.Reason == ReasonBadScheduler && strings.Contains(p.Detail, tc.problem) && p.Dropped {
				found = true
			}
		}
		if (tc.problem != "") != found {
			t.Errorf("%v: problems %v, want one containing %q", tc.ann, probs, tc.problem)
		}
	}
}
