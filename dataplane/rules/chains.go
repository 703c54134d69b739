package rules

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// tableChains declares our chains per table, in kube-proxy's iptablesChains
// order. Tables: filter, then nat (kube-proxy writes nat first; the order of
// tables in one restore does not matter).
var tableChains = []struct {
	table  kernel.Table
	chains []string
}{
	{kernel.TableFilter, []string{ChainForward, ChainNodePort, ChainProxyFirewall,
		ChainSourceRangesFirewall, ChainIPVSFilter, ChainIPVSOutFilter}},
	{kernel.TableNAT, []string{ChainServices, ChainPostrouting, ChainNodePort,
		ChainLoadBalancer, ChainMarkMasq, ChainInCluster}},
}

// optionalChains exist only while they have rules: vsplane's own, so that
// a node not using their feature holds exactly kube-proxy's chains (and a
// node handed back to kube-proxy keeps nothing of vsplane's).
var optionalChains = []string{ChainInCluster}

// sections write the rules in kube-proxy's order (writeIptablesRules), so
// the rules of each chain come out in its order.
var sections = []func(*builder){
	(*builder).dismissLocalhost,
	(*builder).inClusterRules,
	(*builder).setRules,
	(*builder).clusterIPRules,
	(*builder).externalIPRules,
	(*builder).nodePortJump,
	(*builder).loadBalancerRules,
	(*builder).sourceRangesDrop,
	(*builder).noNodeAccessRules,
	(*builder).acceptIPVSTraffic,
	(*builder).forwardRules,
	(*builder).healthCheckRules,
	(*builder).ipvsFilterRules,
	(*builder).postroutingRules,
	(*builder).markMasqRules,
	(*builder).jumpRules,
}

// comment renders a comment match the way iptables-save prints it
// (libxtables' xtables_save_string): bare when made only of letters,
// digits, '_' and '-'; else in double quotes, with double quote, backslash
// and single quote escaped by a backslash (iptables-restore reads that back
// unescaped). Comments are this package's constants, but the quoting is
// safe for any text: bytes outside printable ASCII (newlines included)
// become '?', and the text is cut to xt_comment's 255 bytes, so a comment
// is always exactly one token of one line.
func comment(text string) string {
	text = commentText(text)
	bare := text != ""
	for _, r := range text {
		if !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			bare = false
			break
		}
	}
	if bare {
		return "-m comment --comment " + text
	}
	var b strings.Builder
	b.WriteString(`-m comment --comment "`)
	for i := 0; i < len(text); i++ {
		if c := text[i]; c == '"' || c == '\\' || c == '\'' {
			b.WriteByte('\\')
		}
		b.WriteByte(text[i])
	}
	b.WriteByte('"')
	return b.String()
}

// commentText is text made safe for a comment match: printable ASCII,
// at most 255 bytes (XT_MAX_COMMENT_LEN - 1).
func commentText(text string) string {
	b := []byte(text)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b[:min(len(b), 255)])
}

func (b *builder) setName(s Set) string { return s.Name(b.in.Family) }

// matchSet is "-m set --match-set NAME dirs".
func (b *builder) matchSet(s Set, dirs string) string {
	return "-m set --match-set " + b.setName(s) + " " + dirs
}

// dismissLocalhost returns connections from loopback early: IPVS cannot
// serve them (kube-proxy's IPVS mode does not set route_localnet).
func (b *builder) dismissLocalhost() {
	lo := "127.0.0.0/8"
	if b.in.Family == kernel.FamilyIPv6 {
		lo = "::1/128"
	}
	b.add(kernel.TableNAT, ChainServices, "-s", lo, "-j RETURN")
}

// inClusterRules mark connections of in-cluster clients to addresses of
// Local external policy. The policy is for external clients; Kubernetes
// gives in-cluster ones Cluster semantics, and kube-proxy's iptables mode
// does so with its local-traffic detector. Here the mark selects a
// firewall-mark virtual server with the Cluster selection of endpoints
// (IPVS looks up fwmark services first) and carries the masquerade bit:
// the connection may cross nodes, and a node's own connection has the
// Local address itself as source. In-cluster clients are this node's Pods,
// told by the interface they arrive on, else by the node's pod CIDRs, else
// by the cluster CIDRs (none: only the node's own connections), and the
// node itself, told by the source address type. A Pod of another node
// reaching this node's NodePort is external, as upstream's e2e expects. Only the
// first packet passes nat, and only it needs the mark: IPVS schedules on it.
func (b *builder) inClusterRules() {
	if len(b.in.InClusterMarks) == 0 {
		return
	}
	pods := b.in.NodePodCIDRs
	switch {
	case b.in.LocalInterface != "":
		b.add(kernel.TableNAT, ChainServices, "-i", b.in.LocalInterface, "-j", ChainInCluster)
		pods = nil
	case len(pods) == 0:
		pods = b.in.ClusterCIDRs
	}
	for _, c := range pods {
		b.add(kernel.TableNAT, ChainServices, "-s", c.Masked().String(), "-j", ChainInCluster)
	}
	b.add(kernel.TableNAT, ChainServices, "-m addrtype --src-type LOCAL -j", ChainInCluster)
	marks := slices.Clone(b.in.InClusterMarks)
	for i := range marks {
		marks[i].Dest.IP = marks[i].Dest.IP.Unmap()
	}
	slices.SortFunc(marks, func(x, y InClusterMark) int {
		return cmp.Or(compareVirtualPorts(x.Dest, y.Dest), cmp.Compare(x.Mark, y.Mark))
	})
	marks = slices.Compact(marks)
	mask := InClusterMarkMask | uint32(1)<<b.in.MasqueradeBit
	for _, m := range marks {
		d := m.Dest
		proto := d.Protocol.String()
		b.add(kernel.TableNAT, ChainInCluster, "-d", d.IP.String()+"/"+strconv.Itoa(d.IP.BitLen()),
			"-p", proto, "-m", proto, "--dport", strconv.Itoa(int(d.Port)),
			"-j MARK --set-xmark", fmt.Sprintf("%#x/%#x", m.Mark, mask))
	}
}

// setRule is one row of kube-proxy's ipsetWithIptablesChain: a rule
// written only while its set has entries.
type setRule struct {
	set   Set
	table kernel.Table
	from  string
	dirs  string
	proto kernel.Protocol // "-p" match, 0: none
	to    string
}

// setRuleTable is ipsetWithIptablesChain, in its order. The LOCAL NodePort
// sets come before the plain ones so ETP Local ports RETURN before being
// marked for masquerade (the client source IP is kept).
var setRuleTable = []setRule{
	{SetLoopBack, kernel.TableNAT, ChainPostrouting, "dst,dst,src", 0, "MASQUERADE"},
	{SetLoadBalancer, kernel.TableNAT, ChainServices, "dst,dst", 0, ChainLoadBalancer},
	{SetLoadBalancerLocal, kernel.TableNAT, ChainLoadBalancer, "dst,dst", 0, "RETURN"},
	{SetNodePortLocalTCP, kernel.TableNAT, ChainNodePort, "dst", kernel.ProtocolTCP, "RETURN"},
	{SetNodePortTCP, kernel.TableNAT, ChainNodePort, "dst", kernel.ProtocolTCP, ChainMarkMasq},
	{SetNodePortLocalUDP, kernel.TableNAT, ChainNodePort, "dst", kernel.ProtocolUDP, "RETURN"},
	{SetNodePortUDP, kernel.TableNAT, ChainNodePort, "dst", kernel.ProtocolUDP, ChainMarkMasq},
	{SetNodePortLocalSCTP, kernel.TableNAT, ChainNodePort, "dst,dst", kernel.ProtocolSCTP, "RETURN"},
	{SetNodePortSCTP, kernel.TableNAT, ChainNodePort, "dst,dst", kernel.ProtocolSCTP, ChainMarkMasq},
	{SetLoadBalancerFW, kernel.TableFilter, ChainProxyFirewall, "dst,dst", 0, ChainSourceRangesFirewall},
	{SetLoadBalancerSourceCIDR, kernel.TableFilter, ChainSourceRangesFirewall, "dst,dst,src", 0, "RETURN"},
	{SetLoadBalancerSourceIP, kernel.TableFilter, ChainSourceRangesFirewall, "dst,dst,src", 0, "RETURN"},
}

func (b *builder) setRules() {
	for _, r := range setRuleTable {
		if !b.in.NonEmpty.Has(r.set) {
			continue
		}
		var parts []string
		if r.proto != 0 {
			parts = append(parts, "-p", r.proto.String())
		}
		parts = append(parts, comment(r.set.Comment()), b.matchSet(r.set, r.dirs), "-j", r.to)
		b.add(r.table, r.from, parts...)
	}
}

// clusterIPRules marks traffic to a ClusterIP for masquerading when it does
// not come from a pod (or always with MasqueradeAll).
func (b *builder) clusterIPRules() {
	if !b.in.NonEmpty.Has(SetClusterIP) {
		return
	}
	match := comment(SetClusterIP.Comment()) + " " + b.matchSet(SetClusterIP, "dst,dst")
	switch {
	case b.in.MasqueradeAll:
		b.add(kernel.TableNAT, ChainServices, match, "-j", ChainMarkMasq)
	case b.in.LocalInterface != "":
		// kube-proxy's interface detectors (BridgeInterface,
		// InterfaceNamePrefix); iptables-save prints the interface first.
		b.add(kernel.TableNAT, ChainServices, "! -i", b.in.LocalInterface, match, "-j", ChainMarkMasq)
	case len(b.in.ClusterCIDRs) == 1:
		// kube-proxy writes the source match last; iptables-save prints it first.
		b.add(kernel.TableNAT, ChainServices, "! -s", b.in.ClusterCIDRs[0].Masked().String(), match, "-j", ChainMarkMasq)
	case len(b.in.ClusterCIDRs) > 1:
		// One negated source match cannot name several ranges. Pod traffic
		// is accepted here, as acceptIPVSTraffic's rule would accept it
		// later, so what reaches the mark rule is not from a pod. (Unlike
		// kube-proxy, a pod's connection to a ClusterIP port that is also
		// some NodePort's number is then not masqueraded by KUBE-NODE-PORT.)
		for _, c := range b.in.ClusterCIDRs {
			b.add(kernel.TableNAT, ChainServices, "-s", c.Masked().String(), match, "-j ACCEPT")
		}
		b.add(kernel.TableNAT, ChainServices, match, "-j", ChainMarkMasq)
	default:
		// No way to tell pod traffic: masquerade traffic whose source is a
		// VIP (node-originated connections pick the VIP on kube-ipvs0).
		b.add(kernel.TableNAT, ChainServices, comment(SetClusterIP.Comment()), b.matchSet(SetClusterIP, "src,dst"), "-j", ChainMarkMasq)
	}
}

// externalIPRules: traffic to an external IP of a Cluster-policy Service is
// masqueraded; for both policies, traffic from off the machine (not from a
// bridge port, not from a local address) and traffic to an external IP that
// is a local address are accepted. The Local set gets no masquerade rule,
// so its clients keep their source IP.
func (b *builder) externalIPRules() {
	for _, s := range []Set{SetExternalIP, SetExternalIPLocal} {
		if !b.in.NonEmpty.Has(s) {
			continue
		}
		match := comment(s.Comment()) + " " + b.matchSet(s, "dst,dst")
		if s == SetExternalIP {
			b.add(kernel.TableNAT, ChainServices, match, "-j", ChainMarkMasq)
		}
		b.add(kernel.TableNAT, ChainServices, match, "-m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
		b.add(kernel.TableNAT, ChainServices, match, "-m addrtype --dst-type LOCAL -j ACCEPT")
	}
}

// nodePortJump sends traffic to any local address to KUBE-NODE-PORT, which
// matches ports only (nodePortAddresses is enforced by which addresses
// carry NodePort virtual servers, not by iptables, as in kube-proxy).
func (b *builder) nodePortJump() {
	b.add(kernel.TableNAT, ChainServices, "-m addrtype --dst-type LOCAL -j", ChainNodePort)
}

// loadBalancerRules: LB traffic not RETURNed by the Local set is marked.
func (b *builder) loadBalancerRules() {
	b.add(kernel.TableNAT, ChainLoadBalancer, "-j", ChainMarkMasq)
}

// sourceRangesDrop ends KUBE-SOURCE-RANGES-FIREWALL: an LB with source
// ranges whose client matched no allowed CIDR (or node IP) is dropped.
func (b *builder) sourceRangesDrop() {
	b.add(kernel.TableFilter, ChainSourceRangesFirewall, "-j DROP")
}

// noNodeAccessRules drop node-originated connections to LBs whose source
// ranges exclude the node. IPVS schedules such packets in OUTPUT and they
// keep the LB IP as source, hence "-s lbIP" and the ipvs match (written as
// libxt_ipvs saves it: protocol number, address without a full-length
// prefix, unlike -s; read back in the VM, vm_test.go).
func (b *builder) noNodeAccessRules() {
	vps := append([]VirtualPort(nil), b.in.LoadBalancerNoNodeAccess...)
	for i := range vps {
		vps[i].IP = vps[i].IP.Unmap()
	}
	sortCompact(&vps)
	for _, vp := range vps {
		b.add(kernel.TableFilter, ChainIPVSOutFilter, "-s", vp.IP.String()+"/"+strconv.Itoa(vp.IP.BitLen()),
			"-m ipvs --vproto", strconv.Itoa(int(vp.Protocol)), "--vaddr", vp.IP.String(), "--vport", strconv.Itoa(int(vp.Port)), "-j DROP")
	}
}

// acceptIPVSTraffic accepts traffic to virtual servers so later rules
// cannot block it; it must stay at the end of KUBE-SERVICES.
func (b *builder) acceptIPVSTraffic() {
	for _, s := range []Set{SetClusterIP, SetLoadBalancer} {
		if b.in.NonEmpty.Has(s) {
			b.add(kernel.TableNAT, ChainServices, b.matchSet(s, "dst,dst"), "-j ACCEPT")
		}
	}
}

func (b *builder) forwardRules() {
	if !b.in.ConntrackTCPLiberal {
		// Not in kube-proxy's IPVS proxier (its iptables proxier has it):
		// INVALID packets would reset connections (kubernetes#74839).
		b.add(kernel.TableFilter, ChainForward, "-m conntrack --ctstate INVALID -j DROP")
	}
	b.add(kernel.TableFilter, ChainForward, comment("kubernetes forwarding rules"), "-m mark --mark", b.mark, "-j ACCEPT")
	b.add(kernel.TableFilter, ChainForward, comment("kubernetes forwarding conntrack rule"),
		"-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
}

// healthCheckRules accept health check node ports whatever the INPUT policy.
func (b *builder) healthCheckRules() {
	b.add(kernel.TableFilter, ChainNodePort, comment(SetHealthCheckNodePort.Comment()),
		b.matchSet(SetHealthCheckNodePort, "dst"), "-j ACCEPT")
}

// ipvsFilterRules reject new connections to addresses on kube-ipvs0 unless
// they go to a virtual server's ip:port or a health check port
// (kubernetes#72236: host ports must not be reachable via service VIPs).
// Written whether the sets are empty or not, as kube-proxy does.
func (b *builder) ipvsFilterRules() {
	for _, r := range []struct {
		s    Set
		dirs string
	}{
		{SetLoadBalancer, "dst,dst"}, {SetClusterIP, "dst,dst"}, {SetExternalIP, "dst,dst"},
		{SetExternalIPLocal, "dst,dst"}, {SetHealthCheckNodePort, "dst"},
	} {
		b.add(kernel.TableFilter, ChainIPVSFilter, b.matchSet(r.s, r.dirs), "-j RETURN")
	}
	reject := "icmp-port-unreachable"
	if b.in.Family == kernel.FamilyIPv6 {
		reject = "icmp6-port-unreachable"
	}
	b.add(kernel.TableFilter, ChainIPVSFilter, "-m conntrack --ctstate NEW", b.matchSet(SetIPVSIPs, "dst"),
		"-j REJECT --reject-with", reject)
}

func (b *builder) postroutingRules() {
	bit := b.mark[:strings.IndexByte(b.mark, '/')]
	b.add(kernel.TableNAT, ChainPostrouting, "-m mark ! --mark", b.mark, "-j RETURN")
	// Clear the mark (--xor-mark, saved as --set-xmark BIT/0x0) so a
	// re-traversing packet is not masqueraded twice.
	b.add(kernel.TableNAT, ChainPostrouting, "-j MARK --set-xmark", bit+"/0x0")
	masq := []string{comment("kubernetes service traffic requiring SNAT"), "-j MASQUERADE"}
	if b.in.RandomFully {
		masq = append(masq, "--random-fully")
	}
	b.add(kernel.TableNAT, ChainPostrouting, masq...)
}

func (b *builder) markMasqRules() {
	// --or-mark, as iptables-save prints it.
	b.add(kernel.TableNAT, ChainMarkMasq, "-j MARK --set-xmark", b.mark)
}

// jumpRules are kube-proxy's iptablesJumpChain, in its order. Each missing
// one is inserted at position 1 in this order, so a fresh node ends up with
// the order kube-proxy's repeated EnsureRule(Prepend) gives (INPUT:
// KUBE-IPVS-FILTER, KUBE-PROXY-FIREWALL, KUBE-NODE-PORT).
func (b *builder) jumpRules() {
	jump := func(t kernel.Table, from, text, to string) {
		b.jumps = append(b.jumps, Jump{t, from, comment(text) + " -j " + to})
	}
	jump(kernel.TableNAT, "OUTPUT", "kubernetes service portals", ChainServices)
	jump(kernel.TableNAT, "PREROUTING", "kubernetes service portals", ChainServices)
	jump(kernel.TableNAT, "POSTROUTING", "kubernetes postrouting rules", ChainPostrouting)
	jump(kernel.TableFilter, "FORWARD", "kubernetes forwarding rules", ChainForward)
	jump(kernel.TableFilter, "INPUT", "kubernetes health check rules", ChainNodePort)
	jump(kernel.TableFilter, "INPUT", "kube-proxy firewall rules", ChainProxyFirewall)
	jump(kernel.TableFilter, "FORWARD", "kube-proxy firewall rules", ChainProxyFirewall)
	jump(kernel.TableFilter, "INPUT", "kubernetes ipvs access filter", ChainIPVSFilter)
	jump(kernel.TableFilter, "OUTPUT", "kubernetes ipvs access filter", ChainIPVSOutFilter)
}
