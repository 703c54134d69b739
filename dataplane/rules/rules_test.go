package rules

import (
	"context"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var cluster4 = netip.MustParsePrefix("198.19.0.0/16")

var (
	cluster6 = netip.MustParsePrefix("2001:2:0:100::/56")
	allSets  = func() SetMask {
		var m SetMask
		for _, s := range AllSets() {
			m = m.With(s)
		}
		return m
	}()
	// noNodeAccess4 lists one LB twice (duplicates render once) and out of
	// order (rendered sorted).
	noNodeAccess4 = []VirtualPort{
		{netip.MustParseAddr("198.18.200.2"), 443, kernel.ProtocolSCTP},
		{netip.MustParseAddr("198.18.200.1"), 80, kernel.ProtocolTCP},
		{netip.MustParseAddr("198.18.200.1"), 80, kernel.ProtocolTCP},
		{netip.MustParseAddr("198.18.200.1"), 53, kernel.ProtocolUDP},
	}
	noNodeAccess6 = []VirtualPort{{netip.MustParseAddr("2001:2:0:1::c8"), 80, kernel.ProtocolTCP}}
	// inCluster4: a LB IP and a NodePort address of one Service port
	// share a mark; a UDP port and an SCTP NodePort; out of order and one
	// twice (rendered sorted, once).
	inCluster4 = []InClusterMark{
		{VirtualPort{netip.MustParseAddr("198.18.0.2"), 30080, kernel.ProtocolTCP}, 0x4002},
		{VirtualPort{netip.MustParseAddr("198.18.200.2"), 80, kernel.ProtocolTCP}, 0x4001},
		{VirtualPort{netip.MustParseAddr("198.18.200.2"), 53, kernel.ProtocolUDP}, 0x4fff},
		{VirtualPort{netip.MustParseAddr("198.18.0.2"), 30090, kernel.ProtocolSCTP}, 0x4003},
		{VirtualPort{netip.MustParseAddr("198.18.200.2"), 80, kernel.ProtocolTCP}, 0x4001},
	}
	inCluster6 = []InClusterMark{{VirtualPort{netip.MustParseAddr("2001:2:0:1::c8"), 80, kernel.ProtocolTCP}, 0x4001}}
)

func goldenCases() map[string]Input {
	both := SetMask(0).With(SetClusterIP).With(SetLoopBack)
	v4 := Input{Family: kernel.FamilyIPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster4}, RandomFully: true}
	with := func(in Input, f func(*Input)) Input { f(&in); return in }
	return map[string]Input{
		"ipv4_empty":     v4,
		"ipv4_clusterip": with(v4, func(in *Input) { in.NonEmpty = both }),
		"ipv4_all_sets": with(v4, func(in *Input) {
			in.NonEmpty, in.LoadBalancerNoNodeAccess = allSets, noNodeAccess4
		}),
		"ipv6_all_sets": {Family: kernel.FamilyIPv6, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster6}, RandomFully: true,
			NonEmpty: allSets, LoadBalancerNoNodeAccess: noNodeAccess6},
		"ipv4_masq_all":  {Family: kernel.FamilyIPv4, MasqueradeBit: 14, MasqueradeAll: true, NonEmpty: allSets},
		"ipv4_no_cidr":   {Family: kernel.FamilyIPv4, MasqueradeBit: 14, NonEmpty: allSets},
		"ipv4_liberal":   with(v4, func(in *Input) { in.NonEmpty, in.ConntrackTCPLiberal = both, true }),
		"ipv6_clusterip": {Family: kernel.FamilyIPv6, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster6}, RandomFully: true, NonEmpty: both},
		// Two cluster CIDRs: each is jumped from (with one, as the others).
		"ipv4_in_cluster": with(v4, func(in *Input) {
			in.NonEmpty, in.InClusterMarks = allSets, inCluster4
			in.ClusterCIDRs = append(in.ClusterCIDRs, netip.MustParsePrefix("198.20.0.0/16"))
		}),
		"ipv6_in_cluster": {Family: kernel.FamilyIPv6, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster6}, RandomFully: true,
			NonEmpty: allSets, InClusterMarks: inCluster6},
		// The node's pod CIDRs tell in-cluster clients, the cluster CIDR the
		// ClusterIP masquerade.
		"ipv4_in_cluster_node_pods": with(v4, func(in *Input) {
			in.NonEmpty, in.InClusterMarks = allSets, inCluster4[:2]
			in.NodePodCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.1.0/24")}
		}),
		// No cluster CIDR: only the node's own connections are recognised.
		"ipv4_in_cluster_no_cidr": {Family: kernel.FamilyIPv4, MasqueradeBit: 15, NonEmpty: allSets,
			InClusterMarks: []InClusterMark{{VirtualPort{netip.MustParseAddr("198.18.200.2"), 80, kernel.ProtocolTCP}, 0x8001}}},
		// kube-proxy's interface detectors.
		"ipv4_bridge": {Family: kernel.FamilyIPv4, MasqueradeBit: 14, LocalInterface: "cbr0", RandomFully: true,
			NonEmpty: allSets, InClusterMarks: inCluster4[:1]},
		"ipv6_interface_prefix": {Family: kernel.FamilyIPv6, MasqueradeBit: 14, LocalInterface: "veth+", RandomFully: true,
			NonEmpty: allSets, InClusterMarks: inCluster6},
		"ipv4_bit0_no_fully": {Family: kernel.FamilyIPv4, MasqueradeBit: 0, ClusterCIDRs: []netip.Prefix{cluster4}, NonEmpty: both},
	}
}

func TestGolden(t *testing.T) {
	for name, in := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			rs, err := Render(in)
			if err != nil {
				t.Fatal(err)
			}
			got := rs.Payload(rs.Jumps)
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./dataplane/rules -update)", err)
			}
			if d := cmp.Diff(string(want), string(got)); d != "" {
				t.Errorf("payload differs from %s (-want +got):\n%s", path, d)
			}
		})
	}
}

func TestRenderRules(t *testing.T) {
	base := Input{Family: kernel.FamilyIPv4, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster4}, RandomFully: true}
	withCIP := base
	withCIP.NonEmpty = SetMask(0).With(SetClusterIP)
	masqAll := withCIP
	masqAll.MasqueradeAll = true
	noCIDR := withCIP
	noCIDR.ClusterCIDRs = nil
	v6 := withCIP
	v6.Family = kernel.FamilyIPv6
	v6.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("2001:2::/64")}
	noFully := base
	noFully.RandomFully = false
	threeCIDRs := withCIP
	threeCIDRs.ClusterCIDRs = []netip.Prefix{cluster4, netip.MustParsePrefix("198.18.241.0/24"), netip.MustParsePrefix("198.18.242.0/24")}
	tests := []struct {
		name  string
		in    Input
		chain string
		want  []string
	}{
		{"empty sets: only the localhost dismissal and the NodePort jump", base, ChainServices, []string{
			"-s 127.0.0.0/8 -j RETURN", "-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"}},
		{"cluster ip not from pods", withCIP, ChainServices, []string{
			`-s 127.0.0.0/8 -j RETURN`,
			`! -s 198.19.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`,
			`-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT`,
			`-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
		}},
		{"several cluster cidrs: pods accepted, the rest marked", threeCIDRs, ChainServices, []string{
			`-s 127.0.0.0/8 -j RETURN`,
			`-s 198.19.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
			`-s 198.18.241.0/24 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
			`-s 198.18.242.0/24 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
			`-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`,
			`-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT`,
			`-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
		}},
		{"masquerade all", masqAll, ChainServices, []string{
			`-s 127.0.0.0/8 -j RETURN`,
			`-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`,
			`-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT`,
			`-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
		}},
		{"no cluster cidr", noCIDR, ChainServices, []string{
			`-s 127.0.0.0/8 -j RETURN`,
			`-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ`,
			`-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT`,
			`-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
		}},
		{"ipv6 set names", v6, ChainServices, []string{
			`-s ::1/128 -j RETURN`,
			`! -s 2001:2::/64 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-6-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`,
			`-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT`,
			`-m set --match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT`,
		}},
		{"postrouting random-fully", base, ChainPostrouting, []string{
			`-m mark ! --mark 0x4000/0x4000 -j RETURN`,
			`-j MARK --set-xmark 0x4000/0x0`,
			`-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
		}},
		{"postrouting without random-fully", noFully, ChainPostrouting, []string{
			`-m mark ! --mark 0x4000/0x4000 -j RETURN`,
			`-j MARK --set-xmark 0x4000/0x0`,
			`-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE`,
		}},
		{"mark masq", base, ChainMarkMasq, []string{`-j MARK --set-xmark 0x4000/0x4000`}},
		{"forward", base, ChainForward, []string{
			`-m conntrack --ctstate INVALID -j DROP`,
			`-m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT`,
			`-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Render(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			found := false
			for _, tb := range rs.Tables {
				if c, ok := tb.Chain(tc.chain); ok {
					got, found = c.Rules, true
				}
			}
			if !found {
				t.Fatalf("chain %s not rendered", tc.chain)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("rules of %s (-want +got):\n%s", tc.chain, d)
			}
		})
	}
}

func TestRenderRejectsBadInput(t *testing.T) {
	for name, in := range map[string]Input{
		"no family":      {MasqueradeBit: 14},
		"bit too large":  {Family: kernel.FamilyIPv4, MasqueradeBit: 32},
		"cidr of family": {Family: kernel.FamilyIPv6, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{cluster4}},
		"lb of family":   {Family: kernel.FamilyIPv6, MasqueradeBit: 14, LoadBalancerNoNodeAccess: noNodeAccess4},
		"lb port 0": {Family: kernel.FamilyIPv4, LoadBalancerNoNodeAccess: []VirtualPort{
			{netip.MustParseAddr("198.18.200.1"), 0, kernel.ProtocolTCP}}},
		"lb protocol": {Family: kernel.FamilyIPv4, LoadBalancerNoNodeAccess: []VirtualPort{
			{netip.MustParseAddr("198.18.200.1"), 80, kernel.ProtocolUnspecified}}},
		"lb no address": {Family: kernel.FamilyIPv4, LoadBalancerNoNodeAccess: []VirtualPort{{Port: 80, Protocol: kernel.ProtocolTCP}}},
	} {
		if _, err := Render(in); err == nil {
			t.Errorf("%s: Render accepted %+v", name, in)
		}
	}
}

func TestSetNames(t *testing.T) {
	for _, tc := range []struct {
		s    Set
		f    kernel.Family
		want string
	}{
		{SetClusterIP, kernel.FamilyIPv4, "KUBE-CLUSTER-IP"},
		{SetClusterIP, kernel.FamilyIPv6, "KUBE-6-CLUSTER-IP"},
		{SetLoadBalancerSourceCIDR, kernel.FamilyIPv6, "KUBE-6-LOAD-BALANCER-SOURCE-CID"},
		{SetNodePortTCP, kernel.FamilyIPv6, "KUBE-6-NODE-PORT-TCP"},
	} {
		if got := tc.s.Name(tc.f); got != tc.want {
			t.Errorf("%d/%v: got %q, want %q", tc.s, tc.f, got, tc.want)
		}
	}
	for _, s := range AllSets() {
		for _, f := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
			if err := s.Spec(f).Validate(); err != nil {
				t.Errorf("spec of %v/%v: %v", s, f, err)
			}
		}
	}
}

// TestPayloadAppliesAndReadsBack applies payloads to the memory kernel's
// iptables-restore --noflush and checks that (1) the rules read back equal
// the rendered ones (save form), (2) jumps are inserted once, (3) foreign
// rules in built-in chains survive.
func TestPayloadAppliesAndReadsBack(t *testing.T) {
	mk := memory.New()
	k := mk.Kernel()
	ctx := context.Background()
	for _, s := range AllSets() {
		if err := k.IPSets.CreateSet(s.Spec(kernel.FamilyIPv4)); err != nil {
			t.Fatal(err)
		}
	}
	foreign := "*nat\n-A PREROUTING -s 198.18.255.0/24 -j RETURN\nCOMMIT\n"
	if err := k.IPTables.Restore(ctx, kernel.FamilyIPv4, []byte(foreign)); err != nil {
		t.Fatal(err)
	}
	save := func() []kernel.TableDump {
		var out []kernel.TableDump
		for _, tb := range []kernel.Table{kernel.TableFilter, kernel.TableNAT} {
			b, err := k.IPTables.Save(ctx, kernel.FamilyIPv4, tb)
			if err != nil {
				t.Fatal(err)
			}
			d, err := kernel.ParseSave(b)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, d...)
		}
		return out
	}
	for _, in := range []Input{goldenCases()["ipv4_all_sets"], goldenCases()["ipv4_clusterip"], goldenCases()["ipv4_empty"], goldenCases()["ipv4_masq_all"]} {
		rs, err := Render(in)
		if err != nil {
			t.Fatal(err)
		}
		missing, differ := rs.Check(save())
		if err := k.IPTables.Restore(ctx, kernel.FamilyIPv4, rs.Payload(missing)); err != nil {
			t.Fatalf("restore: %v\n%s", err, rs.Payload(missing))
		}
		_ = differ
		missing, differ = rs.Check(save())
		if len(missing) != 0 || differ {
			t.Fatalf("after restore: missing jumps %v, chains differ %v", missing, differ)
		}
	}
	dumps := save()
	for _, d := range dumps {
		if d.Table != kernel.TableNAT {
			continue
		}
		pre, _ := d.Chain("PREROUTING")
		want := []string{`-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`, "-s 198.18.255.0/24 -j RETURN"}
		if diff := cmp.Diff(want, pre.Rules); diff != "" {
			t.Errorf("PREROUTING (-want +got):\n%s", diff)
		}
	}
	// Drift: a rule removed from our chain is detected.
	if err := k.IPTables.Restore(ctx, kernel.FamilyIPv4, []byte("*nat\n-D KUBE-MARK-MASQ 1\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	rs, _ := Render(goldenCases()["ipv4_masq_all"])
	if _, differ := rs.Check(save()); !differ {
		t.Error("Check missed a deleted rule")
	}
	if !strings.Contains(string(rs.Payload(nil)), ":KUBE-MARK-MASQ - [0:0]") {
		t.Error("payload does not declare KUBE-MARK-MASQ")
	}
}
