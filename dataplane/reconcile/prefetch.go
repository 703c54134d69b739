package reconcile

import (
	"context"
	"errors"
	"net/netip"
	"sync"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// A periodic full pass reads every table the agent owns. At 10k Services
// that is 20k virtual servers, 200k real servers and the sets' entries: a
// few seconds on a slow node. Reading it under the reconciler's lock held
// every Delta for that long, so the pass reads first, without the lock
// (kernelRead), and then compares and writes under it. A write made while
// the tables were being read marks what it touched (writeTracker); the pass
// reads those objects again under the lock. Every write goes through the
// tracking wrappers below, so no writer can be forgotten: the kernel
// interfaces write only in batches, plus set and dummy creation.

// kernelRead is what a full pass read of the kernel before taking the lock.
// Absent entries (and nil maps) were not read, or are stale: the pass reads
// them under the lock as it always did.
type kernelRead struct {
	vs    map[kernel.VirtualServerKey]kernel.VirtualServer // nil: not listed
	dests map[kernel.VirtualServerKey][]kernel.Destination
	bound map[netip.Addr]bool // addresses on kube-ipvs0; nil: not read
	// entries of the managed sets, by name.
	entries map[string][]kernel.Entry
	// dumped is how many servers' destinations came from the one-read dump
	// (the rest were read one by one); for the pass's log line.
	dumped int
}

// readKernel reads the tables a full pass compares. It must run without
// r.mu; r.tracker records the writes made meanwhile.
func (r *Reconciler) readKernel(ctx context.Context) *kernelRead {
	out := &kernelRead{entries: map[string][]kernel.Entry{}}
	if list, err := r.k.IPVS.ListVirtualServers(); err == nil {
		out.vs = make(map[kernel.VirtualServerKey]kernel.VirtualServer, len(list))
		out.dests = make(map[kernel.VirtualServerKey][]kernel.Destination, len(list))
		// All destinations in one read where the kernel can; the servers it
		// leaves out are read one by one. Read after the list: a server
		// removed in between is missing from the dump and fails its own
		// read, so it stays unread (and is read under the lock).
		dumped := r.dumpDestinations()
		for _, vs := range list {
			out.vs[vs.Key] = vs
			if ds, ok := dumped[vs.Key]; ok {
				out.dests[vs.Key] = ds
				out.dumped++
				continue
			}
			if ctx.Err() != nil {
				continue
			}
			if ds, err := r.k.IPVS.ListDestinations(vs.Key); err == nil {
				out.dests[vs.Key] = ds
			}
		}
	}
	if list, err := r.k.Links.BoundAddresses(kernel.DummyDevice); err == nil {
		out.bound = make(map[netip.Addr]bool, len(list))
		for _, a := range list {
			out.bound[a.Unmap()] = true
		}
	}
	for _, ref := range r.families.managedSets() {
		if list, err := r.k.IPSets.ListEntries(ref.name()); err == nil {
			out.entries[ref.name()] = list
		}
	}
	return out
}

// dumpDestinations returns every destination the kernel dumps at once, or
// nil when it cannot (kernel.DestinationDumper), logging the first failure.
func (r *Reconciler) dumpDestinations() map[kernel.VirtualServerKey][]kernel.Destination {
	d, ok := r.k.IPVS.(kernel.DestinationDumper)
	if !ok {
		return nil
	}
	dumped, err := d.DumpDestinations()
	if err != nil {
		if !errors.Is(err, kernel.ErrUnsupported) {
			r.dumpFailed.Do(func() {
				r.log.Warn("reading all IPVS destinations at once failed; reading them per virtual server", zap.Error(err))
			})
		}
		return nil
	}
	return dumped
}

// use hands the pass what is still current of the read: everything the
// writes since the read began (w) did not touch. Called under r.mu after
// known.invalidate(), before anything of the pass reads the kernel.
func (read *kernelRead) use(p *pass, w writesDuringRead) {
	if read == nil {
		return
	}
	known := p.known
	if read.bound != nil && !w.addresses {
		known.bound, known.dummyGone = read.bound, false
	}
	for name, list := range read.entries {
		if w.sets[name] {
			continue
		}
		m := make(map[kernel.Entry]bool, len(list))
		for _, e := range list {
			e.Comment = ""
			m[e.Normalize()] = true
		}
		known.setEntries[name] = m
	}
	if read.vs == nil {
		return
	}
	// Servers written to since: read again now (O(writes), under the lock).
	for key := range w.vs {
		delete(read.vs, key)
		delete(read.dests, key)
		cur, err := p.k.IPVS.GetVirtualServer(key)
		switch {
		case err == nil:
			read.vs[key] = cur
		case !errors.Is(err, kernel.ErrNotFound):
			return // p.listed stays nil: the pass lists under the lock
		}
	}
	p.listed, p.listedDests = read.vs, read.dests
}

// writesDuringRead are the kernel objects written to while a read was taken.
type writesDuringRead struct {
	vs        map[kernel.VirtualServerKey]bool
	sets      map[string]bool
	addresses bool // any change to kube-ipvs0 or its addresses
}

// writeTracker records, between start and stop, what each kernel write
// touched. A write is recorded after it returns: one that ended before
// start is in what the read saw; one that ends after start is recorded.
type writeTracker struct {
	mu sync.Mutex
	on bool
	w  writesDuringRead
}

func (t *writeTracker) start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.on = true
	t.w = writesDuringRead{vs: map[kernel.VirtualServerKey]bool{}, sets: map[string]bool{}}
}

func (t *writeTracker) stop() writesDuringRead {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.on = false
	w := t.w
	t.w = writesDuringRead{}
	return w
}

func (t *writeTracker) record(f func(w *writesDuringRead)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.on {
		f(&t.w)
	}
}

func (t *writeTracker) vs(keys ...kernel.VirtualServerKey) {
	t.record(func(w *writesDuringRead) {
		for _, k := range keys {
			w.vs[k] = true
		}
	})
}

func (t *writeTracker) sets(names ...string) {
	t.record(func(w *writesDuringRead) {
		for _, n := range names {
			w.sets[n] = true
		}
	})
}

func (t *writeTracker) addresses() { t.record(func(w *writesDuringRead) { w.addresses = true }) }

// wrap returns k with IPVS, IPSets and Links writes recorded by t.
func (t *writeTracker) wrap(k kernel.Kernel) kernel.Kernel {
	k.IPVS = trackedIPVS{k.IPVS, t}
	k.IPSets = trackedIPSets{k.IPSets, t}
	k.Links = trackedLinks{k.Links, t}
	return k
}

type trackedIPVS struct {
	kernel.IPVS
	t *writeTracker
}

func (v trackedIPVS) Apply(ops []kernel.IPVSOp) []error {
	// Walk ops only while a read is under way: a batch is the hot path.
	defer v.t.record(func(w *writesDuringRead) {
		for _, op := range ops {
			w.vs[op.Server.Key] = true
		}
	})
	return v.IPVS.Apply(ops)
}

// DumpDestinations passes the optional read through (kernel.ErrUnsupported
// when the wrapped IPVS has none).
func (v trackedIPVS) DumpDestinations() (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	if d, ok := v.IPVS.(kernel.DestinationDumper); ok {
		return d.DumpDestinations()
	}
	return nil, kernel.ErrUnsupported
}

// DigestVirtualServers passes the optional read through
// (kernel.ErrUnsupported when the wrapped IPVS has none).
func (v trackedIPVS) DigestVirtualServers() (uint64, error) {
	if d, ok := v.IPVS.(kernel.VirtualServerDigester); ok {
		return d.DigestVirtualServers()
	}
	return 0, kernel.ErrUnsupported
}

type trackedIPSets struct {
	kernel.IPSets
	t *writeTracker
}

func (s trackedIPSets) CreateSet(set kernel.IPSet) error {
	defer s.t.sets(set.Name)
	return s.IPSets.CreateSet(set)
}

func (s trackedIPSets) ApplyEntries(ops []kernel.EntryOp) []error {
	defer s.t.record(func(w *writesDuringRead) {
		for _, op := range ops {
			w.sets[op.Set.Name] = true
		}
	})
	return s.IPSets.ApplyEntries(ops)
}

type trackedLinks struct {
	kernel.Links
	t *writeTracker
}

func (l trackedLinks) EnsureDummy(name string) (bool, error) {
	defer l.t.addresses()
	return l.Links.EnsureDummy(name)
}

func (l trackedLinks) ApplyAddresses(dev string, ops []kernel.AddressOp) []error {
	defer l.t.addresses()
	return l.Links.ApplyAddresses(dev, ops)
}
