// Package memory is an in-memory kernel.Kernel for unit tests and scale
// simulation. All subsystems share one lock, so it is goroutine-safe and
// cross-subsystem rules hold (an ipset referenced by an iptables rule cannot
// be destroyed; a rule cannot name a missing ipset).
//
// Beyond the kernel interfaces it offers test hooks: SetFault to make
// operations fail, Calls to count mutating operations, SetConnections to
// simulate IPVS connection counts, AddInterface to add node interfaces,
// AddConntrackEntry to seed connection-tracking entries.
package memory

import (
	"sort"
	"sync"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Kernel is the shared state of one simulated network namespace.
type Kernel struct {
	mu    sync.Mutex
	fault func(op string) error
	calls map[string]int

	ipvs     ipvsState
	sets     map[string]*set
	links    linkState
	iptables map[kernel.Family]map[kernel.Table]*table
	iptInfo  kernel.IPTablesInfo
	sysctls  map[string]int
	release  string
	// hashsize is the conntrack table's bucket count, hashsizeErr what
	// setting it returns.
	hashsize    int
	hashsizeErr error
	conntrack   map[conntrackKey]kernel.ConntrackEntry
	// watches receive removed addresses (watch.go).
	watches []*addrWatch
}

// New returns an empty simulated namespace: no virtual servers, no sets,
// no interfaces, empty iptables tables, default sysctls, kernel 6.1.0.
func New() *Kernel {
	k := &Kernel{
		calls:     map[string]int{},
		sets:      map[string]*set{},
		iptables:  map[kernel.Family]map[kernel.Table]*table{},
		iptInfo:   kernel.IPTablesInfo{Backend: kernel.BackendNFT, Version: "1.8.9", RandomFully: true},
		release:   "6.1.0-memory",
		conntrack: map[conntrackKey]kernel.ConntrackEntry{},
	}
	k.ipvs.init()
	k.links.init()
	k.sysctls = defaultSysctls()
	k.hashsize = defaultConntrackHashsize
	return k
}

// Kernel returns the interfaces backed by k.
func (k *Kernel) Kernel() kernel.Kernel {
	return kernel.Kernel{
		IPVS:      (*IPVS)(k),
		IPSets:    (*IPSets)(k),
		Links:     (*Links)(k),
		IPTables:  (*IPTables)(k),
		Sysctl:    (*Sysctl)(k),
		Conntrack: (*Conntrack)(k),
	}
}

// SetFault installs f, called with the operation name (e.g.
// "ipvs.AddVirtualServer", "ipset.AddEntry", "iptables.Restore") before
// every mutating operation; a non-nil result is returned instead of
// performing it. nil removes the hook.
func (k *Kernel) SetFault(f func(op string) error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fault = f
}

// Calls returns how many times each mutating operation was attempted
// (including failed ones), keyed like SetFault's op names.
func (k *Kernel) Calls() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]int, len(k.calls))
	for op, n := range k.calls {
		out[op] = n
	}
	return out
}

// ResetCalls zeroes the counters of Calls.
func (k *Kernel) ResetCalls() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = map[string]int{}
}

// begin locks k, counts op and runs the fault hook. The caller must
// defer k.mu.Unlock() when err is nil; on error k is already unlocked.
func (k *Kernel) begin(op string) error {
	k.mu.Lock()
	k.calls[op]++
	if k.fault != nil {
		if err := k.fault(op); err != nil {
			k.mu.Unlock()
			return err
		}
	}
	return nil
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	out := make([]string, 0, len(m))
	for name := range m {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}
