package reconcile

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// compiler turns wire resources into kernel-level desired state, checking
// every value against what this node offers (validate.go).
type compiler struct {
	families familySet
	// schedulers the kernel offers, sorted; nil when the list is unknown
	// (then any well-formed name passes and the kernel decides).
	schedulers []string
	// defaultScheduler is the node default in force before this resource;
	// node/settings naming a scheduler the kernel lacks keeps it.
	defaultScheduler string
}

// compile turns a wire resource into its kernel-level desired state. It
// never fails as a whole: bad parts become problems and are skipped. The
// resource's identity (checkIdentity) is checked by the caller.
func (c *compiler) compile(res *vsplanev1.Resource) *resourceState {
	rs := &resourceState{name: res.GetName(), version: res.GetVersion()}
	switch body := res.GetBody().(type) {
	case *vsplanev1.Resource_Service:
		if rs.name == SettingsResource {
			rs.problem("resource %s must carry node_settings", rs.name)
			break
		}
		c.compileService(rs, body.Service)
	case *vsplanev1.Resource_NodeSettings:
		if rs.name != SettingsResource {
			rs.problem("node_settings only allowed in resource %q", SettingsResource)
			break
		}
		s := c.compileSettings(rs, body.NodeSettings)
		rs.settings = &s
	default:
		rs.problem("resource has no body")
	}
	return rs
}

// compileSettings compiles node/settings. A bad value is reported and
// replaced by its default (the scheduler: by the one in force), so one bad
// field never takes the others, or every Service, down with it.
func (c *compiler) compileSettings(rs *resourceState, ns *vsplanev1.NodeSettings) settings {
	s := defaultSettings()
	if c.defaultScheduler != "" {
		s.defaultScheduler = c.defaultScheduler
	}
	if d := ns.GetDefaultScheduler(); d != "" {
		if err := checkScheduler(d, c.schedulers); err != nil {
			rs.problem("%v", bad("default_scheduler", d, "%v; keeping %q", err, s.defaultScheduler))
		} else {
			s.defaultScheduler = d
		}
	} else {
		s.defaultScheduler = defaultSettings().defaultScheduler
	}
	timeout := func(field string, v uint32) time.Duration {
		if v > maxIPVSTimeout {
			rs.problem("%v", bad(field, v, "out of range 0..%d (the kernel's limit); left unchanged", maxIPVSTimeout))
			return 0
		}
		return secs(v)
	}
	s.timeouts = kernel.Timeouts{
		TCP:    timeout("tcp_timeout_seconds", ns.GetTcpTimeoutSeconds()),
		TCPFin: timeout("tcp_fin_timeout_seconds", ns.GetTcpFinTimeoutSeconds()),
		UDP:    timeout("udp_timeout_seconds", ns.GetUdpTimeoutSeconds()),
	}
	s.strictARP = ns.GetStrictArp()
	s.masqueradeAll = ns.GetMasqueradeAll()
	// proto3 cannot tell 0 from unset: 0 means kube-proxy's default 14.
	switch bit := ns.GetMasqueradeBit(); {
	case bit > 31:
		rs.problem("%v", bad("masquerade_bit", bit, "out of range 0..31; using %d", rules.DefaultMasqueradeBit))
	case bit != 0:
		s.masqueradeBit = uint8(bit)
	}
	if masqFor(s.masqueradeBit) == 0 {
		rs.problem("%v", bad("masquerade_bit", s.masqueradeBit, "lies in the in-cluster mark field %#x: in-cluster clients of Local external policy get the Local policy", rules.InClusterMarkMask))
	}
	s.clusterCIDRs = parsePrefixes(rs, "cluster_cidrs", ns.GetClusterCidrs())
	s.nodePodCIDRs = parsePrefixes(rs, "node_pod_cidrs", ns.GetNodePodCidrs())
	s.localDetect = vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_CLUSTER_CIDR
	switch m := ns.GetLocalDetectMode(); m {
	case vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_UNSPECIFIED, vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_CLUSTER_CIDR:
	case vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_NODE_CIDR:
		s.localDetect = m
	case vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_BRIDGE_INTERFACE, vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_INTERFACE_NAME_PREFIX:
		prefix := m == vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_INTERFACE_NAME_PREFIX
		if err := wire.CheckInterfaceName(ns.GetLocalInterface(), prefix); err != nil {
			rs.problem("%v", bad("local_interface", ns.GetLocalInterface(), "%v (local_detect_mode %v); telling Pods by cluster_cidrs", err, m))
			break
		}
		s.localDetect, s.localInterface = m, ns.GetLocalInterface()
	default:
		rs.problem("%v", bad("local_detect_mode", m, "unknown mode; telling Pods by cluster_cidrs"))
	}
	s.excludeCIDRs = parsePrefixes(rs, "exclude_cidrs", ns.GetExcludeCidrs())
	s.nodePortCIDRs = parsePrefixes(rs, "node_port_addresses", ns.GetNodePortAddresses())
	for i, a := range ns.GetNodeIps() {
		if _, err := parseAddr(a); err != nil {
			rs.problem("%v", bad(fmt.Sprintf("node_ips[%d]", i), a, "%v", err))
		}
	}
	if z := ns.GetZone(); !labelValue(z) {
		rs.problem("%v", bad("zone", z, "not a label value (at most 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)"))
	}
	if p := ns.GetReconcilePeriodSeconds(); p > maxReconcilePeriod {
		rs.problem("%v", bad("reconcile_period_seconds", p, "out of range 0..%d; using the agent's default", maxReconcilePeriod))
	} else {
		s.reconcilePeriod = p
	}
	s.nodeDeleting = ns.GetNodeDeleting()
	s.conntrack = compileConntrack(rs, ns.GetConntrack())
	return s
}

// maxSysctlInt is the largest value an int sysctl holds.
const maxSysctlInt = 1<<31 - 1

// compileConntrack checks ct's values against what the sysctls hold; an
// out-of-range one is reported and left at 0 (the kernel's value stays).
func compileConntrack(rs *resourceState, ct *vsplanev1.ConntrackSettings) conntrackSettings {
	field := func(name string, v uint32) int {
		if v > maxSysctlInt {
			rs.problem("%v", bad("conntrack."+name, v, "out of range 0..%d (a sysctl's int); left unchanged", maxSysctlInt))
			return 0
		}
		return int(v)
	}
	return conntrackSettings{
		maxPerCore: field("max_per_core", ct.GetMaxPerCore()), min: field("min", ct.GetMin()),
		tcpEstablished: field("tcp_established_timeout_seconds", ct.GetTcpEstablishedTimeoutSeconds()),
		tcpCloseWait:   field("tcp_close_wait_timeout_seconds", ct.GetTcpCloseWaitTimeoutSeconds()),
		tcpBeLiberal:   ct.GetTcpBeLiberal(),
		udp:            field("udp_timeout_seconds", ct.GetUdpTimeoutSeconds()),
		udpStream:      field("udp_stream_timeout_seconds", ct.GetUdpStreamTimeoutSeconds()),
	}
}

func parsePrefixes(rs *resourceState, field string, in []string) []netip.Prefix {
	var out []netip.Prefix
	for i, c := range in {
		p, err := parsePrefix(c)
		if err != nil {
			rs.problem("%v", bad(fmt.Sprintf("%s[%d]", field, i), c, "%v", err))
			continue
		}
		out = append(out, p)
	}
	return out
}

func (c *compiler) compileService(rs *resourceState, svc *vsplanev1.ServiceState) {
	tm := &templates{}
	rs.noLocalInternal, rs.noLocalExternal = svc.GetNoLocalEndpointsInternal(), svc.GetNoLocalEndpointsExternal()
	// The health-check server names the Service after the (checked)
	// resource name; namespace and name, when set, must agree with it.
	namespace, name, _ := serviceName(rs.name)
	identity := (svc.GetNamespace() == "" || svc.GetNamespace() == namespace) && (svc.GetName() == "" || svc.GetName() == name)
	if !identity {
		rs.problem("namespace %s, name %s: do not match resource name %s", quote(svc.GetNamespace()), quote(svc.GetName()), quote(rs.name))
	}
	if p := svc.GetHealthCheckNodePort(); p != 0 {
		if err := checkPort("health_check_node_port", p); err != nil {
			rs.problem("%v", err)
		} else if identity {
			rs.health = &HealthCheck{Resource: rs.name, Namespace: namespace, Name: name,
				Port: uint16(p), LocalEndpoints4: int(svc.GetLocalEndpoints()), LocalEndpoints6: int(svc.GetLocalEndpointsIpv6())}
			for _, v := range svc.GetVirtualServers() {
				switch v.GetFamily() {
				case vsplanev1.IPFamily_IP_FAMILY_IPV4:
					rs.health.IPv4 = c.families.has(kernel.FamilyIPv4)
				case vsplanev1.IPFamily_IP_FAMILY_IPV6:
					rs.health.IPv6 = c.families.has(kernel.FamilyIPv6)
				}
			}
		}
	}
	explicit := 0
	for _, v := range svc.GetVirtualServers() {
		if !v.GetNodePortAddresses() {
			explicit++
		}
	}
	rs.vss = make(vsList, 0, explicit)
	// Duplicates: a linear search among few servers, a map among many.
	var seenVS map[kernel.VirtualServerKey]bool
	if explicit > 16 {
		seenVS = make(map[kernel.VirtualServerKey]bool, explicit)
	}
	for i, v := range svc.GetVirtualServers() {
		at := fmt.Sprintf("virtual_servers[%d]", i)
		d, err := c.compileVS(v)
		if err != nil {
			rs.problem("%v", err.under(at))
			continue
		}
		if v.GetNodePortAddresses() {
			if slices.ContainsFunc(tm.vss, func(o desiredVS) bool { return o.vs.Key == d.vs.Key }) {
				rs.problem("%s: duplicate NodePort virtual server %v/%d", at, d.vs.Key.Protocol, d.vs.Key.Port)
				continue
			}
			tm.vss = append(tm.vss, d)
			continue
		}
		dup := seenVS[d.vs.Key]
		if seenVS == nil {
			dup = slices.ContainsFunc(rs.vss, func(o desiredVS) bool { return o.vs.Key == d.vs.Key })
		}
		if dup {
			rs.problem("%s: duplicate virtual server %v", at, d.vs.Key)
			continue
		}
		if seenVS != nil {
			seenVS[d.vs.Key] = true
		}
		rs.vss = append(rs.vss, d)
	}
	rs.vss.sort()
	seen := map[entryKey]bool{}
	for i, e := range svc.GetIpsetEntries() {
		ek, err := c.compileEntry(e)
		if err != nil {
			rs.problem("%v", err.under(fmt.Sprintf("ipset_entries[%d]", i)))
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
	inCluster := slices.ContainsFunc(rs.vss, func(d desiredVS) bool { return len(d.inCluster) > 0 }) ||
		slices.ContainsFunc(tm.vss, func(d desiredVS) bool { return len(d.inCluster) > 0 })
	if len(tm.vss) > 0 || len(tm.entries) > 0 || inCluster {
		tm.base = &resourceState{name: rs.name, version: rs.version, vss: rs.vss, entries: rs.entries,
			problems: rs.problems, health: rs.health, noLocalInternal: rs.noLocalInternal, noLocalExternal: rs.noLocalExternal}
		rs.tmpl = tm
	}
}

// compileVS compiles one virtual server. A node_port_addresses marker
// comes back as a template: Key.Address is the zero Addr and Key.Family
// the marker's family (expand fills the address in). Error paths are
// relative to the virtual server.
func (c *compiler) compileVS(v *vsplanev1.VirtualServer) (desiredVS, *fieldError) {
	if !knownEnum(v.GetKind(), vsplanev1.VirtualServerKind_name) {
		return desiredVS{}, bad("kind", v.GetKind(), "unknown kind")
	}
	if err := checkFamilyEnum("family", v.GetFamily()); err != nil {
		return desiredVS{}, err
	}
	var addr netip.Addr
	if v.GetNodePortAddresses() {
		if v.GetAddress() != "" {
			return desiredVS{}, bad("address", v.GetAddress(), "node_port_addresses virtual server with an address (must be empty)")
		}
		// Validate as if on the family's unspecified address.
		switch v.GetFamily() {
		case vsplanev1.IPFamily_IP_FAMILY_IPV4:
			addr = netip.IPv4Unspecified()
		case vsplanev1.IPFamily_IP_FAMILY_IPV6:
			addr = netip.IPv6Unspecified()
		default:
			return desiredVS{}, bad("family", v.GetFamily(), "node_port_addresses virtual server without family")
		}
	} else {
		var err error
		if addr, err = parseServiceAddr(v.GetAddress()); err != nil {
			return desiredVS{}, bad("address", v.GetAddress(), "%v", err)
		}
	}
	fam := kernel.FamilyOf(addr)
	if err := checkFamily(v.GetFamily(), fam, c.families); err != nil {
		return desiredVS{}, bad("family", v.GetFamily(), "%v", err)
	}
	proto, err := protocol(v.GetProtocol())
	if err != nil {
		return desiredVS{}, bad("protocol", v.GetProtocol(), "%v", err)
	}
	if err := checkPort("port", v.GetPort()); err != nil {
		return desiredVS{}, err
	}
	vs := kernel.VirtualServer{Key: kernel.AddrKey(addr, proto, uint16(v.GetPort())), Scheduler: v.GetScheduler()}
	if vs.Scheduler != "" {
		if err := checkScheduler(vs.Scheduler, c.schedulers); err != nil {
			return desiredVS{}, bad("scheduler", vs.Scheduler, "%v", err)
		}
	}
	for i, f := range v.GetFlags() {
		kf, err := flag(f)
		if err != nil {
			return desiredVS{}, bad(fmt.Sprintf("flags[%d]", i), f, "%v", err)
		}
		vs.Flags |= kf
	}
	t := v.GetPersistenceTimeoutSeconds()
	switch {
	case vs.Flags&kernel.FlagPersistent != 0 && (t == 0 || t > maxPersistenceTimeout):
		return desiredVS{}, bad("persistence_timeout_seconds", t, "out of range 1..%d for a persistent virtual server", maxPersistenceTimeout)
	case vs.Flags&kernel.FlagPersistent != 0:
		vs.Timeout = t
	case t != 0:
		return desiredVS{}, bad("persistence_timeout_seconds", t, "set without the PERSISTENT flag")
	}
	for i, r := range v.GetSourceRanges() {
		p, err := parsePrefix(r)
		if err == nil && kernel.FamilyOf(p.Addr()) != fam {
			err = fmt.Errorf("not %s like the virtual server", familyName(fam))
		}
		if err != nil {
			return desiredVS{}, bad(fmt.Sprintf("source_ranges[%d]", i), r, "%v", err)
		}
	}
	check := vs
	if check.Scheduler == "" {
		check.Scheduler = "rr" // the node default is checked in node/settings
	}
	if err := check.Validate(); err != nil {
		return desiredVS{}, bad("", nil, "%v", err)
	}
	d := desiredVS{vs: vs, binding: v.GetBinding(), reject: v.GetReject()}
	if !knownEnum(d.binding, vsplanev1.AddressBinding_name) {
		return desiredVS{}, bad("binding", d.binding, "unknown binding")
	}
	if d.binding == vsplanev1.AddressBinding_ADDRESS_BINDING_UNSPECIFIED {
		d.binding = defaultBinding(v.GetKind())
	}
	if v.GetNodePortAddresses() {
		// NodePort addresses already belong to the node: never bound.
		if d.binding != vsplanev1.AddressBinding_ADDRESS_BINDING_NONE {
			return desiredVS{}, bad("binding", d.binding, "node_port_addresses virtual server must have binding NONE")
		}
		d.vs.Key.Address = netip.Addr{}
	}
	if d.reject && len(v.GetRealServers()) > 0 {
		// reject means "no usable endpoint": real servers contradict it.
		return desiredVS{}, bad("real_servers", nil, "reject with %d real servers (must have none)", len(v.GetRealServers()))
	}
	var ferr *fieldError
	if d.dests, ferr = compileRealServers(v.GetRealServers(), fam, "real_servers"); ferr != nil {
		return desiredVS{}, ferr
	}
	if in := v.GetInClusterRealServers(); len(in) > 0 {
		switch v.GetKind() {
		case vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER, vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP,
			vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT:
		default:
			return desiredVS{}, bad("in_cluster_real_servers", nil, "only for load-balancer, external IP and NodePort virtual servers (kind %v)", v.GetKind())
		}
		if d.inCluster, ferr = compileRealServers(in, fam, "in_cluster_real_servers"); ferr != nil {
			return desiredVS{}, ferr
		}
	}
	return d, nil
}

// compileRealServers compiles the list field of real servers of a virtual
// server of family fam: sorted by key, unique (nil when empty).
func compileRealServers(list []*vsplanev1.RealServer, fam kernel.Family, field string) ([]desiredDest, *fieldError) {
	if len(list) == 0 {
		return nil, nil
	}
	out := make([]desiredDest, 0, len(list)) // exactly: 20k servers at 10k Services
	seen := make(map[kernel.DestinationKey]bool, len(list))
	for i, r := range list {
		dst, err := compileRealServer(r, fam)
		if err != nil {
			return nil, err.under(fmt.Sprintf("%s[%d]", field, i))
		}
		if seen[dst.Key()] {
			return nil, bad(fmt.Sprintf("%s[%d]", field, i), nil, "duplicate real server %v", dst.Key())
		}
		seen[dst.Key()] = true
		out = append(out, newDesiredDest(dst)) // weight checked: 0..maxWeight
	}
	slices.SortFunc(out, func(a, b desiredDest) int { return a.Key().Compare(b.Key()) })
	return out, nil
}

// compileRealServer compiles one real server of a virtual server of
// family fam; error paths are relative to the real server.
func compileRealServer(r *vsplanev1.RealServer, fam kernel.Family) (kernel.Destination, *fieldError) {
	ra, err := parseServiceAddr(r.GetAddress())
	if err != nil {
		return kernel.Destination{}, bad("address", r.GetAddress(), "%v", err)
	}
	if kernel.FamilyOf(ra) != fam {
		return kernel.Destination{}, bad("address", r.GetAddress(), "not %s like the virtual server", familyName(fam))
	}
	if err := checkPort("port", r.GetPort()); err != nil {
		return kernel.Destination{}, err
	}
	if w := r.GetWeight(); w > maxWeight {
		return kernel.Destination{}, bad("weight", w, "out of range 0..%d", maxWeight)
	}
	dst := kernel.Destination{Address: ra, Port: uint16(r.GetPort()), Weight: int(r.GetWeight()), Forward: kernel.ForwardMasq}
	if err := dst.Validate(fam); err != nil {
		return kernel.Destination{}, bad("", nil, "%v", err)
	}
	return dst, nil
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
		return fmt.Errorf("does not match address")
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

// compileEntry compiles one ipset entry; error paths are relative to it.
func (c *compiler) compileEntry(e *vsplanev1.IPSetEntry) (entryKey, *fieldError) {
	set, ok := protoSets[e.GetSet()]
	if !ok {
		return entryKey{}, bad("set", e.GetSet(), "unknown set")
	}
	if set == rules.SetIPVSIPs {
		// Its addresses decide what KUBE-IPVS-FILTER rejects on the node.
		return entryKey{}, bad("set", e.GetSet(), "filled by the agent from %s, not accepted from the control plane", kernel.DummyDevice)
	}
	if err := checkFamilyEnum("family", e.GetFamily()); err != nil {
		return entryKey{}, err
	}
	if e.GetNodePortAddresses() {
		return c.compileEntryTemplate(set, e)
	}
	var ke kernel.Entry
	typ := set.Type()
	for _, f := range []struct {
		name string
		val  string
		dst  *netip.Addr
	}{{"ip", e.GetIp(), &ke.IP}, {"ip2", e.GetIp2(), &ke.IP2}} {
		if f.val == "" {
			continue
		}
		a, err := parseServiceAddr(f.val)
		if err != nil {
			return entryKey{}, bad(f.name, f.val, "%v", err)
		}
		*f.dst = a
	}
	if n := e.GetNet(); n != "" {
		p, err := parsePrefix(n)
		if err != nil {
			return entryKey{}, bad("net", n, "%v", err)
		}
		ke.Net = p
	}
	if typ != kernel.HashIP && typ != kernel.HashNet {
		if err := checkPort("port", e.GetPort()); err != nil {
			return entryKey{}, err
		}
	} else if e.GetPort() != 0 {
		return entryKey{}, bad("port", e.GetPort(), "set %v (%s) has no port", set, typ)
	}
	ke.Port = uint16(e.GetPort())
	if typ != kernel.BitmapPort && typ != kernel.HashIP {
		var err error
		if ke.Protocol, err = protocol(e.GetProtocol()); err != nil {
			return entryKey{}, bad("protocol", e.GetProtocol(), "%v", err)
		}
	}
	fam := kernel.FamilyOf(ke.IP)
	if fam == kernel.FamilyUnspecified {
		fam = kernel.FamilyOf(ke.Net.Addr())
	}
	switch declared := e.GetFamily(); {
	case declared == vsplanev1.IPFamily_IP_FAMILY_IPV4 && fam == kernel.FamilyIPv6,
		declared == vsplanev1.IPFamily_IP_FAMILY_IPV6 && fam == kernel.FamilyIPv4:
		return entryKey{}, bad("family", declared, "does not match address")
	case declared == vsplanev1.IPFamily_IP_FAMILY_IPV4:
		fam = kernel.FamilyIPv4
	case declared == vsplanev1.IPFamily_IP_FAMILY_IPV6:
		fam = kernel.FamilyIPv6
	}
	if fam == kernel.FamilyUnspecified {
		fam = kernel.FamilyIPv4 // bitmap:port entry without family
	}
	if !c.families.has(fam) {
		return entryKey{}, bad("family", e.GetFamily(), "family %v is not enabled on this agent", fam)
	}
	ek := entryKey{set: setRef{set: set, family: fam}, entry: ke.Normalize()}
	if err := ek.entry.Validate(ek.set.spec()); err != nil {
		return entryKey{}, bad("", nil, "%v", err)
	}
	return ek, nil
}
