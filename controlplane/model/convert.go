package model

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Labels and annotations kube-proxy honours.
const (
	// LabelServiceProxyName on a Service (or slice) hands it to another proxy.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks the EndpointSlices of headless Services.
	LabelHeadless = "service.kubernetes.io/headless"
	// AnnotationScheduler names a Service's own IPVS scheduler; it wins over
	// SchedulerRollouts and the fleet default. AnnotationSchedulerFlags
	// lists its flags, comma-separated (sh-fallback, sh-port, mh-fallback,
	// mh-port).
	AnnotationScheduler      = "scheduler.vsplane.io/name"
	AnnotationSchedulerFlags = "scheduler.vsplane.io/flags"
	// AnnotationTriggerTime is the EndpointSlice controller's change trigger time.
	AnnotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"
	// LabelZone is the Node's zone label.
	LabelZone = "topology.kubernetes.io/zone"
	// TaintToBeDeletedByClusterAutoscaler marks a node the autoscaler removes.
	TaintToBeDeletedByClusterAutoscaler = "ToBeDeletedByClusterAutoscaler"
)

const maxStickyTimeoutSeconds = 86400

// ConvertService converts a Service. It returns nil and no problems for a
// Service kube-proxy deliberately does not proxy (headless, ExternalName,
// service-proxy-name label); nil and problems when the Service is unusable;
// a Service and problems when only parts (an IP, a port, ...) were dropped.
func ConvertService(s *corev1.Service) (*Service, []Problem) {
	if s == nil || !IsProxiedService(s) {
		return nil, nil
	}
	key := ServiceKey{Namespace: s.Namespace, Name: s.Name}
	var problems []Problem
	drop := func(r Reason, format string, args ...any) {
		problems = append(problems, Problem{Kind: "Service", Object: key.String(), Reason: r, Detail: fmt.Sprintf(format, args...), Dropped: true})
	}
	out := &Service{Key: key}
	if !s.CreationTimestamp.IsZero() {
		out.Created = s.CreationTimestamp.Unix()
	}
	switch s.Spec.Type {
	case corev1.ServiceTypeNodePort:
		out.Type = ServiceTypeNodePort
	case corev1.ServiceTypeLoadBalancer:
		out.Type = ServiceTypeLoadBalancer
	default:
		out.Type = ServiceTypeClusterIP
	}
	convertClusterIPs(s, out, drop)
	if len(out.ClusterIPs) == 0 {
		return nil, skipAll(problems, key, ReasonBadIP, "no usable cluster IP")
	}
	convertPorts(s, out, drop)
	if len(s.Spec.Ports) > 0 && len(out.Ports) == 0 {
		return nil, skipAll(problems, key, ReasonNoPorts, "no usable port")
	}
	convertAffinity(s, out, drop)
	convertExternalIPs(s, out, drop)
	convertLoadBalancer(s, out, drop)
	convertPolicies(s, out, drop)
	if s.Spec.TrafficDistribution != nil {
		out.TrafficDistribution = *s.Spec.TrafficDistribution
	}
	if len(s.Labels) > 0 {
		out.Labels = maps.Clone(s.Labels)
	}
	out.Scheduler, out.SchedulerFlags = schedulerAnnotation(s.Annotations, drop)
	return out, problems
}

// dropFunc records a problem with a part of the object (the rest is kept).
type dropFunc func(r Reason, format string, args ...any)

// convertClusterIPs keeps at most one valid cluster IP per family, in order,
// consistent with ipFamilies and ipFamilyPolicy.
func convertClusterIPs(s *corev1.Service, out *Service, drop dropFunc) {
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{s.Spec.ClusterIP}
	}
	if s.Spec.IPFamilyPolicy != nil && *s.Spec.IPFamilyPolicy == corev1.IPFamilyPolicySingleStack && len(ips) > 1 {
		drop(ReasonFamilyMismatch, "ipFamilyPolicy SingleStack with %d clusterIPs: using only %s", len(ips), ips[0])
		ips = ips[:1]
	}
	for i, raw := range ips {
		ip, err := parseIP(raw)
		if err != nil {
			drop(ReasonBadIP, "clusterIPs[%d] %q: %v", i, raw, err)
			continue
		}
		f := FamilyOf(ip)
		if i < len(s.Spec.IPFamilies) && familyOfAPI(s.Spec.IPFamilies[i]) != f {
			drop(ReasonFamilyMismatch, "clusterIPs[%d] %s is %s but ipFamilies[%d] is %s", i, ip, f, i, s.Spec.IPFamilies[i])
			continue
		}
		if len(s.Spec.IPFamilies) > 0 && i >= len(s.Spec.IPFamilies) {
			drop(ReasonFamilyMismatch, "clusterIPs[%d] %s: no matching ipFamilies entry", i, ip)
			continue
		}
		if _, dup := out.ClusterIP(f); dup {
			drop(ReasonFamilyMismatch, "clusterIPs[%d] %s: second %s cluster IP", i, ip, f)
			continue
		}
		out.ClusterIPs = append(out.ClusterIPs, ip)
	}
}

// convertPorts keeps the valid ports; duplicates and NodePorts that cannot
// apply are dropped with a problem.
func convertPorts(s *corev1.Service, out *Service, drop dropFunc) {
	for i, p := range s.Spec.Ports {
		proto, ok := protocolOf(p.Protocol)
		if !ok {
			drop(ReasonBadProtocol, "ports[%d] (%q): protocol %q", i, p.Name, p.Protocol)
			continue
		}
		if p.Port < 1 || p.Port > 65535 {
			drop(ReasonBadPort, "ports[%d] (%q): port %d out of range", i, p.Name, p.Port)
			continue
		}
		if p.NodePort < 0 || p.NodePort > 65535 {
			drop(ReasonBadPort, "ports[%d] (%q): nodePort %d out of range", i, p.Name, p.NodePort)
			continue
		}
		sp := ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port), NodePort: uint16(p.NodePort)}
		if j := slices.IndexFunc(out.Ports, func(o ServicePort) bool { return o.Port == sp.Port && o.Protocol == sp.Protocol }); j >= 0 {
			drop(ReasonDuplicate, "ports[%d] (%q): %d/%s already used by port %q", i, p.Name, sp.Port, proto, out.Ports[j].Name)
			continue
		}
		if j := slices.IndexFunc(out.Ports, func(o ServicePort) bool { return o.Name == sp.Name && o.Protocol == sp.Protocol }); j >= 0 {
			// Endpoints are matched by name and protocol: the second port could never get any.
			drop(ReasonDuplicate, "ports[%d] (%q): name and protocol %s already used", i, p.Name, proto)
			continue
		}
		if sp.NodePort != 0 && out.Type == ServiceTypeClusterIP {
			drop(ReasonBadPort, "ports[%d] (%q): nodePort %d on a ClusterIP Service ignored", i, p.Name, sp.NodePort)
			sp.NodePort = 0
		}
		if sp.NodePort != 0 && slices.ContainsFunc(out.Ports, func(o ServicePort) bool { return o.NodePort == sp.NodePort && o.Protocol == sp.Protocol }) {
			drop(ReasonDuplicate, "ports[%d] (%q): nodePort %d/%s already used by another port of this Service; NodePort dropped", i, p.Name, sp.NodePort, proto)
			sp.NodePort = 0
		}
		out.Ports = append(out.Ports, sp)
	}
}

// convertAffinity reads ClientIP session affinity and its timeout.
func convertAffinity(s *corev1.Service, out *Service, drop dropFunc) {
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		out.Sticky = true
		out.StickyTimeoutSeconds = DefaultStickyTimeoutSeconds
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t := *c.ClientIP.TimeoutSeconds
			if t < 1 || t > maxStickyTimeoutSeconds {
				drop(ReasonBadAffinity, "sessionAffinityConfig.clientIP.timeoutSeconds %d out of range, using %d", t, DefaultStickyTimeoutSeconds)
			} else {
				out.StickyTimeoutSeconds = uint32(t)
			}
		}
	}

}

// convertExternalIPs keeps the valid external IPs of the Service's families.
func convertExternalIPs(s *corev1.Service, out *Service, drop dropFunc) {
	for i, raw := range s.Spec.ExternalIPs {
		ip, err := parseIP(strings.TrimSpace(raw))
		if err == nil {
			err = notSpecial(ip)
		}
		if err != nil {
			drop(ReasonBadIP, "externalIPs[%d] %q: %v", i, raw, err)
			continue
		}
		if _, ok := out.ClusterIP(FamilyOf(ip)); !ok {
			drop(ReasonFamilyMismatch, "externalIPs[%d] %s: the Service has no %s cluster IP", i, ip, FamilyOf(ip))
			continue
		}
		if slices.Contains(out.ExternalIPs, ip) {
			drop(ReasonDuplicate, "externalIPs[%d] %s listed twice", i, ip)
			continue
		}
		out.ExternalIPs = append(out.ExternalIPs, ip)
	}
}

// convertLoadBalancer keeps the VIP-mode ingress IPs of the Service's
// families and its loadBalancerSourceRanges.
func convertLoadBalancer(s *corev1.Service, out *Service, drop dropFunc) {
	for i, ing := range s.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress: nothing to program
		}
		// kube-proxy programs only VIP-mode ingress IPs; Proxy mode means the
		// load balancer delivers to the node, not to the IP.
		if ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP {
			continue
		}
		ip, err := parseIP(ing.IP)
		if err == nil {
			err = notSpecial(ip)
		}
		if err != nil {
			drop(ReasonBadIP, "status.loadBalancer.ingress[%d].ip %q: %v", i, ing.IP, err)
			continue
		}
		if _, ok := out.ClusterIP(FamilyOf(ip)); !ok {
			drop(ReasonFamilyMismatch, "status.loadBalancer.ingress[%d].ip %s: the Service has no %s cluster IP", i, ip, FamilyOf(ip))
			continue
		}
		if slices.Contains(out.LoadBalancerIPs, ip) {
			continue // several ingress entries may name one IP (e.g. with different ports)
		}
		out.LoadBalancerIPs = append(out.LoadBalancerIPs, ip)
	}
	for i, raw := range s.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(raw))
		if err != nil {
			drop(ReasonBadCIDR, "loadBalancerSourceRanges[%d] %q: %v", i, raw, err)
			continue
		}
		if p.Addr().Zone() != "" || p.Addr().Is4In6() {
			drop(ReasonBadCIDR, "loadBalancerSourceRanges[%d] %q: zoned or IPv4-mapped prefix", i, raw)
			continue
		}
		if !slices.Contains(out.LoadBalancerSourceRanges, p.Masked()) {
			out.LoadBalancerSourceRanges = append(out.LoadBalancerSourceRanges, p.Masked())
		}
	}
}

// convertPolicies reads the traffic policies and the health-check node port.
func convertPolicies(s *corev1.Service, out *Service, drop dropFunc) {
	// Like kube-proxy (ExternalPolicyLocal), the external policy only
	// matters for a Service reachable from outside.
	externallyAccessible := out.Type != ServiceTypeClusterIP || len(out.ExternalIPs) > 0
	if s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && externallyAccessible {
		out.ExternalTrafficPolicy = PolicyLocal
	}
	if s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal {
		out.InternalTrafficPolicy = PolicyLocal
	}
	// Only a LoadBalancer with externalTrafficPolicy Local gets a health
	// check port (kube-proxy: apiservice.NeedsHealthCheck).
	if out.Type == ServiceTypeLoadBalancer && out.ExternalTrafficPolicy == PolicyLocal {
		switch h := s.Spec.HealthCheckNodePort; {
		case h < 0 || h > 65535:
			drop(ReasonBadPort, "healthCheckNodePort %d out of range", h)
		case h == 0:
			drop(ReasonBadPort, "externalTrafficPolicy Local LoadBalancer without healthCheckNodePort: no health check served")
		default:
			out.HealthCheckNodePort = uint16(h)
		}
	}
}

// schedulerAnnotation reads a Service's own scheduler; a bad value is a
// problem and the Service keeps the fleet's (rollout or default) scheduler.
func schedulerAnnotation(ann map[string]string, drop func(Reason, string, ...any)) (string, []SchedulerFlag) {
	name, ok := ann[AnnotationScheduler]
	if !ok {
		if _, ok := ann[AnnotationSchedulerFlags]; ok {
			drop(ReasonBadScheduler, "%s without %s: ignored", AnnotationSchedulerFlags, AnnotationScheduler)
		}
		return "", nil
	}
	if !slices.Contains(Schedulers, name) {
		drop(ReasonBadScheduler, "%s %q is not an IPVS scheduler (%s): the fleet's scheduler applies", AnnotationScheduler, truncate(name), strings.Join(Schedulers, ", "))
		return "", nil
	}
	var flags []SchedulerFlag
	if raw := strings.TrimSpace(ann[AnnotationSchedulerFlags]); raw != "" {
		for _, f := range strings.Split(raw, ",") {
			fl := SchedulerFlag(strings.TrimSpace(f))
			switch {
			case (fl == FlagSHFallback || fl == FlagSHPort) && name == "sh",
				(fl == FlagMHFallback || fl == FlagMHPort) && name == "mh":
				if !slices.Contains(flags, fl) {
					flags = append(flags, fl)
				}
			default:
				drop(ReasonBadScheduler, "%s: flag %q does not apply to scheduler %q: the fleet's scheduler applies", AnnotationSchedulerFlags, truncate(string(fl)), name)
				return "", nil
			}
		}
		slices.Sort(flags)
	}
	return name, flags
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// IsProxiedService reports whether kube-proxy would proxy s at all.
func IsProxiedService(s *corev1.Service) bool {
	if _, ok := s.Labels[LabelServiceProxyName]; ok {
		return false
	}
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		return false
	}
	ip := s.Spec.ClusterIP
	if len(s.Spec.ClusterIPs) > 0 {
		ip = s.Spec.ClusterIPs[0]
	}
	return ip != "" && ip != corev1.ClusterIPNone
}

// ConvertEndpointSlice converts an EndpointSlice. It returns nil and no
// problems for slices deliberately ignored (FQDN address type, other proxy,
// headless); nil and problems when unusable; otherwise the slice with the
// bad ports/endpoints dropped and the problems describing them.
func ConvertEndpointSlice(es *discoveryv1.EndpointSlice) (*EndpointSlice, []Problem) {
	if es == nil {
		return nil, nil
	}
	if _, ok := es.Labels[LabelServiceProxyName]; ok {
		return nil, nil
	}
	if _, ok := es.Labels[LabelHeadless]; ok {
		return nil, nil
	}
	key := SliceKey{Namespace: es.Namespace, Name: es.Name}
	var problems []Problem
	drop := func(r Reason, format string, args ...any) {
		problems = append(problems, Problem{Kind: "EndpointSlice", Object: key.String(), Reason: r, Detail: fmt.Sprintf(format, args...), Dropped: true})
	}
	var fam Family
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		fam = IPv4
	case discoveryv1.AddressTypeIPv6:
		fam = IPv6
	default:
		return nil, nil // FQDN slices are not proxied (kube-proxy ignores them too)
	}
	svcName := es.Labels[discoveryv1.LabelServiceName]
	if svcName == "" {
		return nil, []Problem{{Kind: "EndpointSlice", Object: key.String(), Reason: ReasonNoServiceLabel, Detail: "no " + discoveryv1.LabelServiceName + " label"}}
	}
	out := &EndpointSlice{Key: key, Service: ServiceKey{Namespace: es.Namespace, Name: svcName}, Family: fam}
	for i, p := range es.Ports {
		if p.Name == nil {
			drop(ReasonBadPort, "ports[%d]: nil name", i)
			continue
		}
		if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			drop(ReasonBadPort, "ports[%d] (%q): port missing or out of range", i, *p.Name)
			continue
		}
		proto := TCP // the API server defaults a nil protocol to TCP
		if p.Protocol != nil {
			var ok bool
			if proto, ok = protocolOf(*p.Protocol); !ok {
				drop(ReasonBadProtocol, "ports[%d] (%q): protocol %q", i, *p.Name, *p.Protocol)
				continue
			}
		}
		out.Ports = append(out.Ports, EndpointPort{Name: *p.Name, Protocol: proto, Port: uint16(*p.Port)})
	}
	for i, e := range es.Endpoints {
		if len(e.Addresses) == 0 {
			drop(ReasonBadIP, "endpoints[%d]: no address", i)
			continue
		}
		ip, err := parseIP(e.Addresses[0])
		if err != nil {
			drop(ReasonBadIP, "endpoints[%d] %q: %v", i, e.Addresses[0], err)
			continue
		}
		if FamilyOf(ip) != fam {
			drop(ReasonFamilyMismatch, "endpoints[%d] %s in a %s slice", i, ip, fam)
			continue
		}
		ep := Endpoint{
			Address:     ip,
			Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
			Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
			Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
		}
		if e.NodeName != nil {
			ep.NodeName = *e.NodeName
		}
		if e.Zone != nil {
			ep.Zone = *e.Zone
		}
		if e.Hints != nil {
			for _, z := range e.Hints.ForZones {
				ep.ForZones = append(ep.ForZones, z.Name)
			}
			for _, n := range e.Hints.ForNodes {
				ep.ForNodes = append(ep.ForNodes, n.Name)
			}
		}
		out.Endpoints = append(out.Endpoints, ep)
	}
	return out, problems
}

// ConvertNode converts a Node; unparsable addresses are dropped.
func ConvertNode(n *corev1.Node) (*Node, []Problem) {
	if n == nil {
		return nil, nil
	}
	out := &Node{Name: n.Name, Zone: n.Labels[LabelZone], Deleting: n.DeletionTimestamp != nil}
	if len(n.Labels) > 0 {
		out.Labels = maps.Clone(n.Labels)
	}
	for _, t := range n.Spec.Taints {
		// The cluster autoscaler taints a node it is about to delete;
		// kube-proxy's /healthz treats that like a deletion (KEP-3836).
		if t.Key == TaintToBeDeletedByClusterAutoscaler {
			out.Deleting = true
		}
	}
	var problems []Problem
	podCIDRs := n.Spec.PodCIDRs
	if len(podCIDRs) == 0 && n.Spec.PodCIDR != "" {
		podCIDRs = []string{n.Spec.PodCIDR}
	}
	for _, c := range podCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			problems = append(problems, Problem{Kind: "Node", Object: n.Name, Reason: ReasonBadCIDR, Detail: fmt.Sprintf("podCIDR %q: not a CIDR", c), Dropped: true})
			continue
		}
		out.PodCIDRs = append(out.PodCIDRs, p.Masked())
	}
	seen := map[netip.Addr]bool{}
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type != t {
				continue
			}
			ip, err := parseIP(a.Address)
			if err != nil {
				problems = append(problems, Problem{Kind: "Node", Object: n.Name, Reason: ReasonBadIP, Detail: fmt.Sprintf("%s %q: %v", a.Type, a.Address, err), Dropped: true})
				continue
			}
			if !seen[ip] {
				seen[ip] = true
				out.Addresses = append(out.Addresses, ip)
			}
		}
	}
	return out, problems
}

// ConvertNamespace keeps a namespace's name and labels.
func ConvertNamespace(n *corev1.Namespace) (*Namespace, []Problem) {
	if n == nil {
		return nil, nil
	}
	return &Namespace{Name: n.Name, Labels: maps.Clone(n.Labels)}, nil
}

// parseIP accepts a plain IPv4 or IPv6 address (no zone, no prefix).
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	if ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("zoned address not allowed")
	}
	if ip.Is4In6() {
		return netip.Addr{}, fmt.Errorf("IPv4-mapped IPv6 address not allowed")
	}
	if ip.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("unspecified address not allowed")
	}
	return ip, nil
}

// notSpecial rejects addresses the API server refuses as external or
// load-balancer IPs (ValidateNonSpecialIP): binding them to kube-ipvs0 would
// break the node.
func notSpecial(ip netip.Addr) error {
	switch {
	case ip.IsLoopback():
		return fmt.Errorf("loopback address not allowed")
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return fmt.Errorf("link-local address not allowed")
	case ip.IsMulticast():
		return fmt.Errorf("multicast address not allowed")
	}
	return nil
}

func protocolOf(p corev1.Protocol) (Protocol, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return TCP, true
	case corev1.ProtocolUDP:
		return UDP, true
	case corev1.ProtocolSCTP:
		return SCTP, true
	}
	return ProtocolUnknown, false
}

func familyOfAPI(f corev1.IPFamily) Family {
	switch f {
	case corev1.IPv4Protocol:
		return IPv4
	case corev1.IPv6Protocol:
		return IPv6
	}
	return FamilyUnknown
}

// skipAll turns the collected problems into "whole object skipped" and adds
// the final reason.
func skipAll(problems []Problem, key ServiceKey, r Reason, detail string) []Problem {
	for i := range problems {
		problems[i].Dropped = false
	}
	return append(problems, Problem{Kind: "Service", Object: key.String(), Reason: r, Detail: detail})
}
