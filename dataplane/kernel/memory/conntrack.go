package memory

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// conntrackKey identifies an entry like the kernel's hash does: by its
// original tuple.
type conntrackKey struct {
	proto kernel.Protocol
	orig  kernel.ConntrackTuple
}

// Conntrack is the kernel.Conntrack view of a memory Kernel.
type Conntrack Kernel

var _ kernel.Conntrack = (*Conntrack)(nil)

func (m *Conntrack) k() *Kernel { return (*Kernel)(m) }

// AddConntrackEntry adds e as traffic would; an entry with the same
// protocol and original tuple: ErrExist.
func (k *Kernel) AddConntrackEntry(e kernel.ConntrackEntry) error {
	if err := e.Validate(); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	key := conntrackKey{e.Protocol, e.Orig}
	if _, ok := k.conntrack[key]; ok {
		return fmt.Errorf("conntrack entry %+v: %w", e, kernel.ErrExist)
	}
	k.conntrack[key] = e
	return nil
}

// ConntrackEntries returns every entry, sorted.
func (k *Kernel) ConntrackEntries() []kernel.ConntrackEntry {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]kernel.ConntrackEntry, 0, len(k.conntrack))
	for _, e := range k.conntrack {
		out = append(out, e)
	}
	slices.SortFunc(out, compareConntrack)
	return out
}

func compareConntrack(a, b kernel.ConntrackEntry) int {
	c := cmp.Compare(a.Protocol, b.Protocol)
	for _, p := range [][2]netip.AddrPort{{a.Orig.Src, b.Orig.Src}, {a.Orig.Dst, b.Orig.Dst}, {a.Reply.Src, b.Reply.Src}, {a.Reply.Dst, b.Reply.Dst}} {
		if c != 0 {
			break
		}
		c = p[0].Compare(p[1])
	}
	return c
}

// Add and List make *Conntrack a contract.ConntrackSeeder.
func (m *Conntrack) Add(e kernel.ConntrackEntry) error { return m.k().AddConntrackEntry(e) }

func (m *Conntrack) List(family kernel.Family, proto kernel.Protocol) ([]kernel.ConntrackEntry, error) {
	if !family.Valid() || !proto.Valid() {
		return nil, fmt.Errorf("list conntrack %s %s: %w", family, proto, kernel.ErrInvalid)
	}
	all := m.k().ConntrackEntries()
	return slices.DeleteFunc(all, func(e kernel.ConntrackEntry) bool {
		return e.Family() != family || e.Protocol != proto
	}), nil
}

// DeleteEntries calls stale without holding the lock, as the kernel's dump
// does not stop traffic: entries removed meanwhile are skipped, not counted.
// The fault hook sees "conntrack.DeleteEntries"; Calls counts only the
// writes, "conntrack.DeleteEntry" per deleted entry (the dump is a read).
func (m *Conntrack) DeleteEntries(family kernel.Family, proto kernel.Protocol, stale func(kernel.ConntrackEntry) bool) (int, error) {
	if err := kernel.CheckConntrackDelete(family, proto, stale); err != nil {
		return 0, err
	}
	k := m.k()
	k.mu.Lock()
	if k.fault != nil {
		if err := k.fault("conntrack.DeleteEntries"); err != nil {
			k.mu.Unlock()
			return 0, err
		}
	}
	var dump []kernel.ConntrackEntry
	for _, e := range k.conntrack {
		if e.Family() == family && e.Protocol == proto {
			dump = append(dump, e)
		}
	}
	k.mu.Unlock()
	var doomed []kernel.ConntrackEntry
	for _, e := range dump {
		if stale(e) {
			doomed = append(doomed, e)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, e := range doomed {
		key := conntrackKey{e.Protocol, e.Orig}
		if _, ok := k.conntrack[key]; ok {
			delete(k.conntrack, key)
			k.calls["conntrack.DeleteEntry"]++
			n++
		}
	}
	return n, nil
}
