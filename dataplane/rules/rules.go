// Package rules renders the agent's iptables rules. It is a pure function
// of a typed Input (no kernel, no clock): Render returns a Ruleset, whose
// Payload is one iptables-restore --noflush input per family.
//
// The payload declares (and so flushes) only vsplane's own chains, then
// refills them. The jumps from built-in chains (nat PREROUTING, OUTPUT,
// POSTROUTING; filter INPUT, FORWARD, OUTPUT) cannot be written that way
// without flushing the built-in chain, so they are returned separately as Jumps: the caller
// reads the built-in chains (iptables-save), and passes the missing ones to
// Payload, which inserts them at position 1 like kube-proxy's
// EnsureRule(Prepend). A jump already present anywhere in its chain is left
// alone, so repeated applies never duplicate it.
//
// Rules are written the way iptables-save prints them, so a read-back can
// be compared rule by rule (Ruleset.Check) to detect drift.
package rules

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/wire"
)

// Chain names (kube-proxy's).
const (
	ChainServices             = "KUBE-SERVICES"
	ChainPostrouting          = "KUBE-POSTROUTING"
	ChainNodePort             = "KUBE-NODE-PORT" // in nat and in filter
	ChainLoadBalancer         = "KUBE-LOAD-BALANCER"
	ChainMarkMasq             = "KUBE-MARK-MASQ"
	ChainForward              = "KUBE-FORWARD"
	ChainProxyFirewall        = "KUBE-PROXY-FIREWALL"
	ChainSourceRangesFirewall = "KUBE-SOURCE-RANGES-FIREWALL"
	ChainIPVSFilter           = "KUBE-IPVS-FILTER"
	ChainIPVSOutFilter        = "KUBE-IPVS-OUT-FILTER"
	// ChainInCluster is vsplane's own (kube-proxy's IPVS mode has no
	// equivalent): it marks in-cluster clients' connections to addresses of
	// Local external policy for a firewall-mark virtual server.
	ChainInCluster = "VSPLANE-IN-CLUSTER"
)

// InClusterMarkMask is the packet-mark field of in-cluster marks: the low
// 12 bits, clear of kube-proxy's masquerade (0x4000) and drop (0x8000) bits
// and of Calico's default mark mask (0xffff0000). A mark is written with
// the masquerade bit set too (InClusterMark.Mark), so the connection is
// masqueraded like any Cluster-policy external traffic.
const InClusterMarkMask uint32 = 0x0fff

// InClusterMark sends in-cluster clients of one address of Local external
// policy to the firewall-mark virtual server Mark (in-cluster mark field
// value | masquerade bit).
type InClusterMark struct {
	Dest VirtualPort
	Mark uint32
}

// DefaultMasqueradeBit is kube-proxy's default --iptables-masquerade-bit.
const DefaultMasqueradeBit = wire.DefaultMasqueradeBit

// Input is everything the rules depend on, for one family.
type Input struct {
	Family kernel.Family
	// MasqueradeAll: SNAT all traffic to a service (--masquerade-all).
	MasqueradeAll bool
	// MasqueradeBit is the packet-mark bit requesting SNAT (0..31).
	MasqueradeBit uint8
	// ClusterCIDRs of this family for local-traffic detection (the cluster
	// CIDRs, or the node's pod CIDRs in NodeCIDR mode); none, and no
	// LocalInterface, disables detection (kube-proxy then masquerades by
	// source VIP). kube-proxy takes one per family; vsplane any number.
	ClusterCIDRs []netip.Prefix
	// NodePodCIDRs are this node's own Pod CIDRs of the family: when set,
	// they (not ClusterCIDRs) tell which clients of Local external policy
	// are in-cluster, so a Pod of another node reaching this node's
	// NodePort stays external, as upstream's e2e expects (a Pod to its own
	// node's NodePort gets Cluster semantics, as with kube-proxy).
	NodePodCIDRs []netip.Prefix
	// LocalInterface tells Pod traffic by the interface it arrives on
	// instead ("-i" syntax: a bridge's name, or a prefix ending in "+");
	// set, ClusterCIDRs must be empty.
	LocalInterface string
	// RandomFully: MASQUERADE supports --random-fully.
	RandomFully bool
	// ConntrackTCPLiberal: nf_conntrack_tcp_be_liberal is set, so INVALID
	// packets need not be dropped.
	ConntrackTCPLiberal bool
	// NonEmpty are the sets (of this family) that have entries; rules
	// matching an empty set are left out, as kube-proxy does.
	NonEmpty SetMask
	// LoadBalancerNoNodeAccess are the load-balancer ingress ip:port/proto
	// (of this family) of Services with loadBalancerSourceRanges none of
	// which contains the node's IP: kube-proxy's
	// lbNoNodeAccessIPPortProtocolEntries. Connections from the node itself
	// to them are dropped in KUBE-IPVS-OUT-FILTER (IPVS schedules
	// node-originated packets in OUTPUT, so KUBE-PROXY-FIREWALL in INPUT
	// never sees them). NoNodeAccess derives the list from the ipset
	// entries. Order and duplicates do not matter (rendered sorted, once).
	// nil: no such Service, KUBE-IPVS-OUT-FILTER stays empty.
	LoadBalancerNoNodeAccess []VirtualPort
	// InClusterMarks: connections from the cluster CIDRs and from the node
	// itself (source address type LOCAL) to each Dest get Mark in nat
	// KUBE-SERVICES, before IPVS schedules them. Order does not matter
	// (rendered sorted); nil: the chain stays empty and is not jumped to.
	InClusterMarks []InClusterMark
}

// Validate reports an Input that cannot be rendered.
func (in Input) Validate() error {
	if !in.Family.Valid() {
		return fmt.Errorf("rules: family must be inet or inet6: %w", kernel.ErrInvalid)
	}
	if in.MasqueradeBit > 31 {
		return fmt.Errorf("rules: masquerade bit %d out of range 0..31: %w", in.MasqueradeBit, kernel.ErrInvalid)
	}
	if in.LocalInterface != "" {
		name, prefix := strings.CutSuffix(in.LocalInterface, "+")
		if err := wire.CheckInterfaceName(name, prefix); err != nil {
			return fmt.Errorf("rules: local interface %q: %v: %w", in.LocalInterface, err, kernel.ErrInvalid)
		}
		if len(in.ClusterCIDRs) > 0 {
			return fmt.Errorf("rules: local interface %q and cluster CIDRs both set: %w", in.LocalInterface, kernel.ErrInvalid)
		}
	}
	for _, c := range append(slices.Clone(in.ClusterCIDRs), in.NodePodCIDRs...) {
		if !c.IsValid() || kernel.FamilyOf(c.Addr().Unmap()) != in.Family {
			return fmt.Errorf("rules: pod CIDR %v is not %v: %w", c, in.Family, kernel.ErrInvalid)
		}
	}
	for _, vp := range in.LoadBalancerNoNodeAccess {
		if err := vp.validate(in.Family); err != nil {
			return err
		}
	}
	masq := uint32(1) << in.MasqueradeBit
	for _, m := range in.InClusterMarks {
		if err := m.Dest.validate(in.Family); err != nil {
			return err
		}
		if masq&InClusterMarkMask != 0 || m.Mark&InClusterMarkMask == 0 || m.Mark&^InClusterMarkMask != masq {
			return fmt.Errorf("rules: in-cluster mark %#x for %v is not a value of %#x with only the masquerade bit %#x besides: %w",
				m.Mark, m.Dest, InClusterMarkMask, masq, kernel.ErrInvalid)
		}
	}
	return nil
}

// Chain is one of our chains and its rules (without "-A CHAIN").
type Chain struct {
	Name  string
	Rules []string
}

// Table is our chains of one table, in declaration order.
type Table struct {
	Table  kernel.Table
	Chains []Chain
	// Absent are our chains this rendering leaves out (vsplane's own,
	// optionalChains, while empty): the payload deletes them, so a node
	// without their feature holds exactly kube-proxy's chains.
	Absent []string
}

// Chain returns the named chain.
func (t Table) Chain(name string) (Chain, bool) {
	for _, c := range t.Chains {
		if c.Name == name {
			return c, true
		}
	}
	return Chain{}, false
}

// Jump is a rule in a built-in chain that leads to one of ours.
type Jump struct {
	Table kernel.Table
	From  string // built-in chain
	Rule  string // rule spec without "-A From"
}

// Ruleset is the rendered rules of one family.
type Ruleset struct {
	Family kernel.Family
	// Tables in payload order (filter, then nat, like kube-proxy).
	Tables []Table
	Jumps  []Jump
}

// Render computes the ruleset for in.
func Render(in Input) (Ruleset, error) {
	if err := in.Validate(); err != nil {
		return Ruleset{}, err
	}
	b := newBuilder(in)
	for _, section := range sections {
		section(b)
	}
	return b.ruleset(), nil
}

// builder collects rules per chain; chains are declared up front (in
// tableChains) so every section can append to any of them in any order.
type builder struct {
	in     Input
	mark   string // "0x4000/0x4000"
	rules  map[kernel.Table]map[string][]string
	jumps  []Jump
	tables []Table
}

func newBuilder(in Input) *builder {
	bit := uint32(1) << in.MasqueradeBit
	b := &builder{
		in:    in,
		mark:  fmt.Sprintf("%#x/%#x", bit, bit),
		rules: map[kernel.Table]map[string][]string{},
	}
	for _, tc := range tableChains {
		b.rules[tc.table] = map[string][]string{}
	}
	return b
}

func (b *builder) add(t kernel.Table, chain string, parts ...string) {
	b.rules[t][chain] = append(b.rules[t][chain], strings.Join(parts, " "))
}

func (b *builder) ruleset() Ruleset {
	rs := Ruleset{Family: b.in.Family, Jumps: b.jumps}
	for _, tc := range tableChains {
		t := Table{Table: tc.table}
		for _, c := range tc.chains {
			rules := b.rules[tc.table][c]
			if len(rules) == 0 && slices.Contains(optionalChains, c) {
				t.Absent = append(t.Absent, c)
				continue
			}
			t.Chains = append(t.Chains, Chain{Name: c, Rules: rules})
		}
		rs.Tables = append(rs.Tables, t)
	}
	return rs
}

// Payload renders the iptables-restore --noflush input: our chains
// declared (flushed) and refilled, plus an insert at position 1 for each of
// missingJumps (see MissingJumps), and the absent chains declared and
// deleted ("-X", after every rule that could refer to them is gone; a
// chain that did not exist is created and deleted in the same commit).
func (r Ruleset) Payload(missingJumps []Jump) []byte {
	var buf bytes.Buffer
	for _, t := range r.Tables {
		fmt.Fprintf(&buf, "*%s\n", t.Table)
		for _, c := range t.Chains {
			fmt.Fprintf(&buf, ":%s - [0:0]\n", c.Name)
		}
		for _, c := range t.Absent {
			fmt.Fprintf(&buf, ":%s - [0:0]\n", c)
		}
		for _, c := range t.Chains {
			for _, rule := range c.Rules {
				fmt.Fprintf(&buf, "-A %s %s\n", c.Name, rule)
			}
		}
		for _, j := range missingJumps {
			if j.Table == t.Table {
				fmt.Fprintf(&buf, "-I %s 1 %s\n", j.From, j.Rule)
			}
		}
		for _, c := range t.Absent {
			fmt.Fprintf(&buf, "-X %s\n", c)
		}
		buf.WriteString("COMMIT\n")
	}
	return buf.Bytes()
}

// Check compares the ruleset with what iptables-save shows for its tables
// (parsed with kernel.ParseSave). It returns the jumps missing from the
// built-in chains and whether any of our chains differs (missing, or with
// other rules, or present while absent from the rendering).
func (r Ruleset) Check(saved []kernel.TableDump) (missingJumps []Jump, chainsDiffer bool) {
	byTable := map[kernel.Table]kernel.TableDump{}
	for _, d := range saved {
		byTable[d.Table] = d
	}
	for _, t := range r.Tables {
		d := byTable[t.Table]
		for _, c := range t.Chains {
			got, ok := d.Chain(c.Name)
			if !ok || !slices.Equal(got.Rules, c.Rules) {
				chainsDiffer = true
			}
		}
		for _, c := range t.Absent {
			if _, ok := d.Chain(c); ok {
				chainsDiffer = true
			}
		}
	}
	for _, j := range r.Jumps {
		got, ok := byTable[j.Table].Chain(j.From)
		if !ok || !slices.Contains(got.Rules, j.Rule) {
			missingJumps = append(missingJumps, j)
		}
	}
	return missingJumps, chainsDiffer
}

// TableNames lists the tables the ruleset touches.
func (r Ruleset) TableNames() []kernel.Table {
	out := make([]kernel.Table, 0, len(r.Tables))
	for _, t := range r.Tables {
		out = append(out, t.Table)
	}
	return out
}
