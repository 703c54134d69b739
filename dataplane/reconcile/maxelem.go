package reconcile

import (
	"fmt"
	"maps"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// ipset capacity. A hash set holds at most maxelem entries (65536, as
// kube-proxy creates them); the kernel refuses the next add ("Hash is
// full"). Rather than let the kernel pick whichever entry comes last, the
// agent decides which resources fit: when the union of the entries wanted
// in a set exceeds maxelem, resources are admitted whole in name order
// (first fit) and the entries of the others are not programmed; those
// resources are NACKed with the reason. Every node decides the same way,
// and nothing changes while the set has room.

// setAdmission is, per full set, the resources whose entries of it are
// not programmed.
type setAdmission struct {
	refused map[setRef]map[string]bool
	maxElem uint32 // Config.maxElem: overrides the hash sets' maxelem (tests)
}

// limit is the maxelem the admission uses for ref (0: no limit, bitmap).
func (a *setAdmission) limit(ref setRef) int {
	if ref.set.Type() == kernel.BitmapPort {
		return 0 // a port bitmap holds its whole range
	}
	if a.maxElem != 0 {
		return int(a.maxElem)
	}
	return int(ref.spec().MaxElem)
}

// update recomputes which resources are refused in the sets of refs (nil:
// every set over its limit or with refusals) and returns, per set, the
// resources whose admission changed.
func (a *setAdmission) update(desired *store, refs map[setRef]bool) map[setRef][]string {
	if refs == nil {
		refs = map[setRef]bool{}
		for ref, n := range desired.setSize {
			if l := a.limit(ref); l > 0 && n > l {
				refs[ref] = true
			}
		}
	}
	for ref := range a.refused {
		refs[ref] = true
	}
	changed := map[setRef][]string{}
	for ref := range refs {
		old := a.refused[ref]
		cur := a.refusedIn(desired, ref)
		if len(cur) == 0 {
			delete(a.refused, ref)
		} else {
			a.refused[ref] = cur
		}
		for name := range old {
			if !cur[name] {
				changed[ref] = append(changed[ref], name)
			}
		}
		for name := range cur {
			if !old[name] {
				changed[ref] = append(changed[ref], name)
			}
		}
	}
	return changed
}

// refusedIn returns the resources refused in ref: none while the wanted
// entries fit; otherwise first fit in name order, whole resources.
func (a *setAdmission) refusedIn(desired *store, ref setRef) map[string]bool {
	l := a.limit(ref)
	if l == 0 || desired.setSize[ref] <= l {
		return nil
	}
	byName := map[string][]kernel.Entry{}
	for ek, owners := range desired.entryRefs {
		if ek.set == ref {
			for _, o := range owners {
				byName[o] = append(byName[o], ek.entry)
			}
		}
	}
	in := make(map[kernel.Entry]bool, l)
	refused := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		var add []kernel.Entry
		for _, e := range byName[name] {
			if !in[e] {
				add = append(add, e)
			}
		}
		if len(in)+len(add) > l {
			refused[name] = true
			continue
		}
		for _, e := range add {
			in[e] = true
		}
	}
	return refused
}

// touchAdmissionChanges touches the entries of resources whose admission
// changed (update's result) and returns those resources.
func (t *touched) touchAdmissionChanges(desired *store, changed map[setRef][]string) (names []string) {
	for ref, list := range changed {
		for _, name := range list {
			rs := desired.res[name]
			if rs == nil {
				continue
			}
			for _, e := range rs.entries {
				if e.set == ref {
					t.entries[e] = appendOnce(t.entries[e], name)
				}
			}
			names = appendOnce(names, name)
		}
	}
	return names
}

// problems are the capacity problems of rs.
func (a *setAdmission) problems(desired *store, rs *resourceState) []string {
	var out []string
	for _, ref := range sortedKeys(a.refused, func(a, b setRef) int { return compareEntryKeys(entryKey{set: a}, entryKey{set: b}) }) {
		if !a.refused[ref][rs.name] {
			continue
		}
		n := 0
		for _, e := range rs.entries {
			if e.set == ref {
				n++
			}
		}
		out = append(out, fmt.Sprintf("ipset %s is full: maxelem %d, %d distinct entries wanted by all Services; the %d entries of this Service are not programmed (resources are admitted whole, in name order)",
			ref.name(), a.limit(ref), desired.setSize[ref], n))
	}
	return out
}

// admitted: some owner of ek is admitted in its set.
func (a *setAdmission) admitted(ek entryKey, owners []string) bool {
	refused := a.refused[ek.set]
	if len(refused) == 0 {
		return len(owners) > 0
	}
	return slices.ContainsFunc(owners, func(o string) bool { return !refused[o] })
}
