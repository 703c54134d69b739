// Package model is the control plane's view of the cluster: Services, their
// endpoints (from EndpointSlices) and Nodes, in our own types. Kubernetes API
// types stop here: everything downstream (translate, engine) uses only these.
//
// Values are immutable once built: the conversion functions return fresh
// values and nobody modifies them afterwards, so they can be shared freely
// between goroutines and between the change trackers and the engine.
package model

import (
	"fmt"
	"net/netip"
)

// ServiceKey names a Service.
type ServiceKey struct {
	Namespace string
	Name      string
}

func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// SliceKey names an EndpointSlice.
type SliceKey struct {
	Namespace string
	Name      string
}

func (k SliceKey) String() string { return k.Namespace + "/" + k.Name }

// Protocol of a port.
type Protocol uint8

const (
	ProtocolUnknown Protocol = iota
	TCP
	UDP
	SCTP
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return "unknown"
}

// Family is an IP family.
type Family uint8

const (
	FamilyUnknown Family = iota
	IPv4
	IPv6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return "unknown"
}

// FamilyOf returns the family of a (valid) address.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	if a.Is6() {
		return IPv6
	}
	return FamilyUnknown
}

// ServiceType is the Service's type (only the proxied ones exist in the model).
type ServiceType uint8

const (
	ServiceTypeClusterIP ServiceType = iota
	ServiceTypeNodePort
	ServiceTypeLoadBalancer
)

func (t ServiceType) String() string {
	switch t {
	case ServiceTypeNodePort:
		return "NodePort"
	case ServiceTypeLoadBalancer:
		return "LoadBalancer"
	}
	return "ClusterIP"
}

// TrafficPolicy is an internal or external traffic policy.
type TrafficPolicy uint8

const (
	PolicyCluster TrafficPolicy = iota
	PolicyLocal
)

func (p TrafficPolicy) String() string {
	if p == PolicyLocal {
		return "Local"
	}
	return "Cluster"
}

// DefaultStickyTimeoutSeconds is the ClientIP affinity timeout when the Service
// gives none (kube-proxy: v1.DefaultClientIPServiceAffinitySeconds).
const DefaultStickyTimeoutSeconds = 10800

// Service is one proxied Service. Services kube-proxy skips (headless,
// ExternalName, service-proxy-name label) never become a Service.
type Service struct {
	Key  ServiceKey
	Type ServiceType
	// Created is the creation timestamp in Unix seconds. Cross-Service
	// conflicts (two Services claiming one NodePort) go to the older one,
	// which every replica decides alike and a newcomer cannot disturb.
	Created int64
	// ClusterIPs in the Service's order; at most one per family.
	ClusterIPs []netip.Addr
	Ports      []ServicePort
	// ClientIP session affinity: Sticky is true and StickyTimeoutSeconds > 0.
	Sticky               bool
	StickyTimeoutSeconds uint32
	// ExternalIPs, deduplicated; only families the Service has a cluster IP of.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs from status.loadBalancer.ingress (VIP-mode IPs only;
	// hostnames ignored), deduplicated, only families with a cluster IP.
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges, masked and deduplicated, any family (the
	// translator uses those of each virtual server's family).
	LoadBalancerSourceRanges []netip.Prefix
	// ExternalTrafficPolicy is Local only for an externally reachable
	// Service (NodePort, LoadBalancer, or with external IPs).
	ExternalTrafficPolicy TrafficPolicy
	InternalTrafficPolicy TrafficPolicy
	// HealthCheckNodePort is set only for a LoadBalancer with
	// externalTrafficPolicy Local (kube-proxy's NeedsHealthCheck).
	HealthCheckNodePort uint16
	// TrafficDistribution as given ("" when unset), e.g. "PreferClose".
	TrafficDistribution string
	// Labels of the Service (SchedulerRollout service selectors).
	Labels map[string]string
	// Scheduler is the Service's own IPVS scheduler from the
	// AnnotationScheduler annotation (validated; "" when absent or bad),
	// with SchedulerFlags from AnnotationSchedulerFlags.
	Scheduler      string
	SchedulerFlags []SchedulerFlag
}

// VIP is a virtual server's address, protocol and port.
type VIP struct {
	Addr  netip.Addr
	Proto Protocol
	Port  uint16
}

func (v VIP) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(v.Addr, v.Port), v.Proto)
}

// SchedulerFlag is an IPVS scheduler flag (ipvsadm's name).
type SchedulerFlag string

// The scheduler flags a Service or rollout may set.
const (
	FlagSHFallback SchedulerFlag = "sh-fallback"
	FlagSHPort     SchedulerFlag = "sh-port"
	FlagMHFallback SchedulerFlag = "mh-fallback"
	FlagMHPort     SchedulerFlag = "mh-port"
)

// Schedulers are the IPVS schedulers of Linux (a node's kernel may lack
// some: its agent NACKs a virtual server asking for one it does not offer).
var Schedulers = []string{"dh", "fo", "lblc", "lblcr", "lc", "mh", "nq", "ovf", "rr", "sed", "sh", "twos", "wlc", "wrr"}

// Namespace is a namespace's labels (SchedulerRollout namespace selectors).
type Namespace struct {
	Name   string
	Labels map[string]string
}

// ClusterIP returns the Service's cluster IP of family f.
func (s *Service) ClusterIP(f Family) (netip.Addr, bool) {
	for _, ip := range s.ClusterIPs {
		if FamilyOf(ip) == f {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// ServicePort is one port of a Service. The endpoint-side port comes from the
// EndpointSlices (matched by Name and Protocol), so there is no targetPort.
type ServicePort struct {
	Name     string
	Protocol Protocol
	Port     uint16
	NodePort uint16
}

// EndpointSlice is one EndpointSlice of a Service, restricted to what the
// translator uses.
type EndpointSlice struct {
	Key     SliceKey
	Service ServiceKey
	Family  Family
	Ports   []EndpointPort
	// Endpoints with a valid first address.
	Endpoints []Endpoint
}

// EndpointPort maps a port name/protocol to the endpoints' port number.
type EndpointPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// Endpoint is one endpoint of a slice (the first address, like kube-proxy).
type Endpoint struct {
	Address     netip.Addr
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	ForZones    []string
	ForNodes    []string
}

// Node is a cluster node.
type Node struct {
	Name string
	// Addresses from status.addresses (InternalIP, then ExternalIP), deduplicated.
	Addresses []netip.Addr
	// Zone is the topology.kubernetes.io/zone label ("" if none).
	Zone string
	// Deleting is true once the Node has a deletion timestamp.
	Deleting bool
	// Labels of the Node (SchedulerRollout node selectors).
	Labels map[string]string
	// PodCIDRs from spec.podCIDRs (spec.podCIDR when that is empty): the
	// agents' local-traffic detection in NodeCIDR mode.
	PodCIDRs []netip.Prefix
}

// Reason classifies why (part of) an object cannot be used.
type Reason string

const (
	ReasonBadIP          Reason = "bad_ip"
	ReasonBadPort        Reason = "bad_port"
	ReasonBadProtocol    Reason = "bad_protocol"
	ReasonFamilyMismatch Reason = "family_mismatch"
	ReasonBadCIDR        Reason = "bad_cidr"
	ReasonNoServiceLabel Reason = "no_service_label"
	ReasonAddressType    Reason = "unsupported_address_type"
	ReasonNoPorts        Reason = "no_usable_ports"
	ReasonBadAffinity    Reason = "bad_affinity"
	ReasonDuplicate      Reason = "duplicate"
	ReasonBadScheduler   Reason = "bad_scheduler"
	ReasonBadSelector    Reason = "bad_selector"
)

// Problem is one thing wrong with an object. If Dropped is false the whole
// object was skipped; otherwise only the part named in Detail was dropped.
type Problem struct {
	Kind    string // "Service", "EndpointSlice", "Node"
	Object  string // namespace/name or node name
	Reason  Reason
	Detail  string
	Dropped bool // true: only a part was dropped; false: whole object skipped
}

func (p Problem) String() string {
	what := "skipped"
	if p.Dropped {
		what = "partly dropped"
	}
	return fmt.Sprintf("%s %s %s (%s): %s", p.Kind, p.Object, what, p.Reason, p.Detail)
}
