package rules

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

func chainRules(t *testing.T, rs Ruleset, table kernel.Table, name string) []string {
	t.Helper()
	for _, tb := range rs.Tables {
		if tb.Table != table {
			continue
		}
		if c, ok := tb.Chain(name); ok {
			return c.Rules
		}
	}
	t.Fatalf("chain %s/%s not rendered", table, name)
	return nil
}

func mustRender(t *testing.T, in Input) Ruleset {
	t.Helper()
	rs, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestNewChains pins each chain this issue added, for an input with every
// set non-empty; each row fails without its section.
func TestNewChains(t *testing.T) {
	v4 := Input{Family: kernel.FamilyIPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster4}, RandomFully: true,
		NonEmpty: allSets, LoadBalancerNoNodeAccess: noNodeAccess4}
	v6 := Input{Family: kernel.FamilyIPv6, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster6}, NonEmpty: allSets,
		LoadBalancerNoNodeAccess: noNodeAccess6}
	nat, filter := kernel.TableNAT, kernel.TableFilter
	for _, tc := range []struct {
		name  string
		in    Input
		table kernel.Table
		chain string
		want  []string
	}{
		{"nat node port: Local ports RETURN before the masquerade mark", v4, nat, ChainNodePort, []string{
			`-p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN`,
			`-p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ`,
			`-p udp -m comment --comment "Kubernetes nodeport UDP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-UDP dst -j RETURN`,
			`-p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ`,
			`-p sctp -m comment --comment "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type \'hash ip:port\'" -m set --match-set KUBE-NODE-PORT-LOCAL-SCTP-HASH dst,dst -j RETURN`,
			`-p sctp -m comment --comment "Kubernetes nodeport SCTP port for masquerade purpose with type \'hash ip:port\'" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ`,
		}},
		{"load balancer: Local RETURN, others marked", v4, nat, ChainLoadBalancer, []string{
			`-m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN`,
			`-j KUBE-MARK-MASQ`,
		}},
		{"filter node port: health check ports accepted", v4, filter, ChainNodePort, []string{
			`-m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT`,
		}},
		{"proxy firewall: LBs with source ranges checked", v4, filter, ChainProxyFirewall, []string{
			`-m comment --comment "Kubernetes service load balancer ip + port for load balancer with sourceRange" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL`,
		}},
		{"source ranges: allowed CIDRs and node access pass, the rest dropped", v4, filter, ChainSourceRangesFirewall, []string{
			`-m comment --comment "Kubernetes service load balancer ip + port + source cidr for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN`,
			`-m comment --comment "Kubernetes service load balancer ip + port + source IP for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-IP dst,dst,src -j RETURN`,
			`-j DROP`,
		}},
		{"ipvs filter: new connections to kube-ipvs0 not for a service rejected", v4, filter, ChainIPVSFilter, []string{
			`-m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN`,
			`-m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN`,
			`-m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN`,
			`-m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN`,
			`-m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN`,
			`-m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable`,
		}},
		{"ipvs filter v6", v6, filter, ChainIPVSFilter, []string{
			`-m set --match-set KUBE-6-LOAD-BALANCER dst,dst -j RETURN`,
			`-m set --match-set KUBE-6-CLUSTER-IP dst,dst -j RETURN`,
			`-m set --match-set KUBE-6-EXTERNAL-IP dst,dst -j RETURN`,
			`-m set --match-set KUBE-6-EXTERNAL-IP-LOCAL dst,dst -j RETURN`,
			`-m set --match-set KUBE-6-HEALTH-CHECK-NODE-PORT dst -j RETURN`,
			`-m conntrack --ctstate NEW -m set --match-set KUBE-6-IPVS-IPS dst -j REJECT --reject-with icmp6-port-unreachable`,
		}},
		{"ipvs out filter: node to LBs excluding it dropped, sorted, once", v4, filter, ChainIPVSOutFilter, []string{
			`-s 198.18.200.1/32 -m ipvs --vproto 17 --vaddr 198.18.200.1 --vport 53 -j DROP`,
			`-s 198.18.200.1/32 -m ipvs --vproto 6 --vaddr 198.18.200.1 --vport 80 -j DROP`,
			`-s 198.18.200.2/32 -m ipvs --vproto 132 --vaddr 198.18.200.2 --vport 443 -j DROP`,
		}},
		{"ipvs out filter v6", v6, filter, ChainIPVSOutFilter, []string{
			`-s 2001:2:0:1::c8/128 -m ipvs --vproto 6 --vaddr 2001:2:0:1::c8 --vport 80 -j DROP`,
		}},
		{"services: LB jump first, external IPs, NodePort jump, ACCEPTs last", v4, nat, ChainServices, []string{
			`-s 127.0.0.0/8 -j RETURN`,
			`-m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER`,
			`! -s 198.19.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`,
			`-m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst -j KUBE-MARK-MASQ`,
			`-m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT`,
			`-m comment --comment "Kubernetes service external ip + port for masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst -m addrtype --dst-type LOCAL -j ACCEPT`,
			`-m comment --comment "Kubernetes service external ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT`,
			`-m comment --comment "Kubernetes service external ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m addrtype --dst-type LOCAL -j ACCEPT`,
			`-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT`,
			`-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
			`-m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, chainRules(t, mustRender(t, tc.in), tc.table, tc.chain)); d != "" {
				t.Errorf("%s/%s (-want +got):\n%s", tc.table, tc.chain, d)
			}
		})
	}
}

// TestEmptySetsLeftOut: a rule matching a set is written only while the set
// has entries, except the rules kube-proxy writes unconditionally
// (KUBE-IPVS-FILTER and the health check ACCEPT).
func TestEmptySetsLeftOut(t *testing.T) {
	unconditional := func(table kernel.Table, chain string) bool {
		return table == kernel.TableFilter && (chain == ChainIPVSFilter || chain == ChainNodePort)
	}
	for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
		for _, s := range AllSets() {
			name := " " + s.Name(fam) + " "
			without := mustRender(t, Input{Family: fam, MasqueradeBit: 14, NonEmpty: allSets &^ SetMask(0).With(s)})
			with := mustRender(t, Input{Family: fam, MasqueradeBit: 14, NonEmpty: SetMask(0).With(s)})
			seen := false
			for _, tb := range with.Tables {
				for _, c := range tb.Chains {
					for _, r := range c.Rules {
						seen = seen || strings.Contains(r, name)
					}
				}
			}
			if !seen {
				t.Errorf("%s non-empty: no rule matches it", s.Name(fam))
			}
			for _, tb := range without.Tables {
				for _, c := range tb.Chains {
					if unconditional(tb.Table, c.Name) {
						continue
					}
					for _, r := range c.Rules {
						if strings.Contains(r, name) {
							t.Errorf("%s empty, yet %s/%s has %q", s.Name(fam), tb.Table, c.Name, r)
						}
					}
				}
			}
		}
	}
}

// TestJumpsLikeKubeProxy: one jump per iptablesJumpChain entry, in its
// order (Payload inserts each at 1, so INPUT ends up IPVS-FILTER,
// PROXY-FIREWALL, NODE-PORT as after kube-proxy's prepends).
func TestJumpsLikeKubeProxy(t *testing.T) {
	rs := mustRender(t, Input{Family: kernel.FamilyIPv4})
	var got []string
	for _, j := range rs.Jumps {
		got = append(got, string(j.Table)+" "+j.From+" "+j.Rule)
	}
	want := []string{
		`nat OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`nat PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`nat POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`,
		`filter FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
		`filter INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT`,
		`filter INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL`,
		`filter FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL`,
		`filter INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER`,
		`filter OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("jumps (-want +got):\n%s", d)
	}
}

func TestComment(t *testing.T) {
	for in, want := range map[string]string{
		"plain_Word-1":        `-m comment --comment plain_Word-1`,
		"a b":                 `-m comment --comment "a b"`,
		"x=y":                 `-m comment --comment "x=y"`,
		`it's "q" \ done`:     `-m comment --comment "it\'s \"q\" \\ done"`,
		"type 'hash ip:port'": `-m comment --comment "type \'hash ip:port\'"`,
	} {
		if got := comment(in); got != want {
			t.Errorf("comment(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestNoNodeAccess(t *testing.T) {
	lb1, lb2 := netip.MustParseAddr("198.18.200.1"), netip.MustParseAddr("198.18.200.2")
	fw := []kernel.Entry{
		{IP: lb2, Port: 80, Protocol: kernel.ProtocolTCP},
		{IP: lb1, Port: 80, Protocol: kernel.ProtocolTCP},
		{IP: lb1, Port: 80, Protocol: kernel.ProtocolUDP},
		{IP: netip.AddrFrom16(lb1.As16()), Port: 53, Protocol: kernel.ProtocolUDP}, // v4-mapped: unmapped
	}
	sourceIP := []kernel.Entry{{IP: lb1, Port: 80, Protocol: kernel.ProtocolTCP, IP2: lb1}}
	got := NoNodeAccess(fw, sourceIP)
	want := []VirtualPort{{lb1, 53, kernel.ProtocolUDP}, {lb1, 80, kernel.ProtocolUDP}, {lb2, 80, kernel.ProtocolTCP}}
	if !slices.Equal(got, want) {
		t.Errorf("NoNodeAccess = %v, want %v", got, want)
	}
	if got := NoNodeAccess(nil, nil); got != nil {
		t.Errorf("no FW entries: got %v, want nil", got)
	}
}
