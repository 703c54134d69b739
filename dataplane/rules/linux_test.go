package rules_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
	"github.com/vsplane/vsplane/dataplane/rules"
	"github.com/vsplane/vsplane/internal/netnstest"
)

// The real-iptables test changes the kernel, so the test binary re-executes
// itself in a fresh network namespace and that test only runs there. Not
// getting one fails the test (never a skip); the pure tests run either way.
var netnsErr error

func TestMain(m *testing.M) {
	netnsErr = netnstest.Reexec("VSPLANE_RULES_TEST_IN_NETNS")
	os.Exit(m.Run())
}

func saveTables(t *testing.T, ipt kernel.IPTables, fam kernel.Family) []kernel.TableDump {
	t.Helper()
	var out []kernel.TableDump
	for _, tb := range []kernel.Table{kernel.TableFilter, kernel.TableNAT} {
		b, err := ipt.Save(context.Background(), fam, tb)
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

var (
	clusterCIDR = map[kernel.Family]netip.Prefix{
		kernel.FamilyIPv4: netip.MustParsePrefix("198.19.0.0/16"),
		kernel.FamilyIPv6: netip.MustParsePrefix("2001:2:0:100::/56"),
	}
	allSets = func() rules.SetMask {
		var m rules.SetMask
		for _, s := range rules.AllSets() {
			m = m.With(s)
		}
		return m
	}()
	lbAddr = map[kernel.Family]netip.Addr{
		kernel.FamilyIPv4: netip.MustParseAddr("198.18.200.1"),
		kernel.FamilyIPv6: netip.MustParseAddr("2001:2:0:1::c8"),
	}
)

var moreClusterCIDRs = map[kernel.Family][]netip.Prefix{
	kernel.FamilyIPv4: {netip.MustParsePrefix("198.18.241.0/24"), netip.MustParsePrefix("198.18.242.0/24")},
	kernel.FamilyIPv6: {netip.MustParsePrefix("2001:2:0:f1::/64"), netip.MustParsePrefix("2001:2:0:f2::/64")},
}

// realInputs are the inputs applied in sequence on a real kernel: every set
// non-empty, then the variants, then back to none, so each transition
// (rules added, rules removed) is checked. withNoNodeAccess adds
// KUBE-IPVS-OUT-FILTER rules, whose ipvs match needs a kernel with IPVS.
func realInputs(fam kernel.Family, randomFully, withNoNodeAccess bool) []rules.Input {
	all := rules.Input{Family: fam, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR[fam]}, RandomFully: randomFully, NonEmpty: allSets}
	if withNoNodeAccess {
		all.LoadBalancerNoNodeAccess = []rules.VirtualPort{
			{IP: lbAddr[fam], Port: 80, Protocol: kernel.ProtocolTCP},
			{IP: lbAddr[fam], Port: 53, Protocol: kernel.ProtocolUDP},
			{IP: lbAddr[fam], Port: 9, Protocol: kernel.ProtocolSCTP},
		}
	}
	masqAll := all
	masqAll.MasqueradeAll, masqAll.ClusterCIDRs = true, nil
	noCIDR := all
	noCIDR.ClusterCIDRs, noCIDR.ConntrackTCPLiberal, noCIDR.LoadBalancerNoNodeAccess = nil, true, nil
	// Several cluster CIDRs of the family (kube-proxy takes one).
	threeCIDRs := all
	threeCIDRs.ClusterCIDRs = append([]netip.Prefix{clusterCIDR[fam]}, moreClusterCIDRs[fam]...)
	// In-cluster marks of every protocol, written as iptables-save prints them.
	inCluster := threeCIDRs
	for i, proto := range []kernel.Protocol{kernel.ProtocolTCP, kernel.ProtocolUDP, kernel.ProtocolSCTP} {
		inCluster.InClusterMarks = append(inCluster.InClusterMarks,
			rules.InClusterMark{Dest: rules.VirtualPort{IP: lbAddr[fam], Port: 80, Protocol: proto}, Mark: 0x4001 + uint32(i)})
	}
	// Interface detection (kube-proxy's BridgeInterface, InterfaceNamePrefix).
	bridge, prefix := inCluster, inCluster
	bridge.ClusterCIDRs, bridge.LocalInterface = nil, "cbr0"
	prefix.ClusterCIDRs, prefix.LocalInterface = nil, "veth+"
	return []rules.Input{
		all,
		threeCIDRs,
		inCluster,
		bridge,
		prefix,
		{Family: fam, MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{clusterCIDR[fam]}, RandomFully: randomFully,
			NonEmpty: rules.SetMask(0).With(rules.SetClusterIP).With(rules.SetLoopBack)},
		masqAll,
		noCIDR,
		{Family: fam, MasqueradeBit: 3, ConntrackTCPLiberal: true},
	}
}

// foreign are rules of someone else in the built-in chains; they must
// survive every apply, after our jumps.
const foreign4 = "*filter\n-A INPUT -s 198.18.255.0/24 -j ACCEPT\nCOMMIT\n*nat\n-A PREROUTING -s 198.18.255.0/24 -j ACCEPT\nCOMMIT\n"
const foreign6 = "*filter\n-A INPUT -s 2001:2:ff::/48 -j ACCEPT\nCOMMIT\n*nat\n-A PREROUTING -s 2001:2:ff::/48 -j ACCEPT\nCOMMIT\n"

// roundTrip applies each input with the real iptables-restore and checks
// that iptables-save prints exactly the rendered rules (Check finds no
// drift after an apply), that jumps are never duplicated and come in
// kube-proxy's order before foreign rules.
func roundTrip(t *testing.T, ipt kernel.IPTables, fam kernel.Family, inputs []rules.Input) {
	t.Helper()
	ctx := context.Background()
	foreign := foreign4
	if fam == kernel.FamilyIPv6 {
		foreign = foreign6
	}
	// Added once per namespace (the vmtest binary runs two tests in one).
	present := false
	for _, d := range saveTables(t, ipt, fam) {
		if c, ok := d.Chain("INPUT"); ok && d.Table == kernel.TableFilter {
			present = slices.Contains(c.Rules, foreignRule(fam))
		}
	}
	if !present {
		if err := ipt.Restore(ctx, fam, []byte(foreign)); err != nil {
			t.Fatalf("foreign rules: %v", err)
		}
	}
	for i, in := range inputs {
		rs, err := rules.Render(in)
		if err != nil {
			t.Fatal(err)
		}
		missing, _ := rs.Check(saveTables(t, ipt, fam))
		if err := ipt.Restore(ctx, fam, rs.Payload(missing)); err != nil {
			t.Fatalf("input %d: restore: %v\n%s", i, err, rs.Payload(missing))
		}
		saved := saveTables(t, ipt, fam)
		if missing, differ := rs.Check(saved); len(missing) > 0 || differ {
			t.Fatalf("input %d: read-back differs from rendering (missing jumps %v, chains differ %v)\n%s",
				i, missing, differ, chainDiff(rs, saved))
		}
		want := map[string][]string{
			"filter/INPUT": {`-m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER`,
				`-m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL`,
				`-m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT`},
			"filter/FORWARD": {`-m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL`,
				`-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`},
			"filter/OUTPUT":   {`-m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER`},
			"nat/PREROUTING":  {`-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
			"nat/OUTPUT":      {`-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
			"nat/POSTROUTING": {`-m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`},
		}
		for _, d := range saved {
			for _, c := range d.Chains {
				key := string(d.Table) + "/" + c.Name
				w, ok := want[key]
				if !ok {
					continue
				}
				if c.Name == "INPUT" || c.Name == "PREROUTING" {
					w = append(w, foreignRule(fam))
				}
				if !slices.Equal(c.Rules, w) {
					t.Errorf("input %d: %s holds\n%s\nwant\n%s", i, key, strings.Join(c.Rules, "\n"), strings.Join(w, "\n"))
				}
				delete(want, key)
			}
		}
		if len(want) > 0 {
			t.Errorf("input %d: built-in chains not seen: %v", i, want)
		}
	}
}

func foreignRule(fam kernel.Family) string {
	if fam == kernel.FamilyIPv6 {
		return "-s 2001:2:ff::/48 -j ACCEPT"
	}
	return "-s 198.18.255.0/24 -j ACCEPT"
}

// chainDiff shows, per chain of ours, the rendered and the saved rules.
func chainDiff(rs rules.Ruleset, saved []kernel.TableDump) string {
	var b strings.Builder
	for _, tb := range rs.Tables {
		for _, c := range tb.Chains {
			var got []string
			for _, d := range saved {
				if d.Table == tb.Table {
					if sc, ok := d.Chain(c.Name); ok {
						got = sc.Rules
					}
				}
			}
			if !slices.Equal(got, c.Rules) {
				fmt.Fprintf(&b, "%s/%s rendered:\n  %s\nsaved:\n  %s\n", tb.Table, c.Name,
					strings.Join(c.Rules, "\n  "), strings.Join(got, "\n  "))
			}
		}
	}
	return b.String()
}

// TestRealIPTablesReadBack applies rendered payloads with the real
// iptables-restore (legacy and nft, IPv4 and IPv6) in a private network
// namespace and checks the read-back rule by rule. This host's kernel has
// no IPVS, so the ipvs match of KUBE-IPVS-OUT-FILTER is checked in the VM
// (vm_test.go, tag vmtest); everything else is checked here.
func TestRealIPTablesReadBack(t *testing.T) {
	if netnsErr != nil {
		t.Fatalf("cannot run real-kernel test: %v", netnsErr)
	}
	realReadBack(t, false)
}

func realReadBack(t *testing.T, withNoNodeAccess bool) {
	ctx := context.Background()
	sets, err := linux.NewIPSets()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
		for _, s := range rules.AllSets() {
			if err := sets.CreateSet(s.Spec(fam)); err != nil && !errors.Is(err, kernel.ErrExist) {
				t.Fatalf("create %s: %v", s.Name(fam), err)
			}
		}
	}
	for _, backend := range []kernel.Backend{kernel.BackendLegacy, kernel.BackendNFT} {
		ipt, err := linux.NewIPTables(ctx, linux.IPTablesOptions{Backend: backend})
		if err != nil {
			t.Fatalf("%s: %v", backend, err)
		}
		for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
			t.Run(fmt.Sprintf("%s/%v", backend, fam), func(t *testing.T) {
				if !ipt.Info().RandomFully {
					t.Errorf("%s: --random-fully not detected; this iptables supports it", backend)
				}
				roundTrip(t, ipt, fam, realInputs(fam, ipt.Info().RandomFully, withNoNodeAccess))
			})
		}
	}
}
