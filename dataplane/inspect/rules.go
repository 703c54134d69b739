package inspect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// compareIPSets lists every managed set's entries against the desired
// ones. Entries in sync are counted; missing and extra ones are listed,
// spelled as `ipset list` prints them.
func (s *Server) compareIPSets(resp *vsplanev1.GetKernelStateResponse, desired []reconcile.DesiredSet, heldElsewhere func(netip.Addr) bool) {
	held := map[string]kernel.IPSet{}
	listed, err := s.k.IPSets.ListSets()
	if err != nil {
		resp.ReadErrors = append(resp.ReadErrors, fmt.Sprintf("list ipsets: %v", err))
	}
	for _, set := range listed {
		held[set.Name] = set
	}
	for _, d := range desired {
		spec := d.Set
		out := &vsplanev1.IPSetState{Name: spec.Name, Type: string(spec.Type)}
		resp.Ipsets = append(resp.Ipsets, out)
		want := make(map[kernel.Entry]bool, len(d.Entries))
		for _, e := range d.Entries {
			if e.UnlessLocal && heldElsewhere(e.Entry.IP) {
				continue
			}
			want[e.Entry.Normalize()] = true
		}
		cur, exists := held[spec.Name]
		if err == nil && !exists {
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL
			out.MissingEntries = spellEntries(want, spec.Type)
			resp.Differences += 1 + uint32(len(out.MissingEntries))
			continue
		}
		if exists && !cur.SameAs(spec) {
			out.HeaderDiffers = fmt.Sprintf("exists as %s %v maxelem %d, the agent creates %s %v maxelem %d",
				cur.Type, cur.Family, cur.Normalize().MaxElem, spec.Type, spec.Family, spec.MaxElem)
			resp.Differences++
		}
		entries, lerr := s.k.IPSets.ListEntries(spec.Name)
		switch {
		case errors.Is(lerr, kernel.ErrNotFound): // removed since ListSets (or ListSets failed)
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL
			out.MissingEntries = spellEntries(want, spec.Type)
			resp.Differences += 1 + uint32(len(out.MissingEntries))
			continue
		case lerr != nil:
			resp.ReadErrors = append(resp.ReadErrors, fmt.Sprintf("list ipset %s: %v", spec.Name, lerr))
			continue
		}
		have := make(map[kernel.Entry]bool, len(entries))
		for _, e := range entries {
			e.Comment = ""
			have[e.Normalize()] = true
		}
		missing, extra := map[kernel.Entry]bool{}, map[kernel.Entry]bool{}
		for e := range want {
			if have[e] {
				out.EntriesInSync++
			} else {
				missing[e] = true
			}
		}
		for e := range have {
			if !want[e] {
				extra[e] = true
			}
		}
		out.MissingEntries, out.ExtraEntries = spellEntries(missing, spec.Type), spellEntries(extra, spec.Type)
		resp.Differences += uint32(len(missing) + len(extra))
		if out.HeaderDiffers != "" || len(missing)+len(extra) > 0 {
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS
		} else {
			out.Status = vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC
		}
	}
}

// spellEntries formats entries as `ipset list` prints them for type t,
// sorted by that spelling.
func spellEntries(entries map[kernel.Entry]bool, t kernel.SetType) []string {
	out := make([]string, 0, len(entries))
	for e := range entries {
		out = append(out, e.Format(t))
	}
	slices.Sort(out)
	if len(out) == 0 {
		return nil
	}
	return out
}

// compareRules compares each family's rendered rules with iptables-save:
// the agent's chains rule by rule (in order, as the reconciler does), the
// chains the rendering leaves out, and the jumps from built-in chains.
func (s *Server) compareRules(ctx context.Context, resp *vsplanev1.GetKernelStateResponse, rendered []rules.Ruleset) {
	for _, rs := range rendered {
		fam := rs.Family.String()
		saved := map[kernel.Table]kernel.TableDump{}
		for _, t := range rs.Tables {
			dump, err := s.saveTable(ctx, rs.Family, t.Table)
			if err != nil {
				resp.ReadErrors = append(resp.ReadErrors, fmt.Sprintf("iptables-save %s %s: %v", fam, t.Table, err))
				continue
			}
			saved[t.Table] = dump
			for _, c := range t.Chains {
				resp.Chains = append(resp.Chains, compareChain(resp, fam, t.Table, c, dump))
			}
			for _, name := range t.Absent {
				got, ok := dump.Chain(name)
				if !ok {
					continue
				}
				resp.Chains = append(resp.Chains, &vsplanev1.ChainState{
					Family: fam, Table: string(t.Table), Chain: name, Status: vsplanev1.ItemStatus_ITEM_STATUS_EXTRA_IN_KERNEL,
					KernelRules: uint32(len(got.Rules)), ExtraRules: slices.Clone(got.Rules),
				})
				resp.Differences++
			}
		}
		for _, j := range rs.Jumps {
			dump, ok := saved[j.Table]
			if !ok {
				continue // its table could not be read (listed in read_errors)
			}
			js := &vsplanev1.JumpState{Family: fam, Table: string(j.Table), Chain: j.From, Rule: j.Rule,
				Status: vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC}
			if got, ok := dump.Chain(j.From); !ok || !slices.Contains(got.Rules, j.Rule) {
				js.Status = vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL
				resp.Differences++
			}
			resp.Jumps = append(resp.Jumps, js)
		}
	}
}

// saveTable reads one table with iptables-save and parses it.
func (s *Server) saveTable(ctx context.Context, fam kernel.Family, t kernel.Table) (kernel.TableDump, error) {
	b, err := s.k.IPTables.Save(ctx, fam, t)
	if err != nil {
		return kernel.TableDump{}, err
	}
	dumps, err := kernel.ParseSave(b)
	if err != nil {
		return kernel.TableDump{}, err
	}
	for _, d := range dumps {
		if d.Table == t {
			return d, nil
		}
	}
	return kernel.TableDump{Table: t}, nil // an empty table: iptables-save prints nothing
}

// compareChain compares one rendered chain with the saved table. Rules
// missing or extra are listed as a multiset difference; a chain holding
// the same rules in another order DIFFERS with both lists empty.
func compareChain(resp *vsplanev1.GetKernelStateResponse, fam string, t kernel.Table, c rules.Chain, dump kernel.TableDump) *vsplanev1.ChainState {
	out := &vsplanev1.ChainState{Family: fam, Table: string(t), Chain: c.Name, DesiredRules: uint32(len(c.Rules))}
	got, ok := dump.Chain(c.Name)
	switch {
	case !ok:
		out.Status = vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL
		out.MissingRules = slices.Clone(c.Rules)
	case slices.Equal(got.Rules, c.Rules):
		out.Status = vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC
		out.KernelRules = uint32(len(got.Rules))
	default:
		out.Status = vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS
		out.KernelRules = uint32(len(got.Rules))
		out.MissingRules, out.ExtraRules = ruleDifference(c.Rules, got.Rules), ruleDifference(got.Rules, c.Rules)
	}
	if out.Status != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
		resp.Differences++
	}
	return out
}

// ruleDifference returns the rules of a not matched by one in b (each rule
// of b matches once), in a's order.
func ruleDifference(a, b []string) []string {
	left := map[string]int{}
	for _, r := range b {
		left[r]++
	}
	var out []string
	for _, r := range a {
		if left[r] > 0 {
			left[r]--
			continue
		}
		out = append(out, r)
	}
	return out
}
