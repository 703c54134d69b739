package reconcile

import (
	"errors"
	"fmt"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// A pass queues its kernel writes and sends them in batches, because one
// netlink round trip per write made bursts slow: IPVS servers and
// destinations (kernel.IPVS.Apply), kube-ipvs0 binds and unbinds
// (Links.ApplyAddresses) and ipset entries (IPSets.ApplyEntries). Each
// write carries a callback that receives its outcome: it updates what the
// kernel is known to hold (known.go) only on success and blames a failure
// on the resources owning the item, exactly as the single call did.
//
// Order within a pass: IPVS writes, flushed at the end of the IPVS phase;
// then binds/unbinds, whose callbacks queue the KUBE-IPVS-IPS entry of the
// address (it follows a successful bind or unbind, as before); then the
// other entries, deletions before additions. flushWrites sends addresses,
// then entries, before anything reads what they wrote (the full pass's
// entry listing, iptables).

// writeQueue is a pass's pending writes of one kind, each with what to do
// with its outcome.
type writeQueue[T any] struct {
	ops      []T
	done     []func(error)
	flushing bool
}

// maxQueued bounds each queue (memory, and how late errors surface).
const maxQueued = 8192

// add queues op; done (may be nil) receives its outcome. It reports
// whether the queue is due for a flush.
func (q *writeQueue[T]) add(op T, done func(error)) bool {
	q.ops = append(q.ops, op)
	q.done = append(q.done, done)
	return len(q.ops) >= maxQueued && !q.flushing
}

// flush sends the queued writes with apply (one error per write) and runs
// their callbacks in queue order; writes the callbacks queue are sent by
// the same flush.
func (q *writeQueue[T]) flush(apply func([]T) []error, name func(T) string) {
	if q.flushing {
		return // called from a callback: the running flush sends them
	}
	q.flushing = true
	defer func() { q.flushing = false }()
	for len(q.ops) > 0 {
		ops, done := q.ops, q.done
		q.ops, q.done = nil, nil
		errs := apply(ops)
		for i, op := range ops {
			err := outcome(errs, i, op, name)
			if done[i] != nil {
				done[i](err)
			}
		}
		// Reuse the arrays for the next batch (a full pass queues 200k
		// writes at 10k Services), unless the callbacks queued more.
		clear(ops)
		clear(done)
		if q.ops == nil {
			q.ops, q.done = ops[:0], done[:0]
		}
	}
}

// outcome is the i-th error of a batch; a batch call that returned too few
// errors leaves the rest failed (named only then: a name per write was a
// string per write).
func outcome[T any](errs []error, i int, op T, name func(T) string) error {
	if i < len(errs) {
		return errs[i]
	}
	return fmt.Errorf("%s: no outcome reported by the kernel layer", name(op))
}

// ---- IPVS ----

// queueIPVS adds an IPVS write; done (may be nil) receives its outcome.
func (p *pass) queueIPVS(op kernel.IPVSOp, done func(error)) {
	p.noteFlowWrite(op)
	if p.ipvsq.add(op, done) {
		p.flushIPVS()
	}
}

// flushIPVS sends the queued IPVS writes and reports their outcomes. Every
// phase that queues flushes before anything reads what it wrote.
func (p *pass) flushIPVS() {
	p.ipvsq.flush(func(ops []kernel.IPVSOp) []error {
		errs := p.k.IPVS.Apply(ops)
		// Servers whose add failed: their destinations' ErrNotFound says
		// nothing new (destDone). Known before any callback runs.
		p.addFailed = map[kernel.VirtualServerKey]bool{}
		for i, op := range ops {
			if op.Kind == kernel.AddVirtualServer && (i >= len(errs) || errs[i] != nil) {
				p.addFailed[op.Server.Key] = true
			}
		}
		return errs
	}, func(op kernel.IPVSOp) string { return "ipvs: " + op.Kind.String() })
	p.addFailed = nil
}

// destDone reports a queued destination write's failure ("ipvs <verb>
// destination <server> -> <real server>"), unless it only echoes the
// failed add of its server (already reported to the same names). The
// message is formatted only on failure: one per write cost 200k strings
// per cold start at 10k Services.
func (p *pass) destDone(key kernel.VirtualServerKey, verb string, dest kernel.DestinationKey, names []string) func(error) {
	return func(err error) {
		if err == nil || (p.addFailed[key] && errors.Is(err, kernel.ErrNotFound)) {
			return
		}
		p.fail(names, fmt.Sprintf("ipvs %s destination %v -> %v", verb, key, dest), err)
	}
}

// ---- addresses and entries ----

// queueAddr adds a bind or unbind on kube-ipvs0.
func (p *pass) queueAddr(op kernel.AddressOp, done func(error)) {
	if p.addrq.add(op, done) {
		p.flushAddrs()
	}
}

// queueEntry adds an ipset entry write.
func (p *pass) queueEntry(op kernel.EntryOp, done func(error)) {
	if p.entryq.add(op, done) {
		p.flushEntries()
	}
}

func (p *pass) flushAddrs() {
	p.addrq.flush(func(ops []kernel.AddressOp) []error {
		return p.k.Links.ApplyAddresses(kernel.DummyDevice, ops)
	}, func(op kernel.AddressOp) string { return fmt.Sprintf("%v %v", op.Kind, op.Addr) })
}

func (p *pass) flushEntries() {
	p.entryq.flush(p.k.IPSets.ApplyEntries, func(op kernel.EntryOp) string {
		return fmt.Sprintf("ipset %v %s", op.Kind, op.Set.Name)
	})
}

// flushWrites sends the queued binds/unbinds, then the queued entries
// (including the KUBE-IPVS-IPS entries the binds' callbacks queue).
func (p *pass) flushWrites() {
	p.flushAddrs()
	p.flushEntries()
}
