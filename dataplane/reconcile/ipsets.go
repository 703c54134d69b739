package reconcile

import (
	"fmt"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	"github.com/vsplane/vsplane/internal/wire"
)

// ipsets and their entries. The managed sets (kube-proxy's, per family;
// rules.AllSets) are entirely the agent's.
//
//   - Sets (ensureSets): a missing set is created; one that exists with
//     another type, family or maxelem is an error blamed on the set's
//     users, never destroyed or flushed.
//   - Update (syncEntry, entry wanted): added when known.setEntries says it
//     is missing. Wanted means some owner is admitted in the set
//     (maxelem.go), or, for a KUBE-IPVS-IPS address, that the address is
//     to be bound (addresses.go).
//   - Delete (syncEntry, entry not wanted): deleted when present.
//   - Prune (full pass, syncAllEntries): every wanted entry and every
//     entry the managed sets hold (listed).
//   - Status: a failure is blamed on the entry's owners and the changed
//     resources that touched it; known.setEntries changes only on success.
//
// Entry writes are queued (queue.go), deletions before additions so a
// nearly full set has room.

// managedSets are the sets the agent owns entirely (kube-proxy's, per
// family): entries no resource wants are deleted.
func (f familySet) managedSets() []setRef {
	var out []setRef
	for _, fam := range f {
		for _, s := range rules.AllSets() {
			out = append(out, setRef{s, fam})
		}
	}
	return out
}

// ensureSets creates the missing sets; existing ones are left alone.
func (p *pass) ensureSets() {
	known := p.known
	if known.sets == nil {
		list, err := p.k.IPSets.ListSets()
		if err != nil {
			p.fail(nil, "list ipsets", err)
			return
		}
		known.sets = make(map[string]kernel.IPSet, len(list))
		for _, s := range list {
			known.sets[s.Name] = s
		}
	}
	for _, ref := range p.families.managedSets() {
		spec := ref.spec()
		cur, ok := known.sets[spec.Name]
		switch {
		case ok && cur.SameAs(spec):
		case ok:
			p.fail(p.setUsers(ref), "ipset "+spec.Name, fmt.Errorf("exists as %s %v maxelem %d, want %s %v: %w",
				cur.Type, cur.Family, cur.MaxElem, spec.Type, spec.Family, kernel.ErrExist))
		default:
			p.count(wire.OpCreateSet)
			if err := p.k.IPSets.CreateSet(spec); err != nil {
				p.fail(p.setUsers(ref), "create ipset "+spec.Name, err)
				continue
			}
			known.sets[spec.Name] = spec.Normalize()
			known.setEntries[spec.Name] = map[kernel.Entry]bool{}
		}
	}
}

// setUsers are the resources with an entry in ref, sorted.
func (p *pass) setUsers(ref setRef) []string {
	var out []string
	for ek, owners := range p.desired.entryRefs {
		if ek.set == ref {
			for _, o := range owners {
				out = appendOnce(out, o)
			}
		}
	}
	slices.Sort(out)
	return out
}

// loadEntries returns the entries of ref, listing the set unless they are
// known.
func (p *pass) loadEntries(ref setRef) (map[kernel.Entry]bool, error) {
	name := ref.name()
	if m, ok := p.known.setEntries[name]; ok {
		return m, nil
	}
	list, err := p.k.IPSets.ListEntries(name)
	if err != nil {
		return nil, err
	}
	m := make(map[kernel.Entry]bool, len(list))
	for _, e := range list {
		e.Comment = ""
		m[e.Normalize()] = true
	}
	p.known.setEntries[name] = m
	return m, nil
}

func (p *pass) wantEntry(ek entryKey) (bool, error) {
	if p.admission.admitted(ek, p.desired.entryRefs[ek]) {
		return true, nil
	}
	if ek.set.set == rules.SetIPVSIPs && ek.entry == (kernel.Entry{IP: ek.entry.IP}) {
		return p.bindWanted(ek.entry.IP)
	}
	return false, nil
}

// syncEntries syncs the entries, deletions first so a nearly full set
// has room for the additions.
func (p *pass) syncEntries(entries map[entryKey][]string) {
	var plan entryPlan
	for ek := range entries {
		plan.consider(p, ek)
	}
	plan.sync(p, func(ek entryKey) []string { return entries[ek] })
}

// syncAllEntries syncs every entry a full pass compares: wanted, or held by
// a managed set. A set that cannot be listed is reported against its users.
// It walks the wanted entries and then the sets' without building their
// union (a map of ~6,000 keys per pass at 1k Services).
func (p *pass) syncAllEntries() {
	var plan entryPlan
	for ek := range p.desired.entryRefs {
		plan.consider(p, ek)
	}
	for _, ref := range p.families.managedSets() {
		have, err := p.loadEntries(ref)
		if err != nil {
			p.fail(p.setUsers(ref), "list ipset "+ref.name(), err)
			continue
		}
		for e := range have {
			ek := entryKey{set: ref, entry: e}
			if _, wanted := p.desired.entryRefs[ek]; !wanted {
				plan.consider(p, ek)
			}
		}
	}
	plan.sync(p, func(entryKey) []string { return nil })
}

// entryPlan is the entries a sync writes (or whose check fails, which
// syncEntry reports), split into those to delete and to add. Only these
// are sorted, for a deterministic write order: in a full pass nearly every
// entry is right, and sorting all of them was a tenth of an unchanged
// pass's CPU at 1k Services.
type entryPlan struct{ unwanted, wanted []entryKey }

func (e *entryPlan) consider(p *pass, ek entryKey) {
	want, wantErr := p.wantEntry(ek)
	have, listErr := p.loadEntries(ek.set)
	if wantErr == nil && listErr == nil && want == have[ek.entry] {
		return // right: syncEntry would write nothing
	}
	if want {
		e.wanted = append(e.wanted, ek)
	} else {
		e.unwanted = append(e.unwanted, ek)
	}
}

// sync deletes, then adds; touchers are each entry's changed resources.
func (e *entryPlan) sync(p *pass, touchers func(entryKey) []string) {
	for _, group := range [][]entryKey{e.unwanted, e.wanted} {
		slices.SortFunc(group, compareEntryKeys)
		for _, ek := range group {
			p.syncEntry(ek, touchers(ek))
		}
	}
}

// syncEntry adds or deletes one entry as the desired state wants it;
// touchers are the changed resources that touched it.
func (p *pass) syncEntry(ek entryKey, touchers []string) {
	names := ownersToBlame(p.desired.entryRefs[ek], touchers)
	have, err := p.loadEntries(ek.set)
	if err != nil {
		p.fail(names, "list ipset "+ek.set.name(), err)
		return
	}
	want, err := p.wantEntry(ek)
	if err != nil {
		p.fail(names, "list local addresses", err)
		return
	}
	spec := ek.set.spec()
	switch {
	case want && !have[ek.entry]:
		p.count(wire.OpAddEntry)
		p.queueEntry(kernel.EntryOp{Kind: kernel.AddEntry, Set: spec, Entry: ek.entry}, func(err error) {
			if err != nil {
				p.fail(names, "ipset add "+ek.String(), err)
				return
			}
			have[ek.entry] = true
		})
	case !want && have[ek.entry]:
		p.count(wire.OpDelEntry)
		p.queueEntry(kernel.EntryOp{Kind: kernel.DelEntry, Set: spec, Entry: ek.entry}, func(err error) {
			if err != nil {
				p.fail(names, "ipset del "+ek.String(), err)
				return
			}
			delete(have, ek.entry)
		})
	}
}
