package reconcile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// SettingsResource is the name of the node-wide settings resource.
const SettingsResource = "node/settings"

// setRef is one kernel ipset: a kube-proxy set of one family.
type setRef struct {
	set    rules.Set
	family kernel.Family
}

func (s setRef) name() string       { return s.set.Name(s.family) }
func (s setRef) spec() kernel.IPSet { return s.set.Spec(s.family) }
func (s setRef) String() string     { return s.name() }

// entryKey is one ipset member; comparable, used as a map key.
type entryKey struct {
	set   setRef
	entry kernel.Entry
}

func (e entryKey) String() string { return e.set.name() + " " + e.entry.Format(e.set.set.Type()) }

// desiredVS is one virtual server a resource asks for.
type desiredVS struct {
	vs      kernel.VirtualServer // Scheduler "" means the node default
	dests   []kernel.Destination // sorted by key, unique
	binding vsplanev1.AddressBinding
	// nodePort: expanded from a node_port_addresses marker (nodeport.go);
	// an explicit virtual server with the same key wins over it.
	nodePort bool
	// reject: a Local traffic policy without local endpoints; programmed
	// with no destinations so IPVS itself refuses the traffic.
	reject bool
}

// kernelVS is the server to program, with the default scheduler filled.
// With the mh scheduler the mh-port flag is added, as kube-proxy does
// (hash on source port too), so a default-scheduler change needs no resend.
func (d desiredVS) kernelVS(defaultScheduler string) kernel.VirtualServer {
	vs := d.vs
	if vs.Scheduler == "" {
		vs.Scheduler = defaultScheduler
	}
	if vs.Scheduler == "mh" {
		vs.Flags |= kernel.FlagMHPort
	}
	return vs.Normalize()
}

// settings is the compiled node/settings resource.
type settings struct {
	defaultScheduler string
	timeouts         kernel.Timeouts
	strictARP        bool
	masqueradeAll    bool
	masqueradeBit    uint8
	clusterCIDRs     []netip.Prefix
	excludeCIDRs     []netip.Prefix
	// nodePortCIDRs select the NodePort addresses (empty: all).
	nodePortCIDRs   []netip.Prefix
	reconcilePeriod uint32 // seconds, 0 = agent default
	nodeDeleting    bool
}

// defaultSettings apply until a node/settings resource arrives.
func defaultSettings() settings {
	return settings{defaultScheduler: "rr", masqueradeBit: rules.DefaultMasqueradeBit}
}

// resourceState is one compiled resource.
type resourceState struct {
	name, version string
	vss           map[kernel.VirtualServerKey]desiredVS
	entries       []entryKey
	settings      *settings
	// problems are content errors found while compiling; the rest of the
	// resource is applied, but it is NACKed and not retried.
	problems []string
	// tmpl holds the node_port_addresses markers and the explicit content;
	// nil when the resource has no marker. vss, entries and problems are
	// then the expansion over the current NodePort addresses (expand).
	tmpl *templates
	// health is the Service's health-check node port (nil: none).
	health *HealthCheck
}

// compile turns a wire resource into its kernel-level desired state. It
// never fails as a whole: bad parts become problems and are skipped.
func compile(res *vsplanev1.Resource, families familySet) *resourceState {
	rs := &resourceState{name: res.GetName(), version: res.GetVersion(), vss: map[kernel.VirtualServerKey]desiredVS{}}
	switch body := res.GetBody().(type) {
	case *vsplanev1.Resource_Service:
		if rs.name == SettingsResource {
			rs.problem("resource %s must carry node_settings", rs.name)
			break
		}
		compileService(rs, body.Service, families)
	case *vsplanev1.Resource_NodeSettings:
		if rs.name != SettingsResource {
			rs.problem("node_settings only allowed in resource %q", SettingsResource)
			break
		}
		s := compileSettings(rs, body.NodeSettings)
		rs.settings = &s
	default:
		rs.problem("resource has no body")
	}
	return rs
}

func (rs *resourceState) problem(format string, args ...any) {
	rs.problems = append(rs.problems, fmt.Sprintf(format, args...))
}

func compileSettings(rs *resourceState, ns *vsplanev1.NodeSettings) settings {
	s := defaultSettings()
	if ns.GetDefaultScheduler() != "" {
		s.defaultScheduler = ns.GetDefaultScheduler()
	}
	s.timeouts = kernel.Timeouts{
		TCP:    secs(ns.GetTcpTimeoutSeconds()),
		TCPFin: secs(ns.GetTcpFinTimeoutSeconds()),
		UDP:    secs(ns.GetUdpTimeoutSeconds()),
	}
	s.strictARP = ns.GetStrictArp()
	s.masqueradeAll = ns.GetMasqueradeAll()
	// proto3 cannot tell 0 from unset: 0 means kube-proxy's default 14.
	switch bit := ns.GetMasqueradeBit(); {
	case bit > 31:
		rs.problem("masquerade_bit %d out of range 0..31; using %d", bit, rules.DefaultMasqueradeBit)
	case bit != 0:
		s.masqueradeBit = uint8(bit)
	}
	s.clusterCIDRs = parsePrefixes(rs, "cluster_cidrs", ns.GetClusterCidrs())
	s.excludeCIDRs = parsePrefixes(rs, "exclude_cidrs", ns.GetExcludeCidrs())
	s.nodePortCIDRs = parsePrefixes(rs, "node_port_addresses", ns.GetNodePortAddresses())
	s.reconcilePeriod = ns.GetReconcilePeriodSeconds()
	s.nodeDeleting = ns.GetNodeDeleting()
	return s
}

func parsePrefixes(rs *resourceState, field string, in []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range in {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			rs.problem("%s: %v", field, err)
			continue
		}
		out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked())
	}
	return out
}

func compileService(rs *resourceState, svc *vsplanev1.ServiceState, families familySet) {
	tm := &templates{}
	if p := svc.GetHealthCheckNodePort(); p != 0 {
		if p > 65535 {
			rs.problem("health_check_node_port %d out of range 1..65535", p)
		} else {
			rs.health = &HealthCheck{Resource: rs.name, Namespace: svc.GetNamespace(), Name: svc.GetName(),
				Port: uint16(p), LocalEndpoints: int(svc.GetLocalEndpoints())}
		}
	}
	for i, v := range svc.GetVirtualServers() {
		d, err := compileVS(v, families)
		if err != nil {
			rs.problem("virtual_servers[%d] (%s %s:%d): %v", i, v.GetProtocol(), v.GetAddress(), v.GetPort(), err)
			continue
		}
		if v.GetNodePortAddresses() {
			if slices.ContainsFunc(tm.vss, func(o desiredVS) bool { return o.vs.Key == d.vs.Key }) {
				rs.problem("virtual_servers[%d]: duplicate NodePort virtual server %v/%d", i, d.vs.Key.Protocol, d.vs.Key.Port)
				continue
			}
			tm.vss = append(tm.vss, d)
			continue
		}
		if _, dup := rs.vss[d.vs.Key]; dup {
			rs.problem("virtual_servers[%d]: duplicate virtual server %v", i, d.vs.Key)
			continue
		}
		rs.vss[d.vs.Key] = d
	}
	seen := map[entryKey]bool{}
	for i, e := range svc.GetIpsetEntries() {
		ek, err := compileEntry(e, families)
		if err != nil {
			rs.problem("ipset_entries[%d]: %v", i, err)
			continue
		}
		if !seen[ek] {
			seen[ek] = true
			if e.GetNodePortAddresses() {
				tm.entries = append(tm.entries, ek)
			} else {
				rs.entries = append(rs.entries, ek)
			}
		}
	}
	if len(tm.vss) > 0 || len(tm.entries) > 0 {
		tm.base = &resourceState{name: rs.name, version: rs.version, vss: rs.vss, entries: rs.entries,
			problems: rs.problems, health: rs.health}
		rs.tmpl = tm
	}
}

// compileVS compiles one virtual server. A node_port_addresses marker
// comes back as a template: Key.Address is the zero Addr and Key.Family
// the marker's family (expand fills the address in).
func compileVS(v *vsplanev1.VirtualServer, families familySet) (desiredVS, error) {
	var addr netip.Addr
	if v.GetNodePortAddresses() {
		if v.GetAddress() != "" {
			return desiredVS{}, fmt.Errorf("node_port_addresses virtual server with address %q (must be empty)", v.GetAddress())
		}
		// Validate as if on the family's unspecified address.
		switch v.GetFamily() {
		case vsplanev1.IPFamily_IP_FAMILY_IPV4:
			addr = netip.IPv4Unspecified()
		case vsplanev1.IPFamily_IP_FAMILY_IPV6:
			addr = netip.IPv6Unspecified()
		default:
			return desiredVS{}, fmt.Errorf("node_port_addresses virtual server without family")
		}
	} else {
		var err error
		if addr, err = netip.ParseAddr(v.GetAddress()); err != nil {
			return desiredVS{}, fmt.Errorf("address: %v", err)
		}
		addr = addr.Unmap()
	}
	fam := kernel.FamilyOf(addr)
	if err := checkFamily(v.GetFamily(), fam, families); err != nil {
		return desiredVS{}, err
	}
	proto, err := protocol(v.GetProtocol())
	if err != nil {
		return desiredVS{}, err
	}
	if v.GetPort() == 0 || v.GetPort() > 65535 {
		return desiredVS{}, fmt.Errorf("port %d out of range 1..65535", v.GetPort())
	}
	vs := kernel.VirtualServer{Key: kernel.AddrKey(addr, proto, uint16(v.GetPort())), Scheduler: v.GetScheduler()}
	for _, f := range v.GetFlags() {
		kf, err := flag(f)
		if err != nil {
			return desiredVS{}, err
		}
		vs.Flags |= kf
	}
	if vs.Flags&kernel.FlagPersistent != 0 {
		vs.Timeout = v.GetPersistenceTimeoutSeconds()
	}
	check := vs
	if check.Scheduler == "" {
		check.Scheduler = "rr" // the node default is checked by the kernel
	}
	if err := check.Validate(); err != nil {
		return desiredVS{}, err
	}
	d := desiredVS{vs: vs, binding: v.GetBinding(), reject: v.GetReject()}
	if d.binding == vsplanev1.AddressBinding_ADDRESS_BINDING_UNSPECIFIED {
		d.binding = defaultBinding(v.GetKind())
	}
	if v.GetNodePortAddresses() {
		// NodePort addresses already belong to the node: never bound.
		if d.binding != vsplanev1.AddressBinding_ADDRESS_BINDING_NONE {
			return desiredVS{}, fmt.Errorf("node_port_addresses virtual server with binding %v (must be NONE)", d.binding)
		}
		d.vs.Key.Address = netip.Addr{}
	}
	if d.reject && len(v.GetRealServers()) > 0 {
		// reject means "no usable endpoint": real servers contradict it.
		return desiredVS{}, fmt.Errorf("reject with %d real servers (must have none)", len(v.GetRealServers()))
	}
	seen := map[kernel.DestinationKey]bool{}
	for _, r := range v.GetRealServers() {
		ra, err := netip.ParseAddr(r.GetAddress())
		if err != nil {
			return desiredVS{}, fmt.Errorf("real server address: %v", err)
		}
		if r.GetPort() == 0 || r.GetPort() > 65535 {
			return desiredVS{}, fmt.Errorf("real server %s: port %d out of range", r.GetAddress(), r.GetPort())
		}
		dst := kernel.Destination{Address: ra.Unmap(), Port: uint16(r.GetPort()), Weight: int(r.GetWeight()), Forward: kernel.ForwardMasq}
		if err := dst.Validate(fam); err != nil {
			return desiredVS{}, err
		}
		if seen[dst.Key()] {
			return desiredVS{}, fmt.Errorf("duplicate real server %v", dst.Key())
		}
		seen[dst.Key()] = true
		d.dests = append(d.dests, dst)
	}
	slices.SortFunc(d.dests, func(a, b kernel.Destination) int { return a.Key().Compare(b.Key()) })
	return d, nil
}

// defaultBinding is what an unspecified binding means for each kind.
func defaultBinding(k vsplanev1.VirtualServerKind) vsplanev1.AddressBinding {
	switch k {
	case vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT:
		return vsplanev1.AddressBinding_ADDRESS_BINDING_NONE
	case vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP, vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER:
		return vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL
	}
	return vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS
}

func checkFamily(declared vsplanev1.IPFamily, actual kernel.Family, families familySet) error {
	switch {
	case declared == vsplanev1.IPFamily_IP_FAMILY_IPV4 && actual != kernel.FamilyIPv4,
		declared == vsplanev1.IPFamily_IP_FAMILY_IPV6 && actual != kernel.FamilyIPv6:
		return fmt.Errorf("family %v does not match address", declared)
	case !families.has(actual):
		return fmt.Errorf("family %v is not enabled on this agent", actual)
	}
	return nil
}

func protocol(p vsplanev1.Protocol) (kernel.Protocol, error) {
	switch p {
	case vsplanev1.Protocol_PROTOCOL_TCP:
		return kernel.ProtocolTCP, nil
	case vsplanev1.Protocol_PROTOCOL_UDP:
		return kernel.ProtocolUDP, nil
	case vsplanev1.Protocol_PROTOCOL_SCTP:
		return kernel.ProtocolSCTP, nil
	}
	return 0, fmt.Errorf("protocol %v not supported", p)
}

func flag(f vsplanev1.VirtualServerFlag) (kernel.ServiceFlags, error) {
	switch f {
	case vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT:
		return kernel.FlagPersistent, nil
	case vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_HASHED:
		return 0, nil // kernel-internal
	case vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_ONE_PACKET:
		return kernel.FlagOnePacket, nil
	case vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_SH_FALLBACK:
		return kernel.FlagSHFallback, nil
	case vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_SH_PORT:
		return kernel.FlagSHPort, nil
	case vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_MH_FALLBACK:
		return kernel.FlagMHFallback, nil
	case vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_MH_PORT:
		return kernel.FlagMHPort, nil
	}
	return 0, fmt.Errorf("flag %v not supported", f)
}

// protoSets maps the wire enum to the renderer's set catalog.
var protoSets = map[vsplanev1.IPSet]rules.Set{
	vsplanev1.IPSet_IP_SET_LOOP_BACK:                 rules.SetLoopBack,
	vsplanev1.IPSet_IP_SET_CLUSTER_IP:                rules.SetClusterIP,
	vsplanev1.IPSet_IP_SET_EXTERNAL_IP:               rules.SetExternalIP,
	vsplanev1.IPSet_IP_SET_EXTERNAL_IP_LOCAL:         rules.SetExternalIPLocal,
	vsplanev1.IPSet_IP_SET_LOAD_BALANCER:             rules.SetLoadBalancer,
	vsplanev1.IPSet_IP_SET_LOAD_BALANCER_LOCAL:       rules.SetLoadBalancerLocal,
	vsplanev1.IPSet_IP_SET_LOAD_BALANCER_FW:          rules.SetLoadBalancerFW,
	vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_IP:   rules.SetLoadBalancerSourceIP,
	vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR: rules.SetLoadBalancerSourceCIDR,
	vsplanev1.IPSet_IP_SET_NODE_PORT_TCP:             rules.SetNodePortTCP,
	vsplanev1.IPSet_IP_SET_NODE_PORT_LOCAL_TCP:       rules.SetNodePortLocalTCP,
	vsplanev1.IPSet_IP_SET_NODE_PORT_UDP:             rules.SetNodePortUDP,
	vsplanev1.IPSet_IP_SET_NODE_PORT_LOCAL_UDP:       rules.SetNodePortLocalUDP,
	vsplanev1.IPSet_IP_SET_NODE_PORT_SCTP_HASH:       rules.SetNodePortSCTP,
	vsplanev1.IPSet_IP_SET_NODE_PORT_LOCAL_SCTP_HASH: rules.SetNodePortLocalSCTP,
	vsplanev1.IPSet_IP_SET_HEALTH_CHECK_NODE_PORT:    rules.SetHealthCheckNodePort,
	vsplanev1.IPSet_IP_SET_IPVS_IPS:                  rules.SetIPVSIPs,
}

func compileEntry(e *vsplanev1.IPSetEntry, families familySet) (entryKey, error) {
	set, ok := protoSets[e.GetSet()]
	if !ok {
		return entryKey{}, fmt.Errorf("unknown set %v", e.GetSet())
	}
	if e.GetNodePortAddresses() {
		return compileEntryTemplate(set, e, families)
	}
	var ke kernel.Entry
	var err error
	parseIP := func(s string) netip.Addr {
		if err != nil || s == "" {
			return netip.Addr{}
		}
		var a netip.Addr
		a, err = netip.ParseAddr(s)
		return a.Unmap()
	}
	ke.IP = parseIP(e.GetIp())
	ke.IP2 = parseIP(e.GetIp2())
	if e.GetNet() != "" && err == nil {
		var p netip.Prefix
		p, err = netip.ParsePrefix(e.GetNet())
		ke.Net = p
	}
	if err != nil {
		return entryKey{}, fmt.Errorf("%v: %v", set, err)
	}
	if e.GetPort() > 65535 {
		return entryKey{}, fmt.Errorf("%v: port %d out of range", set, e.GetPort())
	}
	ke.Port = uint16(e.GetPort())
	if set.Type() != kernel.BitmapPort && set.Type() != kernel.HashIP {
		if ke.Protocol, err = protocol(e.GetProtocol()); err != nil {
			return entryKey{}, fmt.Errorf("%v: %v", set, err)
		}
	}
	fam := kernel.FamilyOf(ke.IP)
	switch e.GetFamily() {
	case vsplanev1.IPFamily_IP_FAMILY_IPV4:
		fam = checkedFamily(fam, kernel.FamilyIPv4, &err)
	case vsplanev1.IPFamily_IP_FAMILY_IPV6:
		fam = checkedFamily(fam, kernel.FamilyIPv6, &err)
	}
	if fam == kernel.FamilyUnspecified {
		fam = kernel.FamilyIPv4 // bitmap:port entry without family
	}
	if err == nil && !families.has(fam) {
		err = fmt.Errorf("family %v is not enabled on this agent", fam)
	}
	if err != nil {
		return entryKey{}, fmt.Errorf("%v: %v", set, err)
	}
	ek := entryKey{set: setRef{set: set, family: fam}, entry: ke.Normalize()}
	if err := ek.entry.Validate(ek.set.spec()); err != nil {
		return entryKey{}, err
	}
	return ek, nil
}

func checkedFamily(fromIP, declared kernel.Family, err *error) kernel.Family {
	if fromIP != kernel.FamilyUnspecified && fromIP != declared && *err == nil {
		*err = fmt.Errorf("family %v does not match address", declared)
	}
	return declared
}
