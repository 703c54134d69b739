package reconcile

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// dualStack compiles for both families with the stock schedulers.
var testCompiler = &compiler{families: familySet{kernel.FamilyIPv4, kernel.FamilyIPv6},
	schedulers: []string{"mh", "rr", "sh", "wrr"}, defaultScheduler: "rr"}

// goodService is a Service exercising every field the agent reads: a
// persistent LB virtual server with source ranges and two real servers,
// an IPv6 ClusterIP, a NodePort marker, and entries of every set type.
func goodService() *vsplanev1.Resource {
	v4, v6 := vsplanev1.IPFamily_IP_FAMILY_IPV4, vsplanev1.IPFamily_IP_FAMILY_IPV6
	tcp := vsplanev1.Protocol_PROTOCOL_TCP
	lb := "198.18.200.1"
	entry := func(set vsplanev1.IPSet) *vsplanev1.IPSetEntry {
		return &vsplanev1.IPSetEntry{Set: set, Family: v4, Ip: lb, Port: 80, Protocol: tcp}
	}
	cidr := entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_CIDR)
	cidr.Net = "198.19.50.0/24"
	src := entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_SOURCE_IP)
	src.Ip2 = lb
	loop := &vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_LOOP_BACK, Family: v4, Ip: "198.19.1.2", Port: 8080, Protocol: tcp, Ip2: "198.19.1.2"}
	return &vsplanev1.Resource{Name: "service/web/front", Version: "v1", Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
		Namespace: "web", Name: "front", HealthCheckNodePort: 32000, LocalEndpoints: 1,
		VirtualServers: []*vsplanev1.VirtualServer{{
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER, Address: lb, Family: v4, Port: 80, Protocol: tcp,
			Scheduler: "wrr", Flags: []vsplanev1.VirtualServerFlag{vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT},
			PersistenceTimeoutSeconds: 10800, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL,
			SourceRanges: []string{"198.19.50.0/24"},
			RealServers: []*vsplanev1.RealServer{
				{Address: "198.19.1.2", Port: 8080, Weight: 1}, {Address: "198.19.2.3", Port: 8080, Weight: 0},
			},
		}, {
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: "2001:2::10", Family: v6, Port: 80, Protocol: tcp,
			RealServers: []*vsplanev1.RealServer{{Address: "2001:2:0:100::2", Port: 8080, Weight: 1}},
		}, {
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT, NodePortAddresses: true, Family: v4, Port: 30080,
			Protocol: tcp, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_NONE,
			RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.2", Port: 8080, Weight: 1}},
		}},
		IpsetEntries: []*vsplanev1.IPSetEntry{
			entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER), entry(vsplanev1.IPSet_IP_SET_LOAD_BALANCER_FW), cidr, src, loop,
			{Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP, Family: v6, Ip: "2001:2::10", Port: 80, Protocol: tcp},
			{Set: vsplanev1.IPSet_IP_SET_NODE_PORT_TCP, Family: v4, Port: 30080},
			{Set: vsplanev1.IPSet_IP_SET_HEALTH_CHECK_NODE_PORT, Family: v4, Port: 32000},
			{Set: vsplanev1.IPSet_IP_SET_NODE_PORT_SCTP_HASH, Family: v4, Port: 30081, Protocol: vsplanev1.Protocol_PROTOCOL_SCTP, NodePortAddresses: true},
		},
	}}}
}

func goodSettings() *vsplanev1.Resource {
	return settingsRes(&vsplanev1.NodeSettings{DefaultScheduler: "rr", TcpTimeoutSeconds: 900, MasqueradeBit: 14,
		ClusterCidrs: []string{"198.19.0.0/16", "2001:2:0:100::/56"}, ExcludeCidrs: []string{"198.18.250.0/24"},
		NodePortAddresses: []string{"198.19.0.0/24"}, NodeIps: []string{"198.19.0.11", "2001:2::11"}, Zone: "zone-a",
		ReconcilePeriodSeconds: 60})
}

func TestGoodInputCompilesClean(t *testing.T) {
	for _, res := range []*vsplanev1.Resource{goodService(), goodSettings()} {
		if err := checkIdentity(res); err != nil {
			t.Fatalf("%s: %v", res.GetName(), err)
		}
		rs := testCompiler.compile(res)
		if len(rs.problems) > 0 {
			t.Errorf("%s: problems %q", res.GetName(), rs.problems)
		}
	}
	rs := testCompiler.compile(goodService())
	if len(rs.vss) != 2 || len(rs.tmpl.vss) != 1 || len(rs.entries) != 8 || len(rs.tmpl.entries) != 1 || rs.health == nil {
		t.Errorf("compiled %d vss, %d markers, %d entries, %d entry markers, health %v", len(rs.vss), len(rs.tmpl.vss),
			len(rs.entries), len(rs.tmpl.entries), rs.health)
	}
}

// Each bad value becomes one problem naming the field; only its part is
// dropped.
func TestServiceValidation(t *testing.T) {
	type svc = vsplanev1.ServiceState
	vs0 := func(s *svc) *vsplanev1.VirtualServer { return s.VirtualServers[0] }
	for _, c := range []struct {
		name string
		mut  func(*svc)
		want string
		// left: what of the Service is still compiled (vss incl. markers,
		// entries incl. markers); -1: don't check.
		vss, entries int
	}{
		{"vs address zone", func(s *svc) { s.VirtualServers[1].Address = "fe80::1%eth0" },
			`virtual_servers[1].address "fe80::1%eth0": IPv6 zone not allowed`, 2, 9},
		{"vs address zone injection", func(s *svc) { s.VirtualServers[1].Address = "2001:2::10%x\n-A INPUT -j ACCEPT" },
			`virtual_servers[1].address "2001:2::10%x\n-A INPUT -j ACCEPT": IPv6 zone not allowed`, 2, 9},
		{"vs mapped zone", func(s *svc) { vs0(s).Address = "::ffff:198.18.200.1%eth0" },
			`virtual_servers[0].address "::ffff:198.18.200.1%eth0": IPv6 zone not allowed`, 2, 9},
		{"vs address not ip", func(s *svc) { vs0(s).Address = "198.18.200.1 -j ACCEPT" },
			`virtual_servers[0].address "198.18.200.1 -j ACCEPT": not an IP address`, 2, 9},
		{"vs loopback", func(s *svc) { vs0(s).Address = "127.0.0.1" },
			`virtual_servers[0].address "127.0.0.1": loopback address not allowed`, 2, 9},
		{"vs unspecified", func(s *svc) { vs0(s).Address = "0.0.0.0" },
			`virtual_servers[0].address "0.0.0.0": unspecified address not allowed`, 2, 9},
		{"vs multicast", func(s *svc) { vs0(s).Address = "224.0.0.1" },
			`virtual_servers[0].address "224.0.0.1": link-local address not allowed`, 2, 9},
		{"vs multicast global", func(s *svc) { vs0(s).Address = "239.1.1.1" },
			`virtual_servers[0].address "239.1.1.1": multicast address not allowed`, 2, 9},
		{"vs broadcast", func(s *svc) { vs0(s).Address = "255.255.255.255" },
			`virtual_servers[0].address "255.255.255.255": broadcast address not allowed`, 2, 9},
		{"vs family mismatch", func(s *svc) { vs0(s).Family = vsplanev1.IPFamily_IP_FAMILY_IPV6 },
			`virtual_servers[0].family IP_FAMILY_IPV6: does not match address`, 2, 9},
		{"vs family unknown", func(s *svc) { vs0(s).Family = 7 }, `virtual_servers[0].family 7: unknown family`, 2, 9},
		{"vs kind unknown", func(s *svc) { vs0(s).Kind = 9 }, `virtual_servers[0].kind 9: unknown kind`, 2, 9},
		{"vs binding unknown", func(s *svc) { vs0(s).Binding = 9 }, `virtual_servers[0].binding 9: unknown binding`, 2, 9},
		{"vs protocol", func(s *svc) { vs0(s).Protocol = 0 },
			`virtual_servers[0].protocol PROTOCOL_UNSPECIFIED: protocol PROTOCOL_UNSPECIFIED not supported`, 2, 9},
		{"vs port 0", func(s *svc) { vs0(s).Port = 0 }, `virtual_servers[0].port 0: out of range 1..65535`, 2, 9},
		{"vs port too big", func(s *svc) { vs0(s).Port = 65536 }, `virtual_servers[0].port 65536: out of range 1..65535`, 2, 9},
		{"nodeport too big", func(s *svc) { s.VirtualServers[2].Port = 70000 },
			`virtual_servers[2].port 70000: out of range 1..65535`, 2, 9},
		{"scheduler not offered", func(s *svc) { vs0(s).Scheduler = "foo" },
			`virtual_servers[0].scheduler "foo": not offered by this kernel (have mh, rr, sh, wrr)`, 2, 9},
		{"scheduler injection", func(s *svc) { vs0(s).Scheduler = "rr\nx" },
			`virtual_servers[0].scheduler "rr\nx": not offered by this kernel (have mh, rr, sh, wrr)`, 2, 9},
		{"flag unknown", func(s *svc) { vs0(s).Flags = append(vs0(s).Flags, 42) },
			`virtual_servers[0].flags[1] 42: flag 42 not supported`, 2, 9},
		{"persistence 0", func(s *svc) { vs0(s).PersistenceTimeoutSeconds = 0 },
			`virtual_servers[0].persistence_timeout_seconds 0: out of range 1..86400 for a persistent virtual server`, 2, 9},
		{"persistence too long", func(s *svc) { vs0(s).PersistenceTimeoutSeconds = 86401 },
			`virtual_servers[0].persistence_timeout_seconds 86401: out of range 1..86400 for a persistent virtual server`, 2, 9},
		{"persistence without flag", func(s *svc) { vs0(s).Flags = nil },
			`virtual_servers[0].persistence_timeout_seconds 10800: set without the PERSISTENT flag`, 2, 9},
		{"source range zone", func(s *svc) { vs0(s).SourceRanges = []string{"fe80::1%eth0/64"} },
			`virtual_servers[0].source_ranges[0] "fe80::1%eth0/64": IPv6 zone not allowed`, 2, 9},
		{"source range bad bits", func(s *svc) { vs0(s).SourceRanges = []string{"198.19.50.0/33"} },
			`virtual_servers[0].source_ranges[0] "198.19.50.0/33": not a CIDR`, 2, 9},
		{"source range mapped", func(s *svc) { vs0(s).SourceRanges = []string{"::ffff:198.19.50.0/120"} },
			`virtual_servers[0].source_ranges[0] "::ffff:198.19.50.0/120": IPv4-mapped prefix not allowed`, 2, 9},
		{"source range family", func(s *svc) { vs0(s).SourceRanges = []string{"2001:2::/64"} },
			`virtual_servers[0].source_ranges[0] "2001:2::/64": not IPv4 like the virtual server`, 2, 9},
		{"rs zone", func(s *svc) { s.VirtualServers[1].RealServers[0].Address = "2001:2:0:100::2%eth0" },
			`virtual_servers[1].real_servers[0].address "2001:2:0:100::2%eth0": IPv6 zone not allowed`, 2, 9},
		{"rs family", func(s *svc) { vs0(s).RealServers[1].Address = "2001:2::3" },
			`virtual_servers[0].real_servers[1].address "2001:2::3": not IPv4 like the virtual server`, 2, 9},
		{"rs loopback", func(s *svc) { vs0(s).RealServers[1].Address = "127.0.0.2" },
			`virtual_servers[0].real_servers[1].address "127.0.0.2": loopback address not allowed`, 2, 9},
		{"rs link-local", func(s *svc) { vs0(s).RealServers[1].Address = "169.254.169.254" },
			`virtual_servers[0].real_servers[1].address "169.254.169.254": link-local address not allowed`, 2, 9},
		{"rs port", func(s *svc) { vs0(s).RealServers[1].Port = 0 },
			`virtual_servers[0].real_servers[1].port 0: out of range 1..65535`, 2, 9},
		{"rs port too big", func(s *svc) { vs0(s).RealServers[1].Port = 1 << 20 },
			`virtual_servers[0].real_servers[1].port 1048576: out of range 1..65535`, 2, 9},
		{"rs weight", func(s *svc) { vs0(s).RealServers[1].Weight = 1 << 31 },
			`virtual_servers[0].real_servers[1].weight 2147483648: out of range 0..65535`, 2, 9},
		{"rs duplicate", func(s *svc) { vs0(s).RealServers[1].Address = "198.19.1.2" },
			`virtual_servers[0].real_servers[1]: duplicate real server 198.19.1.2:8080`, 2, 9},
		{"reject with real servers", func(s *svc) { vs0(s).Reject = true },
			`virtual_servers[0].real_servers: reject with 2 real servers (must have none)`, 2, 9},
		{"duplicate vs", func(s *svc) {
			s.VirtualServers = append(s.VirtualServers, proto.Clone(vs0(s)).(*vsplanev1.VirtualServer))
		},
			`virtual_servers[3]: duplicate virtual server tcp/198.18.200.1:80`, 3, 9},
		{"health check port", func(s *svc) { s.HealthCheckNodePort = 65536 },
			`health_check_node_port 65536: out of range 1..65535`, 3, 9},
		{"identity mismatch", func(s *svc) { s.Namespace = "other\n" },
			`namespace "other\n", name "front": do not match resource name "service/web/front"`, 3, 9},
		{"entry zone", func(s *svc) { s.IpsetEntries[5].Ip = "2001:2::10%eth0" },
			`ipset_entries[5].ip "2001:2::10%eth0": IPv6 zone not allowed`, 3, 8},
		{"entry fw zone injection", func(s *svc) {
			s.IpsetEntries[1].Family, s.IpsetEntries[1].Ip = vsplanev1.IPFamily_IP_FAMILY_IPV6, "2001:2::1%x\n-I INPUT 1 -j ACCEPT"
		}, `ipset_entries[1].ip "2001:2::1%x\n-I INPUT 1 -j ACCEPT": IPv6 zone not allowed`, 3, 8},
		{"entry ip2 zone", func(s *svc) { s.IpsetEntries[3].Ip2 = "fe80::1%lo" },
			`ipset_entries[3].ip2 "fe80::1%lo": IPv6 zone not allowed`, 3, 8},
		{"entry net mapped", func(s *svc) { s.IpsetEntries[2].Net = "::ffff:198.19.50.0/120" },
			`ipset_entries[2].net "::ffff:198.19.50.0/120": IPv4-mapped prefix not allowed`, 3, 8},
		{"entry net family", func(s *svc) { s.IpsetEntries[2].Net = "2001:2::/64" },
			`ipset_entries[2]: ipset KUBE-LOAD-BALANCER-SOURCE-CIDR (hash:ip,port,net): entry {IP:198.18.200.1 Protocol:tcp Port:80 IP2:invalid IP Net:2001:2::/64 Comment:}: Net missing, unexpected, /0 or of the wrong family: invalid argument`, 3, 8},
		{"entry port 0", func(s *svc) { s.IpsetEntries[0].Port = 0 }, `ipset_entries[0].port 0: out of range 1..65535`, 3, 8},
		{"entry bitmap port", func(s *svc) { s.IpsetEntries[6].Port = 65536 }, `ipset_entries[6].port 65536: out of range 1..65535`, 3, 8},
		{"entry family mismatch", func(s *svc) { s.IpsetEntries[5].Family = vsplanev1.IPFamily_IP_FAMILY_IPV4 },
			`ipset_entries[5].family IP_FAMILY_IPV4: does not match address`, 3, 8},
		{"entry set unknown", func(s *svc) { s.IpsetEntries[0].Set = 99 }, `ipset_entries[0].set 99: unknown set`, 3, 8},
		{"entry ipvs ips", func(s *svc) {
			s.IpsetEntries[0] = &vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_IPVS_IPS, Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Ip: "198.19.0.11"}
		}, `ipset_entries[0].set IP_SET_IPVS_IPS: filled by the agent from kube-ipvs0, not accepted from the control plane`, 3, 8},
		{"entry marker with ip", func(s *svc) { s.IpsetEntries[8].Ip = "198.19.0.11" },
			`ipset_entries[8].ip "198.19.0.11": node_port_addresses entry must carry only a port and protocol`, 3, 8},
		{"entry marker port", func(s *svc) { s.IpsetEntries[8].Port = 0 },
			`ipset_entries[8].port 0: out of range 1..65535`, 3, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := goodService()
			c.mut(res.GetService())
			rs := testCompiler.compile(res)
			if d := cmp.Diff([]string{c.want}, rs.problems); d != "" {
				t.Errorf("problems (-want +got):\n%s", d)
			}
			vss, entries := len(rs.vss), len(rs.entries)
			if rs.tmpl != nil {
				vss, entries = len(rs.tmpl.base.vss)+len(rs.tmpl.vss), len(rs.tmpl.base.entries)+len(rs.tmpl.entries)
			}
			if vss != c.vss || entries != c.entries {
				t.Errorf("kept %d virtual servers, %d entries; want %d, %d", vss, entries, c.vss, c.entries)
			}
			for _, p := range rs.problems {
				if strings.ContainsAny(p, "\n\r") {
					t.Errorf("problem %q spans lines", p)
				}
			}
		})
	}
}

func TestSettingsValidation(t *testing.T) {
	type ns = vsplanev1.NodeSettings
	for _, c := range []struct {
		name  string
		mut   func(*ns)
		want  string
		check func(t *testing.T, s settings)
	}{
		{"scheduler not offered", func(n *ns) { n.DefaultScheduler = "foo" },
			`default_scheduler "foo": not offered by this kernel (have mh, rr, sh, wrr); keeping "rr"`,
			func(t *testing.T, s settings) {
				if s.defaultScheduler != "rr" {
					t.Errorf("default scheduler %q", s.defaultScheduler)
				}
			}},
		{"tcp timeout", func(n *ns) { n.TcpTimeoutSeconds = 1 << 31 },
			`tcp_timeout_seconds 2147483648: out of range 0..2147483 (the kernel's limit); left unchanged`,
			func(t *testing.T, s settings) {
				if s.timeouts.TCP != 0 {
					t.Errorf("tcp timeout %v", s.timeouts.TCP)
				}
			}},
		{"udp timeout", func(n *ns) { n.UdpTimeoutSeconds = 2147484 },
			`udp_timeout_seconds 2147484: out of range 0..2147483 (the kernel's limit); left unchanged`, nil},
		{"fin timeout", func(n *ns) { n.TcpFinTimeoutSeconds = 4e9 },
			`tcp_fin_timeout_seconds 4000000000: out of range 0..2147483 (the kernel's limit); left unchanged`, nil},
		{"masquerade bit", func(n *ns) { n.MasqueradeBit = 32 }, `masquerade_bit 32: out of range 0..31; using 14`, nil},
		{"cluster cidr zone", func(n *ns) { n.ClusterCidrs[1] = "fe80::%eth0/64" }, `cluster_cidrs[1] "fe80::%eth0/64": IPv6 zone not allowed`,
			func(t *testing.T, s settings) {
				if len(s.clusterCIDRs) != 1 {
					t.Errorf("cluster CIDRs %v", s.clusterCIDRs)
				}
			}},
		{"cluster cidr mapped", func(n *ns) { n.ClusterCidrs[0] = "::ffff:198.19.0.0/112" },
			`cluster_cidrs[0] "::ffff:198.19.0.0/112": IPv4-mapped prefix not allowed`, nil},
		{"cluster cidr bits", func(n *ns) { n.ClusterCidrs[0] = "198.19.0.0/40" }, `cluster_cidrs[0] "198.19.0.0/40": not a CIDR`, nil},
		{"exclude cidr injection", func(n *ns) { n.ExcludeCidrs[0] = "198.18.0.0/16\n-A INPUT -j ACCEPT" },
			`exclude_cidrs[0] "198.18.0.0/16\n-A INPUT -j ACCEPT": not a CIDR`, nil},
		{"nodeport cidr", func(n *ns) { n.NodePortAddresses[0] = "fe80::1%eth0" }, `node_port_addresses[0] "fe80::1%eth0": IPv6 zone not allowed`, nil},
		{"node ip zone", func(n *ns) { n.NodeIps[1] = "fe80::1%eth0" }, `node_ips[1] "fe80::1%eth0": IPv6 zone not allowed`, nil},
		{"zone", func(n *ns) { n.Zone = "zone a\n" },
			`zone "zone a\n": not a label value (at most 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)`, nil},
		{"reconcile period", func(n *ns) { n.ReconcilePeriodSeconds = 86401 },
			`reconcile_period_seconds 86401: out of range 0..86400; using the agent's default`,
			func(t *testing.T, s settings) {
				if s.reconcilePeriod != 0 {
					t.Errorf("period %d", s.reconcilePeriod)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := goodSettings()
			c.mut(res.GetNodeSettings())
			rs := testCompiler.compile(res)
			if d := cmp.Diff([]string{c.want}, rs.problems); d != "" {
				t.Errorf("problems (-want +got):\n%s", d)
			}
			if c.check != nil {
				c.check(t, *rs.settings)
			}
		})
	}
}

func TestIdentityValidation(t *testing.T) {
	for name, want := range map[string]string{
		"":                          "resource without a name",
		"service/default":           `name "service/default": not "node/settings" or "service/<namespace>/<name>" with DNS-1123 labels; resource refused`,
		"service/Default/a":         `name "service/Default/a": not "node/settings" or "service/<namespace>/<name>" with DNS-1123 labels; resource refused`,
		"service/default/a/b":       `name "service/default/a/b": not "node/settings" or "service/<namespace>/<name>" with DNS-1123 labels; resource refused`,
		"service/default/a\n":       `name "service/default/a\n": not "node/settings" or "service/<namespace>/<name>" with DNS-1123 labels; resource refused`,
		"service/-a/b":              `name "service/-a/b": not "node/settings" or "service/<namespace>/<name>" with DNS-1123 labels; resource refused`,
		"node/other":                `name "node/other": not "node/settings" or "service/<namespace>/<name>" with DNS-1123 labels; resource refused`,
		"service/default/" + long64: `name "service/default/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa": not "node/settings" or "service/<namespace>/<name>" with DNS-1123 labels; resource refused`,
	} {
		err := checkIdentity(&vsplanev1.Resource{Name: name, Version: "1"})
		if err == nil || err.Error() != want {
			t.Errorf("checkIdentity(%q) = %v, want %s", name, err, want)
		}
	}
	for _, v := range []string{"a\nb", strings.Repeat("x", maxVersionLen+1)} {
		if err := checkIdentity(&vsplanev1.Resource{Name: "service/default/a", Version: v}); err == nil || !strings.HasPrefix(err.Error(), "version ") {
			t.Errorf("version %q: %v", v[:min(len(v), 8)], err)
		}
	}
	for _, name := range []string{SettingsResource, "service/kube-system/kube-dns", "service/a/" + long64[:63]} {
		if err := checkIdentity(&vsplanev1.Resource{Name: name, Version: "0123abc"}); err != nil {
			t.Errorf("checkIdentity(%q) = %v", name, err)
		}
	}
}

var long64 = strings.Repeat("a", 64)

// hostileService has nothing usable: every part breaks a rule.
func hostileService() *vsplanev1.Resource {
	res := goodService()
	res.Name, res.Version = "service/evil/x", "evil"
	s := res.GetService()
	s.Namespace, s.Name, s.HealthCheckNodePort = "evil", "x", 0
	s.VirtualServers[0].Scheduler = "evil"
	s.VirtualServers[1].Address = "2001:2::10%x\n-I INPUT 1 -j ACCEPT"
	s.VirtualServers[2].Port = 0
	for _, e := range s.IpsetEntries {
		e.Port = 1 << 17
	}
	return res
}

// A Delta with a hostile resource NACKs only that resource: the others
// apply exactly as they would without it, the hostile one costs no kernel
// operation, and the Services already programmed are not touched.
func TestHostileResourceIsolated(t *testing.T) {
	run := func(hostile ...*vsplanev1.Resource) (*memory.Kernel, *vsplanev1.Ack, map[string]int) {
		mk, r := setup(t)
		mk.ResetCalls()
		res := append([]*vsplanev1.Resource{tcp("c", "198.18.0.12", 80, be("198.19.1.7", 8080)).resource()}, hostile...)
		ack := apply(t, r, &vsplanev1.Delta{Nonce: "h", Resources: res})
		return mk, ack, writes(mk)
	}
	_, clean, cleanWrites := run()
	mustAck(t, clean)
	badName := goodService()
	badName.Name = "service/evil/x\n-A INPUT -j ACCEPT"
	mk, ack, w := run(hostileService(), badName)

	if d := cmp.Diff(cleanWrites, w); d != "" {
		t.Errorf("kernel writes differ from the Delta without the hostile resources (-clean +hostile):\n%s", d)
	}
	if d := cmp.Diff(ops(clean.GetKernelOperations()), ops(ack.GetKernelOperations())); d != "" {
		t.Errorf("kernel operations differ (-clean +hostile):\n%s", d)
	}
	var names []string
	for _, e := range ack.GetErrors() {
		names = append(names, e.GetName())
		if strings.ContainsAny(e.GetMessage(), "\n\r") {
			t.Errorf("message of %q spans lines: %q", e.GetName(), e.GetMessage())
		}
	}
	if d := cmp.Diff([]string{badName.Name, "service/evil/x"}, names); d != "" {
		t.Fatalf("NACKed resources (-want +got):\n%s\n%v", d, ack.GetErrors())
	}
	msg := ack.GetErrors()[1].GetMessage()
	for _, want := range []string{
		`virtual_servers[0].scheduler "evil": not offered by this kernel (have dh, fo, lblc`,
		`virtual_servers[1].address "2001:2::10%x\n-I INPUT 1 -j ACCEPT": IPv6 zone not allowed`,
		`virtual_servers[2].port 0: out of range 1..65535`,
		`ipset_entries[8].port 131072: out of range 1..65535`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	st := readState(t, mk)
	if _, ok := st.Services["tcp/198.18.0.12:80 rr"]; !ok || len(st.Services) != 3 {
		t.Errorf("services = %v, want a, b and c", st.Services)
	}
	if got := chainRules(t, mk, kernel.TableFilter, "INPUT"); slices.ContainsFunc(got, func(r string) bool { return !strings.Contains(r, "-j KUBE-") }) {
		t.Errorf("filter INPUT has a rule that is not a jump to ours: %q", got)
	}
}

// An entry whose zone carried iptables syntax never reaches a rule: the
// resource is NACKed and the chains are the ones without it.
func TestZoneInjectionThroughFirewallEntry(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{Families: []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6}})
	res := lbWithSourceRanges(false)
	res.GetService().IpsetEntries = append(res.GetService().IpsetEntries, &vsplanev1.IPSetEntry{
		Set: vsplanev1.IPSet_IP_SET_LOAD_BALANCER_FW, Family: vsplanev1.IPFamily_IP_FAMILY_IPV6,
		Ip: "2001:2::1%x\n-I INPUT 1 -j ACCEPT\n#", Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP})
	ack := apply(t, r, full(settingsRes(defaultNodeSettings()), res))
	if len(ack.GetErrors()) != 1 || !strings.Contains(ack.GetErrors()[0].GetMessage(), `ipset_entries[3].ip "2001:2::1%x\n-I INPUT 1 -j ACCEPT\n#": IPv6 zone not allowed`) {
		t.Fatalf("ack = %v", ack)
	}
	for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
		b, err := mk.Kernel().IPTables.Save(context.Background(), fam, kernel.TableFilter)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "-A INPUT -j ACCEPT") || strings.Contains(string(b), "%x") {
			t.Errorf("%v filter table carries the injected rule:\n%s", fam, b)
		}
	}
}

// The scheduler list comes from the kernel (read at the first Apply) or
// from Config.Schedulers; a bad node default keeps the one in force.
func TestSchedulersOfferedByTheKernel(t *testing.T) {
	mk := memory.New()
	mk.SetSchedulers([]string{"rr", "wrr"})
	r := newReconciler(t, mk, Config{})
	sh := svcB
	sh.scheduler = "sh"
	ack := apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), sh.resource()))
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetName() != "service/default/b" ||
		ack.GetErrors()[0].GetMessage() != `virtual_servers[0].scheduler "sh": not offered by this kernel (have rr, wrr)` {
		t.Fatalf("ack = %v", ack)
	}
	if r.Failed()["service/default/b"] == "" || len(r.Stats().KernelErrors) != 0 {
		t.Errorf("failed %v, kernel errors %v", r.Failed(), r.Stats().KernelErrors)
	}

	// A valid default applies to every Service; a bad one afterwards is
	// reported on node/settings and keeps wrr (nothing is rewritten).
	ns := defaultNodeSettings()
	ns.DefaultScheduler = "wrr"
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "wrr", Resources: []*vsplanev1.Resource{settingsRes(ns)}}))
	if _, ok := readState(t, mk).Services["tcp/198.18.0.10:80 wrr"]; !ok {
		t.Fatalf("default scheduler not applied: %v", readState(t, mk).Services)
	}
	mk.ResetCalls()
	ns.DefaultScheduler = "lc"
	ack = apply(t, r, &vsplanev1.Delta{Nonce: "lc", Resources: []*vsplanev1.Resource{settingsRes(ns)}})
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetName() != SettingsResource ||
		ack.GetErrors()[0].GetMessage() != `default_scheduler "lc": not offered by this kernel (have rr, wrr); keeping "wrr"` {
		t.Fatalf("ack = %v", ack)
	}
	if w := writes(mk); len(w) != 0 {
		t.Errorf("a bad default scheduler wrote %v", w)
	}

	// Config.Schedulers overrides the kernel's list.
	r2 := newReconciler(t, memory.New(), Config{Schedulers: []string{"rr"}})
	ack = apply(t, r2, full(settingsRes(ns), svcA.resource()))
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetMessage() != `default_scheduler "lc": not offered by this kernel (have rr); keeping "rr"` {
		t.Fatalf("ack = %v", ack)
	}
	if _, ok := r2.Versions()["service/default/a"]; !ok {
		t.Error("Service not applied with the kept default")
	}
}

// A resource with very many bad parts reports the first maxProblems.
func TestProblemsCapped(t *testing.T) {
	res := goodService()
	s := res.GetService()
	for range 1000 {
		s.IpsetEntries = append(s.IpsetEntries, &vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP, Ip: "fe80::1%eth0"})
	}
	rs := testCompiler.compile(res)
	if len(rs.problems) != maxProblems+1 || rs.problems[maxProblems] != problemsOmitted || len(rs.entries) != 8 {
		t.Errorf("%d problems (last %q), %d entries", len(rs.problems), rs.problems[len(rs.problems)-1], len(rs.entries))
	}
	msgs := capMessages(append(slices.Clone(rs.problems), "conflict", "kernel error"))
	if len(msgs) != maxProblems+1 || msgs[maxProblems] != problemsOmitted {
		t.Errorf("capMessages: %d, last %q", len(msgs), msgs[len(msgs)-1])
	}
}

// TestDeltaNamingAResourceTwice: a Delta that names a resource twice is
// ambiguous; neither is applied, the Ack names it, and what was applied
// before stays, even in a ReplaceAll Delta (found by FuzzApply).
func TestDeltaNamingAResourceTwice(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	a := tcp("a", "198.18.0.10", 80, be("198.19.1.2", 8080))
	b := tcp("b", "198.18.0.11", 80, be("198.19.1.3", 8080))
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), a.resource(), b.resource())))
	want := readState(t, mk)
	oldA := r.Versions()["service/default/a"]

	a1 := tcp("a", "198.18.0.10", 80, be("198.19.1.7", 8080))
	a2 := tcp("a", "198.18.0.10", 80, be("198.19.1.8", 8080))
	ack := apply(t, r, full(settingsRes(defaultNodeSettings()), a1.resource(), b.resource(), a2.resource()))
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK || len(ack.GetErrors()) != 1 ||
		ack.GetErrors()[0].GetName() != "service/default/a" || !strings.Contains(ack.GetErrors()[0].GetMessage(), "named 2 times in one Delta") {
		t.Fatalf("ack %v", ack)
	}
	if got := r.Versions()["service/default/a"]; got != oldA {
		t.Errorf("service/default/a applied as %q, want the earlier %q", got, oldA)
	}
	wantState(t, mk, want)
}
