// Package translate computes a node's desired state from the cluster model.
// Everything here is a pure function of its arguments: no clients, no clock,
// no globals. Output is deterministic (sorted), so equal inputs give equal
// encodings and equal content-hash versions.
//
// Semantics follow kube-proxy's IPVS proxier (pkg/proxy/ipvs/proxier.go)
// unless a comment says we deliberately differ.
package translate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/controlplane/model"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Input is one Service and what belongs to it.
type Input struct {
	Service *model.Service
	// Slices of the Service, any order, any family.
	Slices []*model.EndpointSlice
	// Problems found while converting the Service and its slices; copied to
	// ServiceState.problems so the inspection API shows them.
	Problems []string
	// Rollouts are the SchedulerRollouts that select the Service, newest
	// first: a node gets the scheduler of the first one that reached it,
	// unless the Service names its own.
	Rollouts []*Rollout
	// Conflicts are the parts of Service other Services own: left out.
	Conflicts Conflicts
}

// Conflicts are the parts of a Service that other Services own, as the
// engine decides them over all Services (engine/conflicts.go). The
// translator leaves them out, so every node gives each to the same Service;
// the Service itself stays as read. The zero value is no conflict.
type Conflicts struct {
	// NodePorts another Service owns: a port with one of them gets no
	// NodePort virtual server and no NodePort ipset entries.
	NodePorts map[NodePort]struct{}
	// ExternalIPs not programmed: each is a node's address on a port that
	// is some Service's NodePort.
	ExternalIPs map[netip.Addr]struct{}
	// VIPs are external and load-balancer virtual servers an older Service
	// also claims.
	VIPs map[model.VIP]struct{}
}

// NodePort is a NodePort number of one protocol.
type NodePort struct {
	Protocol model.Protocol
	Port     uint16
}

// port returns sp as it is programmed: without a NodePort another Service
// owns.
func (c Conflicts) port(sp model.ServicePort) model.ServicePort {
	if sp.NodePort != 0 {
		if _, lost := c.NodePorts[NodePort{sp.Protocol, sp.NodePort}]; lost {
			sp.NodePort = 0
		}
	}
	return sp
}

// keepsExternalIP reports whether ip is programmed (not dropped by a conflict).
func (c Conflicts) keepsExternalIP(ip netip.Addr) bool {
	_, dropped := c.ExternalIPs[ip]
	return !dropped
}

// Rollout is one SchedulerRollout's assignment: the nodes (of the steps
// begun) that run Scheduler.
type Rollout struct {
	Name      string
	Scheduler string
	Flags     []model.SchedulerFlag
	Nodes     map[string]struct{}
}

// SchedulerSourceAnnotation is ServiceState.scheduler_source for a Service
// that names its own scheduler.
const SchedulerSourceAnnotation = "annotation " + model.AnnotationScheduler

// SchedulerFor returns the scheduler and flags of in's virtual servers on
// node and why: the Service's own (annotation) wins over the newest rollout
// that reached the node; "" means the node default.
func (in Input) SchedulerFor(node string) (name string, flags []model.SchedulerFlag, source string) {
	if svc := in.Service; svc != nil && svc.Scheduler != "" {
		return svc.Scheduler, svc.SchedulerFlags, SchedulerSourceAnnotation
	}
	for _, r := range in.Rollouts {
		if _, ok := r.Nodes[node]; ok {
			return r.Scheduler, r.Flags, "SchedulerRollout " + r.Name
		}
	}
	return "", nil, ""
}

// Service returns what in.Service asks of node. A nil Service gives nil.
//
// Per IP family of the Service's cluster IPs and per port it emits, in this
// order: the ClusterIP virtual server, one per external IP, one per
// load-balancer IP, and the NodePort marker (node_port_addresses, expanded
// by the agent), plus the ipset entries kube-proxy's IPVS proxier would add
// for them. Problems that affect only part of the Service are appended to
// ServiceState.problems and the rest is still programmed.
func Service(in Input, node *model.Node, cfg Config) *vsplanev1.ServiceState {
	svc := in.Service
	if svc == nil {
		return nil
	}
	t := &translation{svc: svc, conflicts: in.Conflicts, node: node, cfg: cfg, seen: map[vsKey]string{}}
	t.st = &vsplanev1.ServiceState{
		Namespace: svc.Key.Namespace,
		Name:      svc.Key.Name,
		Problems:  slices.Clone(in.Problems),
	}
	localReady := map[netip.Addr]struct{}{}
	for _, clusterIP := range svc.ClusterIPs {
		fam := model.FamilyOf(clusterIP)
		for _, sp := range svc.Ports {
			sp = in.Conflicts.port(sp)
			eps := endpointsFor(in.Slices, fam, sp, node.Name)
			sel := categorize(eps, node.Name, node.Zone)
			for i := range eps {
				if eps[i].local && eps[i].ready {
					localReady[eps[i].addr] = struct{}{}
				}
			}
			t.port(fam, clusterIP, sp, eps, &sel)
			t.noLocalEndpoints(eps, &sel)
		}
		if svc.HealthCheckNodePort != 0 {
			t.sets.add(&vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_HEALTH_CHECK_NODE_PORT, Family: family(fam),
				Port: uint32(svc.HealthCheckNodePort)})
		}
	}
	t.st.IpsetEntries = t.sets.sorted()
	if name, flags, source := in.SchedulerFor(node.Name); name != "" {
		t.st.SchedulerSource = source
		for _, vs := range t.st.VirtualServers {
			vs.Scheduler = name
			for _, f := range flags {
				vs.Flags = append(vs.Flags, schedulerFlags[f])
			}
			slices.Sort(vs.Flags)
		}
	}
	for a := range localReady {
		if a.Is4() {
			t.st.LocalEndpoints++
		} else {
			t.st.LocalEndpointsIpv6++
		}
	}
	t.st.HealthCheckNodePort = uint32(svc.HealthCheckNodePort)
	return t.st
}

// noLocalEndpoints records a Local policy whose port has usable endpoints
// (ready, or serving and terminating) but none on the node, as kube-proxy's
// syncEndpoint counts them (any port makes the Service count).
func (t *translation) noLocalEndpoints(eps []endpoint, sel *selection) {
	if len(sel.local) > 0 || !slices.ContainsFunc(eps, func(e endpoint) bool { return e.ready || e.serving && e.terminating }) {
		return
	}
	if t.svc.InternalTrafficPolicy == model.PolicyLocal {
		t.st.NoLocalEndpointsInternal = true
	}
	if t.svc.ExternalTrafficPolicy == model.PolicyLocal { // only when externally accessible (model)
		t.st.NoLocalEndpointsExternal = true
	}
}

// translation is the state of one Service(in, node, cfg) call.
type translation struct {
	svc       *model.Service
	conflicts Conflicts
	node      *model.Node
	cfg       Config
	st        *vsplanev1.ServiceState
	sets      ipsetBuilder
	// seen maps each virtual server (address, port, protocol) to what
	// created it, to report and skip duplicates.
	seen map[vsKey]string
}

type vsKey struct {
	fam   vsplanev1.IPFamily
	addr  string // "" for NodePort markers (nodes true)
	nodes bool
	port  uint32
	proto vsplanev1.Protocol
}

func (t *translation) problem(format string, args ...any) {
	p := fmt.Sprintf(format, args...)
	if !slices.Contains(t.st.Problems, p) {
		t.st.Problems = append(t.st.Problems, p)
	}
}

// add appends vs unless an earlier virtual server of this Service has the
// same address, port and protocol; what names vs in the problem.
func (t *translation) add(vs *vsplanev1.VirtualServer, what string) bool {
	k := vsKey{vs.Family, vs.Address, vs.NodePortAddresses, vs.Port, vs.Protocol}
	if prev, dup := t.seen[k]; dup {
		t.problem("%s: same virtual server as %s; not programmed twice", what, prev)
		return false
	}
	t.seen[k] = what
	t.st.VirtualServers = append(t.st.VirtualServers, vs)
	return true
}

// port emits everything of Service port sp in family fam.
func (t *translation) port(fam model.Family, clusterIP netip.Addr, sp model.ServicePort, eps []endpoint, sel *selection) {
	p := &portTranslation{t: t, fam: fam, sp: sp, name: portLabel(sp),
		f: family(fam), proto: protocol(sp.Protocol), extLocal: t.svc.ExternalTrafficPolicy == model.PolicyLocal}
	p.loopBack(eps)
	p.clusterIP(clusterIP, sel)
	p.rs, p.reject = realServers(sel, t.svc.ExternalTrafficPolicy)
	if p.extLocal {
		// The policy is for external clients: in-cluster ones get the
		// Cluster selection (the agent tells them apart).
		p.inCluster, _ = realServers(sel, model.PolicyCluster)
	}
	p.externalIPs()
	p.loadBalancerIPs()
	p.nodePort()
}

// portTranslation is one Service port of one family being translated into
// its virtual servers and ipset entries, step by step.
type portTranslation struct {
	t        *translation
	fam      model.Family
	sp       model.ServicePort
	name     string // for problems and add's descriptions
	f        vsplanev1.IPFamily
	proto    vsplanev1.Protocol
	extLocal bool // externalTrafficPolicy Local
	// rs and reject are the real servers of the external kinds (external
	// IPs, load balancers, NodePorts), selected by the external policy.
	rs     []*vsplanev1.RealServer
	reject bool
	// inCluster are the real servers of in-cluster clients of the
	// external kinds under the Local policy (nil under Cluster).
	inCluster []*vsplanev1.RealServer
}

func (p *portTranslation) entry(set vsplanev1.IPSet, ip netip.Addr) *vsplanev1.IPSetEntry {
	return &vsplanev1.IPSetEntry{Set: set, Family: p.f, Ip: ip.String(), Port: uint32(p.sp.Port), Protocol: p.proto}
}

// loopBack: a local endpoint reaching itself through the Service is
// masqueraded. kube-proxy adds every local endpoint of the port, whatever
// its conditions.
func (p *portTranslation) loopBack(eps []endpoint) {
	for i := range eps {
		if eps[i].local {
			e := p.entry(vsplanev1.IPSet_IP_SET_LOOP_BACK, eps[i].addr)
			e.Port, e.Ip2 = uint32(eps[i].port), eps[i].addr.String()
			p.t.sets.add(e)
		}
	}
}

// clusterIP is the ClusterIP virtual server, its real servers selected by
// the internal traffic policy.
func (p *portTranslation) clusterIP(ip netip.Addr, sel *selection) {
	svc := p.t.svc
	vs := newVirtualServer(svc, p.sp, p.fam)
	vs.Kind = vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP
	vs.Address = ip.String()
	vs.Binding = vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS
	vs.TrafficPolicy = policy(svc.InternalTrafficPolicy)
	vs.RealServers, vs.Reject = realServers(sel, svc.InternalTrafficPolicy)
	if p.t.add(vs, fmt.Sprintf("port %s clusterIP %s", p.name, ip)) {
		p.t.sets.add(p.entry(vsplanev1.IPSet_IP_SET_CLUSTER_IP, ip))
	}
}

// external adds the virtual server of an external IP or load-balancer IP,
// or returns nil when another Service owns it, it collides with this
// node's NodePort, or add refused it.
func (p *portTranslation) external(kind vsplanev1.VirtualServerKind, ip netip.Addr, what string) *vsplanev1.VirtualServer {
	svc, sp := p.t.svc, p.sp
	if _, yielded := p.t.conflicts.VIPs[model.VIP{Addr: ip, Proto: sp.Protocol, Port: sp.Port}]; yielded {
		return nil // an older Service owns this virtual server (engine conflicts; the problem says so)
	}
	if np, ok := nodePortClaiming(svc, p.t.conflicts, sp.Port, sp.Protocol); ok && p.t.isNodePortAddress(ip) {
		p.t.problem("port %s %s %s: this node's NodePort address %s and port %d/%s are NodePort %d of port %s; served as NodePort only",
			p.name, what, ip, ip, sp.Port, sp.Protocol, np.NodePort, portLabel(np))
		return nil
	}
	vs := newVirtualServer(svc, sp, p.fam)
	vs.Kind = kind
	vs.Address = ip.String()
	vs.Binding = vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL
	vs.TrafficPolicy = policy(svc.ExternalTrafficPolicy)
	vs.RealServers, vs.Reject = cloneRealServers(p.rs), p.reject
	vs.InClusterRealServers = cloneRealServers(p.inCluster)
	if !p.t.add(vs, fmt.Sprintf("port %s %s %s", p.name, what, ip)) {
		return nil
	}
	return vs
}

func (p *portTranslation) externalIPs() {
	for _, ip := range p.t.svc.ExternalIPs {
		if !p.t.conflicts.keepsExternalIP(ip) || model.FamilyOf(ip) != p.fam {
			continue
		}
		if p.external(vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP, ip, "externalIP") == nil {
			continue
		}
		// kube-proxy puts an external IP in exactly one of the two sets:
		// KUBE-EXTERNAL-IP masquerades, KUBE-EXTERNAL-IP-LOCAL keeps the
		// client's source address.
		set := vsplanev1.IPSet_IP_SET_EXTERNAL_IP
		if p.extLocal {
			set = vsplanev1.IPSet_IP_SET_EXTERNAL_IP_LOCAL
		}
		p.t.sets.add(p.entry(set, ip))
	}
}

func (p *portTranslation) loadBalancerIPs() {
	t := p.t
	ranges, _ := sourceRanges(t.svc, p.fam)
	fromNode := allowFromNode(ranges, t.node, p.fam)
	for _, ip := range t.svc.LoadBalancerIPs {
		if model.FamilyOf(ip) != p.fam {
			continue
		}
		vs := p.external(vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER, ip, "loadBalancer IP")
		if vs == nil {
			continue
		}
		vs.SourceRanges = prefixes(ranges)
		t.sets.add(p.entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER, ip))
		if p.extLocal {
			t.sets.add(p.entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_LOCAL, ip))
		}
		if len(ranges) == 0 {
			continue
		}
		t.sets.add(p.entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_FW, ip))
		for _, r := range ranges {
			e := p.entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR, ip)
			e.Net = r.String()
			t.sets.add(e)
		}
		if fromNode {
			// Traffic from the node itself to the LB IP bound on
			// kube-ipvs0 has the LB IP as its source address.
			e := p.entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_IP, ip)
			e.Ip2 = ip.String()
			t.sets.add(e)
		}
	}
}

// nodePort is the NodePort marker virtual server (expanded per NodePort
// address by the agent) and its sets.
func (p *portTranslation) nodePort() {
	sp := p.sp
	if sp.NodePort == 0 {
		return
	}
	vs := newVirtualServer(p.t.svc, sp, p.fam)
	vs.Kind = vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT
	vs.NodePortAddresses = true
	vs.Port = uint32(sp.NodePort)
	vs.Binding = vsplanev1.AddressBinding_ADDRESS_BINDING_NONE
	vs.TrafficPolicy = policy(p.t.svc.ExternalTrafficPolicy)
	vs.RealServers, vs.Reject = cloneRealServers(p.rs), p.reject
	vs.InClusterRealServers = cloneRealServers(p.inCluster)
	if !p.t.add(vs, fmt.Sprintf("port %s nodePort %d", p.name, sp.NodePort)) {
		return
	}
	for _, set := range nodePortSets(sp.Protocol, p.extLocal) {
		e := &vsplanev1.IPSetEntry{Set: set, Family: p.f, Port: uint32(sp.NodePort)}
		if sp.Protocol == model.SCTP {
			// hash:ip,port: one entry per NodePort address, expanded by the agent.
			e.Protocol, e.NodePortAddresses = p.proto, true
		}
		p.t.sets.add(e)
	}
}

// nodePortSets returns the sets a NodePort of protocol p goes in.
func nodePortSets(p model.Protocol, local bool) []vsplanev1.IPSet {
	var all, loc vsplanev1.IPSet
	switch p {
	case model.TCP:
		all, loc = vsplanev1.IPSet_IP_SET_NODE_PORT_TCP, vsplanev1.IPSet_IP_SET_NODE_PORT_LOCAL_TCP
	case model.UDP:
		all, loc = vsplanev1.IPSet_IP_SET_NODE_PORT_UDP, vsplanev1.IPSet_IP_SET_NODE_PORT_LOCAL_UDP
	case model.SCTP:
		all, loc = vsplanev1.IPSet_IP_SET_NODE_PORT_SCTP_HASH, vsplanev1.IPSet_IP_SET_NODE_PORT_LOCAL_SCTP_HASH
	default:
		return nil
	}
	if local {
		return []vsplanev1.IPSet{all, loc}
	}
	return []vsplanev1.IPSet{all}
}

// isNodePortAddress reports whether ip is one of the node's addresses that
// NodePorts are served on (Config.NodePortAddresses; empty = all).
func (t *translation) isNodePortAddress(ip netip.Addr) bool {
	if !slices.Contains(t.node.Addresses, ip) {
		return false
	}
	// Per family, as the agent selects them: no CIDR of ip's family = all.
	var sameFamily bool
	for _, p := range t.cfg.nodePortPrefixes(t.node) {
		if p.Addr().Is4() == ip.Is4() {
			if p.Contains(ip) {
				return true
			}
			sameFamily = true
		}
	}
	return !sameFamily
}

func portLabel(sp model.ServicePort) string {
	name := sp.Name
	if name == "" {
		name = strconv.Itoa(int(sp.Port))
	}
	return name + "/" + sp.Protocol.String()
}

func cloneRealServers(in []*vsplanev1.RealServer) []*vsplanev1.RealServer {
	if in == nil {
		return nil
	}
	out := make([]*vsplanev1.RealServer, len(in))
	for i, r := range in {
		out[i] = proto.Clone(r).(*vsplanev1.RealServer)
	}
	return out
}

var schedulerFlags = map[model.SchedulerFlag]vsplanev1.VirtualServerFlag{
	model.FlagSHFallback: vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_SH_FALLBACK,
	model.FlagSHPort:     vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_SH_PORT,
	model.FlagMHFallback: vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_MH_FALLBACK,
	model.FlagMHPort:     vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_MH_PORT,
}

// newVirtualServer fills what every kind of virtual server of a port shares.
func newVirtualServer(svc *model.Service, sp model.ServicePort, fam model.Family) *vsplanev1.VirtualServer {
	vs := &vsplanev1.VirtualServer{
		Family:   family(fam),
		Port:     uint32(sp.Port),
		Protocol: protocol(sp.Protocol),
		PortName: sp.Name,
		// Scheduler stays "" (the node default from NodeSettings) unless the
		// Service or a rollout names one (Service sets it at the end). The
		// agent adds the mh-port flag when the effective scheduler is "mh".
	}
	if svc.Sticky {
		vs.Flags = append(vs.Flags, vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT)
		vs.PersistenceTimeoutSeconds = svc.StickyTimeoutSeconds
	}
	return vs
}

// ipsetBuilder collects ipset entries without duplicates.
type ipsetBuilder struct {
	entries []*vsplanev1.IPSetEntry
}

func (b *ipsetBuilder) add(e *vsplanev1.IPSetEntry) { b.entries = append(b.entries, e) }

func (b *ipsetBuilder) sorted() []*vsplanev1.IPSetEntry {
	slices.SortFunc(b.entries, compareEntry)
	return slices.CompactFunc(b.entries, func(x, y *vsplanev1.IPSetEntry) bool { return compareEntry(x, y) == 0 })
}

func compareEntry(x, y *vsplanev1.IPSetEntry) int {
	return cmp.Or(
		cmp.Compare(x.Set, y.Set),
		cmp.Compare(x.Family, y.Family),
		compareIP(x.Ip, y.Ip),
		cmp.Compare(x.Port, y.Port),
		cmp.Compare(x.Protocol, y.Protocol),
		compareIP(x.Ip2, y.Ip2),
		cmp.Compare(x.Net, y.Net),
		compareBool(x.NodePortAddresses, y.NodePortAddresses),
	)
}

func compareIP(a, b string) int {
	pa, ea := netip.ParseAddr(a)
	pb, eb := netip.ParseAddr(b)
	if ea == nil && eb == nil {
		return pa.Compare(pb)
	}
	return cmp.Compare(a, b)
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func family(f model.Family) vsplanev1.IPFamily {
	switch f {
	case model.IPv4:
		return vsplanev1.IPFamily_IP_FAMILY_IPV4
	case model.IPv6:
		return vsplanev1.IPFamily_IP_FAMILY_IPV6
	}
	return vsplanev1.IPFamily_IP_FAMILY_UNSPECIFIED
}

func protocol(p model.Protocol) vsplanev1.Protocol {
	switch p {
	case model.TCP:
		return vsplanev1.Protocol_PROTOCOL_TCP
	case model.UDP:
		return vsplanev1.Protocol_PROTOCOL_UDP
	case model.SCTP:
		return vsplanev1.Protocol_PROTOCOL_SCTP
	}
	return vsplanev1.Protocol_PROTOCOL_UNSPECIFIED
}

func policy(p model.TrafficPolicy) vsplanev1.TrafficPolicy {
	if p == model.PolicyLocal {
		return vsplanev1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	return vsplanev1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
}
