package reconcile

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// iptables. The rules depend on every resource at once, so there is one
// object per family: the rendering of rules.Render.
//
//   - Update (syncIPTables): when the rendering differs from the one last
//     applied (known.rules), or when verify is set (first Apply, full
//     reconcile), iptables-save is compared with it and one
//     iptables-restore --noflush writes our chains and any missing jump.
//     The payload passes rules.CheckPayload first (only our chains and the
//     fixed jumps).
//   - Delete / Prune: our chains are rewritten whole by each restore;
//     nothing else is touched.
//   - Status: a failure is blamed on the changed resources of an Apply
//     (none in a full reconcile: an error no resource owns) and leaves
//     known.rules unset, so the next pass compares again.
//   - Fingerprints (kernel.IPTablesFingerprinter): a compare that found
//     nothing to write keeps the tables' fingerprint read just before its
//     iptables-save (known.rulesPrint). A full pass whose rendering is
//     unchanged and whose tables still have that fingerprint leaves the
//     save out, at most maxPrintSkips passes in a row; the drift probe
//     compares it too, so a flushed chain is repaired within the probe
//     interval. A restore records the fingerprint read right after it.

// rulesInput is what the renderer needs of the desired state for fam.
func (p *pass) rulesInput(fam kernel.Family, liberal bool) rules.Input {
	s := p.s
	in := rules.Input{
		Family:              fam,
		MasqueradeAll:       s.masqueradeAll,
		MasqueradeBit:       s.masqueradeBit,
		RandomFully:         p.k.IPTables.Info().RandomFully,
		ConntrackTCPLiberal: liberal,
	}
	switch s.localDetect {
	case vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_BRIDGE_INTERFACE:
		in.LocalInterface = s.localInterface
	case vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_INTERFACE_NAME_PREFIX:
		in.LocalInterface = s.localInterface + "+"
	default:
		cidrs := s.clusterCIDRs
		if s.localDetect == vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_NODE_CIDR {
			cidrs = s.nodePodCIDRs
		}
		for _, c := range cidrs {
			if kernel.FamilyOf(c.Addr()) == fam {
				in.ClusterCIDRs = append(in.ClusterCIDRs, c)
			}
		}
		for _, c := range s.nodePodCIDRs {
			if kernel.FamilyOf(c.Addr()) == fam {
				in.NodePodCIDRs = append(in.NodePodCIDRs, c)
			}
		}
	}
	for ref := range p.desired.setRefs {
		if ref.family == fam {
			in.NonEmpty = in.NonEmpty.With(ref.set)
		}
	}
	// Only the resources with loadBalancerSourceRanges are read (the
	// SOURCE-IP entries that matter sit beside their FW entries).
	var fw, sourceIP []kernel.Entry
	for name := range p.desired.firewalled {
		for _, ek := range p.desired.res[name].entries {
			switch {
			case ek.set.family != fam, !p.admission.admitted(ek, p.desired.entryRefs[ek]):
			case ek.set.set == rules.SetLoadBalancerFW:
				fw = append(fw, ek.entry)
			case ek.set.set == rules.SetLoadBalancerSourceIP:
				sourceIP = append(sourceIP, ek.entry)
			}
		}
	}
	in.LoadBalancerNoNodeAccess = rules.NoNodeAccess(fw, sourceIP)
	if masqFor(s.masqueradeBit) != 0 {
		in.InClusterMarks = p.desired.inClusterMarksOf(fam)
	}
	return in
}

// syncIPTables renders the rules of each family and, when the rendering
// changed since the last successful apply (or verify is set, or nothing
// was applied yet in this process), compares them with iptables-save and
// applies one iptables-restore --noflush if anything differs. Errors are
// blamed on names (nil: no resource).
func (p *pass) syncIPTables(verify bool, names []string) {
	liberal := false
	if v, err := p.k.Sysctl.Get(kernel.SysctlConntrackTCPBeLiberal); err == nil {
		liberal = v != 0
	}
	for _, fam := range p.families {
		rendered, full, err := p.rendered.render(p.rulesInput(fam, liberal))
		if err != nil {
			p.fail(names, "render iptables rules", err)
			continue
		}
		same := bytes.Equal(full, p.known.rules[fam])
		if same && (!verify || p.rulesUnchanged(fam, rendered.TableNames())) {
			continue
		}
		delete(p.known.rules, fam)
		delete(p.known.rulesPrint, fam)
		before, printed := fingerprint(p.k.IPTables, fam, rendered.TableNames())
		dumps, err := p.saveTables(fam, rendered.TableNames())
		if err != nil {
			p.fail(names, fmt.Sprintf("iptables-save (%v)", fam), err)
			continue
		}
		missing, differ := rendered.Check(dumps)
		if !differ && len(missing) == 0 && printed {
			p.known.rulesPrint[fam] = rulesPrint{value: before}
		}
		if differ || len(missing) > 0 {
			payload := rendered.Payload(missing)
			// Last line of defence: only our chains and the fixed jumps.
			if err := rules.CheckPayload(payload); err != nil {
				p.fail(names, fmt.Sprintf("iptables payload (%v) refused", fam), err)
				continue
			}
			p.count(wire.OpRestore)
			if err := p.k.IPTables.Restore(p.ctx, fam, payload); err != nil {
				if p.restoreFailures == nil {
					p.restoreFailures = map[kernel.Family]uint32{}
				}
				p.restoreFailures[fam]++
				p.fail(names, fmt.Sprintf("iptables-restore (%v)", fam), err)
				continue
			}
			// Read right after the restore: a change by someone else in
			// between would go unseen until the next forced compare
			// (maxPrintSkips), a window of one syscall.
			if after, ok := fingerprint(p.k.IPTables, fam, rendered.TableNames()); ok {
				p.known.rulesPrint[fam] = rulesPrint{value: after}
			}
		}
		p.known.rules[fam] = full
	}
}

// maxPrintSkips bounds how many full passes in a row trust an unchanged
// fingerprint instead of reading the tables (a save every 10 passes, 5 min
// at the default period, whatever the fingerprint says).
const maxPrintSkips = 9

// rulesPrint is a family's tables' fingerprint after a compare that found
// them right, and how many full passes trusted it since.
type rulesPrint struct {
	value uint64
	skips int
}

// rulesUnchanged reports whether fam's tables still have the fingerprint
// of the last compare that found them right (and counts the skip).
func (p *pass) rulesUnchanged(fam kernel.Family, tables []kernel.Table) bool {
	known, ok := p.known.rulesPrint[fam]
	if !ok || known.skips >= maxPrintSkips {
		return false
	}
	if cur, ok := fingerprint(p.k.IPTables, fam, tables); !ok || cur != known.value {
		return false
	}
	known.skips++
	p.known.rulesPrint[fam] = known
	return true
}

// fingerprint combines the fingerprints of fam's tables; false when the
// IPTables has none or one cannot be read.
func fingerprint(ipt kernel.IPTables, fam kernel.Family, tables []kernel.Table) (uint64, bool) {
	fp, ok := ipt.(kernel.IPTablesFingerprinter)
	if !ok || len(tables) == 0 {
		return 0, false
	}
	v, err := fp.Fingerprint(fam, tables...)
	return v, err == nil
}

// saveTables reads the tables of fam with iptables-save; it stops at the
// first error.
func (p *pass) saveTables(fam kernel.Family, tables []kernel.Table) ([]kernel.TableDump, error) {
	var dumps []kernel.TableDump
	for _, t := range tables {
		b, err := p.k.IPTables.Save(p.ctx, fam, t)
		if err != nil {
			return nil, err
		}
		d, err := kernel.ParseSave(b)
		if err != nil {
			return nil, err
		}
		dumps = append(dumps, d...)
	}
	return dumps, nil
}

// renderMemo keeps, per family, the last rules.Input rendered with its
// Ruleset and full payload. The rules depend on a few node-wide facts (the
// settings, which sets are non-empty, the firewalled load balancers), not
// on the Services' endpoints, so most Applies ask for the same rendering
// again: rendering and formatting the payload was about a third of the cost
// of applying a one-endpoint change. rules.Render is pure, so an equal Input
// yields an equal Ruleset. The cached values are never modified.
type renderMemo map[kernel.Family]renderedRules

type renderedRules struct {
	in   rules.Input
	rs   rules.Ruleset
	full []byte // rs.Payload(rs.Jumps)
}

// render returns rules.Render(in) and its payload with every jump, from
// the memo when in equals the Input rendered last for its family. Errors
// are not remembered.
func (m renderMemo) render(in rules.Input) (rules.Ruleset, []byte, error) {
	if last, ok := m[in.Family]; ok && sameRulesInput(last.in, in) {
		return last.rs, last.full, nil
	}
	rs, err := rules.Render(in)
	if err != nil {
		delete(m, in.Family)
		return rules.Ruleset{}, nil, err
	}
	full := rs.Payload(rs.Jumps)
	in.LoadBalancerNoNodeAccess = slices.Clone(in.LoadBalancerNoNodeAccess)
	in.InClusterMarks = slices.Clone(in.InClusterMarks)
	m[in.Family] = renderedRules{in: in, rs: rs, full: full}
	return rs, full, nil
}

// sameRulesInput reports whether a and b render the same rules: every
// field equal, the load-balancer list in the same order (a different
// order, which does not matter to Render, only renders again).
// TestSameRulesInputComparesEveryField fails when rules.Input gains a
// field this does not compare.
func sameRulesInput(a, b rules.Input) bool {
	return a.Family == b.Family && a.MasqueradeAll == b.MasqueradeAll && a.MasqueradeBit == b.MasqueradeBit &&
		slices.Equal(a.ClusterCIDRs, b.ClusterCIDRs) && a.RandomFully == b.RandomFully &&
		a.ConntrackTCPLiberal == b.ConntrackTCPLiberal && a.NonEmpty == b.NonEmpty && a.LocalInterface == b.LocalInterface &&
		slices.Equal(a.NodePodCIDRs, b.NodePodCIDRs) &&
		slices.Equal(a.LoadBalancerNoNodeAccess, b.LoadBalancerNoNodeAccess) && slices.Equal(a.InClusterMarks, b.InClusterMarks)
}
