package reconcile

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// familySet is the address families the agent manages.
type familySet []kernel.Family

func (f familySet) has(x kernel.Family) bool { return slices.Contains(f, x) }

// store holds every desired resource plus the indexes that turn "which
// resources want X" into O(1) lookups: a virtual server, an address or an
// ipset entry is wanted while at least one resource wants it.
type store struct {
	res       map[string]*resourceState
	vsOwners  map[kernel.VirtualServerKey][]string // sorted resource names
	addrVS    map[netip.Addr]vsCounts
	entryRefs map[entryKey][]string
	setRefs   map[setRef]int // entries per set (for "non-empty")
	// setSize is the number of distinct entries wanted per set.
	setSize map[setRef]int
	// templated are the resources with node_port_addresses markers,
	// checks those with a health-check node port, firewalled those with
	// loadBalancerSourceRanges (KUBE-LOAD-BALANCER-FW entries), inCluster
	// those with in-cluster marks (incluster.go).
	templated, checks, firewalled, inCluster map[string]bool
}

func newStore() *store {
	return &store{
		res:        map[string]*resourceState{},
		vsOwners:   map[kernel.VirtualServerKey][]string{},
		addrVS:     map[netip.Addr]vsCounts{},
		entryRefs:  map[entryKey][]string{},
		setRefs:    map[setRef]int{},
		setSize:    map[setRef]int{},
		templated:  map[string]bool{},
		checks:     map[string]bool{},
		firewalled: map[string]bool{},
		inCluster:  map[string]bool{},
	}
}

// put replaces (or, with rs nil, removes) the resource name and returns the
// previous state.
func (s *store) put(name string, rs *resourceState) *resourceState {
	old := s.res[name]
	if old != nil && rs != nil && sameIndexing(old, rs) {
		// The indexes hold names, and rs puts the same ones under the same
		// keys (an endpoint change): only the state itself is replaced.
		s.res[name] = rs
		return old
	}
	if old != nil {
		s.unindex(old)
		delete(s.res, name)
	}
	if rs != nil {
		s.res[name] = rs
		s.index(rs)
	}
	return old
}

func (s *store) index(rs *resourceState) {
	for _, d := range rs.vss {
		key := d.vs.Key
		owners := s.vsOwners[key]
		i, _ := slices.BinarySearch(owners, rs.name)
		s.vsOwners[key] = slices.Insert(owners, i, rs.name)
		if d.inClusterMark != 0 {
			s.inCluster[rs.name] = true
		}
		if key.FWMark != 0 {
			continue // no address
		}
		s.addrVS[key.Address] = s.addrVS[key.Address].add(key)
	}
	for _, e := range rs.entries {
		if len(s.entryRefs[e]) == 0 {
			s.setSize[e.set]++
		}
		s.entryRefs[e] = append(s.entryRefs[e], rs.name)
		s.setRefs[e.set]++
		if e.set.set == rules.SetLoadBalancerFW {
			s.firewalled[rs.name] = true
		}
	}
	if rs.tmpl != nil {
		s.templated[rs.name] = true
	}
	if rs.health != nil {
		s.checks[rs.name] = true
	}
}

// sameIndexing reports whether a and b (one resource's old and new state)
// index alike: the same virtual server keys, the same entries, and a
// template and a health check both or neither, as index reads them. The
// order of an entry's owners in entryRefs can differ from what unindex and
// index would leave; no reader depends on it (they sort or test membership).
func sameIndexing(a, b *resourceState) bool {
	if a.name != b.name || len(a.vss) != len(b.vss) || (a.tmpl == nil) != (b.tmpl == nil) ||
		(a.health == nil) != (b.health == nil) || !slices.Equal(a.entries, b.entries) {
		return false
	}
	for i := range a.vss { // both sorted by key
		if a.vss[i].vs.Key != b.vss[i].vs.Key {
			return false
		}
	}
	return true
}

func (s *store) unindex(rs *resourceState) {
	for _, d := range rs.vss {
		key := d.vs.Key
		owners := slices.DeleteFunc(s.vsOwners[key], func(n string) bool { return n == rs.name })
		if len(owners) == 0 {
			delete(s.vsOwners, key)
		} else {
			s.vsOwners[key] = owners
		}
		if key.FWMark != 0 {
			continue
		}
		if m := s.addrVS[key.Address].remove(key); len(m) > 0 {
			s.addrVS[key.Address] = m
		} else {
			delete(s.addrVS, key.Address)
		}
	}
	for _, e := range rs.entries {
		owners := slices.DeleteFunc(s.entryRefs[e], func(n string) bool { return n == rs.name })
		if len(owners) == 0 {
			delete(s.entryRefs, e)
			if s.setSize[e.set]--; s.setSize[e.set] <= 0 {
				delete(s.setSize, e.set)
			}
		} else {
			s.entryRefs[e] = owners
		}
		if s.setRefs[e.set]--; s.setRefs[e.set] <= 0 {
			delete(s.setRefs, e.set)
		}
	}
	delete(s.templated, rs.name)
	delete(s.checks, rs.name)
	delete(s.firewalled, rs.name)
	delete(s.inCluster, rs.name)
}

// wantVS returns the desired virtual server for key. When several
// resources want the same key, an explicit virtual server wins over one
// expanded from a NodePort marker, then the first resource by name
// (deterministic).
func (s *store) wantVS(key kernel.VirtualServerKey) (desiredVS, bool) {
	w := s.winner(key)
	if w == "" {
		return desiredVS{}, false
	}
	return s.res[w].vss.get(key)
}

// winner is the resource whose virtual server key is programmed ("" when
// nobody wants it).
func (s *store) winner(key kernel.VirtualServerKey) string {
	owners := s.vsOwners[key]
	if len(owners) == 0 {
		return ""
	}
	if len(owners) > 1 {
		for _, o := range owners {
			if d, _ := s.res[o].vss.get(key); !d.nodePort {
				return o
			}
		}
	}
	return owners[0]
}

// bindings reports which bindings the virtual servers on addr ask for.
func (s *store) bindings(addr netip.Addr) (always, unlessLocal bool) {
	for _, c := range s.addrVS[addr] {
		d, _ := s.wantVS(c.key)
		switch d.binding {
		case vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS:
			always = true
		case vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL:
			unlessLocal = true
		}
	}
	return always, unlessLocal
}

// settings returns the effective node settings.
func (s *store) settings() settings {
	if rs := s.res[SettingsResource]; rs != nil && rs.settings != nil {
		return *rs.settings
	}
	return defaultSettings()
}

// vsCounts counts, per virtual server key on one address, the resources
// that want it. An address has a few keys (a port or two per Service), so
// a slice: a map per address cost 4 MB of the agent's 34 at 10k Services.
type vsCounts []vsCount

type vsCount struct {
	key kernel.VirtualServerKey
	n   int
}

// add counts one more resource wanting key.
func (c vsCounts) add(key kernel.VirtualServerKey) vsCounts {
	for i := range c {
		if c[i].key == key {
			c[i].n++
			return c
		}
	}
	return append(c, vsCount{key, 1})
}

// remove counts one resource fewer wanting key, dropping it at zero.
func (c vsCounts) remove(key kernel.VirtualServerKey) vsCounts {
	for i := range c {
		if c[i].key == key {
			if c[i].n--; c[i].n <= 0 {
				return slices.Delete(c, i, i+1)
			}
			return c
		}
	}
	return c
}

func appendOnce(list []string, name string) []string {
	if slices.Contains(list, name) {
		return list
	}
	return append(list, name)
}

type netipAddr = netip.Addr

func sortedKeys[K comparable, V any](m map[K]V, cmp func(a, b K) int) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, cmp)
	return out
}

func compareEntryKeys(a, b entryKey) int {
	if c := strings.Compare(a.set.name(), b.set.name()); c != 0 {
		return c
	}
	x, y := a.entry, b.entry
	return cmp.Or(x.IP.Compare(y.IP), cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port),
		x.IP2.Compare(y.IP2), x.Net.Addr().Compare(y.Net.Addr()), cmp.Compare(x.Net.Bits(), y.Net.Bits()))
}
