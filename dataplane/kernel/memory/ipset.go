package memory

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

type set struct {
	hdr     kernel.IPSet // normalized
	entries map[kernel.Entry]kernel.Entry
}

// IPSets is the kernel.IPSets view of a memory Kernel.
type IPSets Kernel

var _ kernel.IPSets = (*IPSets)(nil)

func (m *IPSets) k() *Kernel { return (*Kernel)(m) }

func (m *IPSets) CreateSet(s kernel.IPSet) error {
	if err := s.Validate(); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipset.CreateSet"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if old, ok := k.sets[s.Name]; ok {
		if old.hdr.SameAs(s) {
			return nil
		}
		return fmt.Errorf("create ipset %s: exists as %+v: %w", s.Name, old.hdr, kernel.ErrExist)
	}
	k.sets[s.Name] = &set{hdr: s.Normalize(), entries: map[kernel.Entry]kernel.Entry{}}
	return nil
}

// DestroySet destroys a set: for tests and the contract suite (the agent
// never destroys a set, kernel.IPSets has no such write). A missing set:
// ErrNotFound; one referenced by an iptables rule: ErrBusy.
func (m *IPSets) DestroySet(name string) error {
	if err := validSetName(name); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipset.DestroySet"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if _, ok := k.sets[name]; !ok {
		return fmt.Errorf("destroy ipset %s: %w", name, kernel.ErrNotFound)
	}
	if k.setReferenced(name) {
		return fmt.Errorf("destroy ipset %s: referenced by an iptables rule: %w", name, kernel.ErrBusy)
	}
	delete(k.sets, name)
	return nil
}

// FlushSet deletes every entry of a set, like DestroySet for tests (drift)
// and the contract suite only. A missing set: ErrNotFound.
func (m *IPSets) FlushSet(name string) error {
	if err := validSetName(name); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipset.FlushSet"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	s, ok := k.sets[name]
	if !ok {
		return fmt.Errorf("flush ipset %s: %w", name, kernel.ErrNotFound)
	}
	clear(s.entries)
	return nil
}

// lookup checks e against the caller's view of the set and the stored set.
func (k *Kernel) lookupSet(op string, want kernel.IPSet, e kernel.Entry) (*set, error) {
	s, ok := k.sets[want.Name]
	if !ok {
		return nil, fmt.Errorf("%s ipset %s: %w", op, want.Name, kernel.ErrNotFound)
	}
	if s.hdr.Type != want.Type || s.hdr.Family != want.Family {
		return nil, fmt.Errorf("%s ipset %s: set is %s/%v, caller assumed %s/%v: %w",
			op, want.Name, s.hdr.Type, s.hdr.Family, want.Type, want.Family, kernel.ErrInvalid)
	}
	if err := e.Validate(s.hdr); err != nil {
		return nil, err
	}
	return s, nil
}

func (m *IPSets) addEntry(want kernel.IPSet, e kernel.Entry) error {
	if err := e.Validate(want); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipset.AddEntry"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	s, err := k.lookupSet("add to", want, e)
	if err != nil {
		return err
	}
	e = e.Normalize()
	key := e
	key.Comment = ""
	if _, ok := s.entries[key]; !ok && s.hdr.Type != kernel.BitmapPort && uint32(len(s.entries)) >= s.hdr.MaxElem {
		return fmt.Errorf("add to ipset %s: set is full (maxelem %d)", s.hdr.Name, s.hdr.MaxElem)
	}
	s.entries[key] = e
	return nil
}

func (m *IPSets) delEntry(want kernel.IPSet, e kernel.Entry) error {
	e.Comment = ""
	if err := e.Validate(want); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipset.DelEntry"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	s, err := k.lookupSet("delete from", want, e)
	if err != nil {
		return err
	}
	delete(s.entries, e.Normalize())
	return nil
}

// ApplyEntries performs ops one by one (see kernel.IPSets.ApplyEntries), so
// fault hooks and call counters see every op ("ipset.AddEntry",
// "ipset.DelEntry").
func (m *IPSets) ApplyEntries(ops []kernel.EntryOp) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		switch op.Kind {
		case kernel.AddEntry:
			errs[i] = m.addEntry(op.Set, op.Entry)
		case kernel.DelEntry:
			errs[i] = m.delEntry(op.Set, op.Entry)
		default:
			errs[i] = op.Validate()
		}
	}
	return errs
}

func (m *IPSets) ListSets() ([]kernel.IPSet, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]kernel.IPSet, 0, len(k.sets))
	for _, name := range sortedKeys(k.sets) {
		out = append(out, k.sets[name].hdr)
	}
	return out, nil
}

func (m *IPSets) EntryCounts() (map[string]int, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]int, len(k.sets))
	for name, s := range k.sets {
		out[name] = len(s.entries)
	}
	return out, nil
}

func (m *IPSets) ListEntries(name string) ([]kernel.Entry, error) {
	if err := validSetName(name); err != nil {
		return nil, err
	}
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.sets[name]
	if !ok {
		return nil, fmt.Errorf("list ipset %s: %w", name, kernel.ErrNotFound)
	}
	out := make([]kernel.Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b kernel.Entry) int {
		return strings.Compare(a.Format(s.hdr.Type), b.Format(s.hdr.Type))
	})
	return out, nil
}

func validSetName(name string) error {
	if name == "" || len(name) > kernel.MaxSetNameLen {
		return fmt.Errorf("ipset name %q must be 1..%d bytes: %w", name, kernel.MaxSetNameLen, kernel.ErrInvalid)
	}
	return nil
}
