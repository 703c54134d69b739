package reconcile

import (
	"net/netip"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// knownKernel is what the reconciler knows the kernel holds without
// asking it again.
//
// The listings (bound, dummyGone, sets, setEntries) are the state it could
// otherwise only learn by listing a whole table: the addresses on
// kube-ipvs0, the managed sets and their entries. A full pass reloads them
// from the kernel; incremental passes read and update them instead of
// listing, so an Apply costs O(what changed), not O(Services). Between
// full passes they can miss outside drift (repaired by the next full
// pass); they never cause harm the other way because binds, ipset adds
// and all deletes are idempotent. nil maps are unknown and read on first
// use; a pass with any kernel error invalidates them (recordOutcomes).
//
// programmed and rules are kept for the life of the process.
type knownKernel struct {
	bound      map[netip.Addr]bool // on kube-ipvs0
	dummyGone  bool
	sets       map[string]kernel.IPSet
	setEntries map[string]map[kernel.Entry]bool // by set name

	// programmed are the virtual servers this process programmed: the
	// agent's to delete even when no resource wants them any more.
	programmed map[kernel.VirtualServerKey]struct{}
	// rules is, per family, the iptables rendering last applied (or found
	// in place); an unchanged rendering is not compared again.
	rules map[kernel.Family][]byte
	// rulesPrint is, per family, the tables' fingerprint when a compare
	// last found them right (iptables.go); absent: compare again.
	rulesPrint map[kernel.Family]rulesPrint
}

func newKnownKernel() knownKernel {
	return knownKernel{setEntries: map[string]map[kernel.Entry]bool{},
		programmed: map[kernel.VirtualServerKey]struct{}{}, rules: map[kernel.Family][]byte{},
		rulesPrint: map[kernel.Family]rulesPrint{}}
}

// invalidate drops the listings: the next pass lists again.
func (k *knownKernel) invalidate() {
	k.bound, k.dummyGone, k.sets = nil, false, nil
	k.setEntries = map[string]map[kernel.Entry]bool{}
}
