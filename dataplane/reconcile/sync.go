package reconcile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	"github.com/vsplane/vsplane/internal/wire"
)

// Kernel operation kinds reported in Ack.kernel_operations and Stats.
const (
	OpAddService        = wire.OpAddService
	OpUpdateService     = wire.OpUpdateService
	OpDeleteService     = wire.OpDeleteService
	OpAddDestination    = wire.OpAddDestination
	OpUpdateDestination = wire.OpUpdateDestination
	OpDeleteDestination = wire.OpDeleteDestination
	OpSetTimeouts       = wire.OpSetTimeouts
	OpCreateDummy       = wire.OpCreateDummy
	OpBind              = wire.OpBind
	OpUnbind            = wire.OpUnbind
	OpCreateSet         = wire.OpCreateSet
	OpAddEntry          = wire.OpAddEntry
	OpDelEntry          = wire.OpDelEntry
	OpRestore           = wire.OpRestore
	OpSysctl            = wire.OpSysctl
)

const sysctlConntrackTCPLiberal = "net/netfilter/nf_conntrack_tcp_be_liberal"

// pass is one application of desired state to the kernel: it caches what
// it read, counts the writes it made and collects errors per resource.
type pass struct {
	r    *Reconciler
	ctx  context.Context
	s    settings
	ops  map[string]uint32
	errs map[string][]string // resource name -> messages
	// global are errors no resource can be blamed for.
	global []string

	localElse map[netip.Addr]bool // on an interface other than kube-ipvs0
	// listed is the IPVS table read by a full pass (nil: read per key), so
	// a full pass costs one list instead of one get per virtual server.
	listed map[kernel.VirtualServerKey]kernel.VirtualServer
	// listedDests are real servers a full pass read before taking the
	// lock (prefetch.go), by virtual server; one absent is read per key.
	listedDests map[kernel.VirtualServerKey][]kernel.Destination
	// drainOps are the ops (also in ops) that ended a drain: housekeeping,
	// not drift repair.
	drainOps map[string]uint32
	// Queued kernel writes (queue.go): IPVS, kube-ipvs0 addresses, ipset
	// entries. addFailed: servers whose add failed in the IPVS batch being
	// reported. dummyMade: this pass recreated kube-ipvs0 after a bind
	// found it gone.
	ipvsq     writeQueue[kernel.IPVSOp]
	addrq     writeQueue[kernel.AddressOp]
	entryq    writeQueue[kernel.EntryOp]
	addFailed map[kernel.VirtualServerKey]bool
	dummyMade bool
}

// record is what the reconciler believes the kernel holds of the state it
// could otherwise only learn by listing a whole table: the addresses on
// kube-ipvs0, the managed sets and their entries. A full pass reloads it
// from the kernel; incremental passes read and update it instead of
// listing, so an Apply costs O(what changed), not O(Services). Between
// full passes it can miss outside drift (repaired by the next full pass);
// it never causes harm the other way because binds, ipset adds and all
// deletes are idempotent. nil maps are unknown and read on first use; a
// pass with any kernel error forgets the record (see settle).
type record struct {
	bound      map[netip.Addr]bool // on kube-ipvs0
	dummyGone  bool
	sets       map[string]kernel.IPSet
	setEntries map[string]map[kernel.Entry]bool // by set name
}

func (r *Reconciler) newPass(ctx context.Context) *pass {
	if r.rec.setEntries == nil {
		r.rec.setEntries = map[string]map[kernel.Entry]bool{}
	}
	return &pass{r: r, ctx: ctx, s: r.store.settings(), ops: map[string]uint32{}, errs: map[string][]string{}}
}

// fail records err against every named resource (or globally).
func (p *pass) fail(names []string, what string, err error) {
	msg := fmt.Sprintf("%s: %v", what, err)
	p.r.log.Warn("kernel operation failed", zap.String("op", what), zap.Strings("resources", names), zap.Error(err))
	if len(names) == 0 {
		p.global = append(p.global, msg)
		return
	}
	for _, n := range names {
		if !slices.Contains(p.errs[n], msg) {
			p.errs[n] = append(p.errs[n], msg)
		}
	}
}

func (p *pass) count(op string) { p.ops[op]++ }

func (p *pass) excluded(a netip.Addr) bool {
	for _, c := range p.s.excludeCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// blame is who answers for an item: its current owners plus the changed
// resources that touched it.
func blame(owners, touchers []string) []string {
	out := slices.Clone(owners)
	for _, t := range touchers {
		out = appendOnce(out, t)
	}
	slices.Sort(out)
	return out
}

// ---- IPVS ----

// listThreshold: an incremental pass touching at least this many virtual
// servers (and a quarter of those programmed) lists the table once
// instead of reading each server.
const listThreshold = 64

// listVirtualServers reads the whole IPVS table into p.listed (which
// syncVS then uses instead of one get per key) and returns it; on error it
// records the failure and leaves p.listed nil (syncVS reads per key).
func (p *pass) listVirtualServers() map[kernel.VirtualServerKey]kernel.VirtualServer {
	list, err := p.r.k.IPVS.ListVirtualServers()
	if err != nil {
		p.fail(nil, "list ipvs services", err)
		return nil
	}
	p.listed = make(map[kernel.VirtualServerKey]kernel.VirtualServer, len(list))
	for _, vs := range list {
		p.listed[vs.Key] = vs
	}
	return p.listed
}

func (p *pass) syncVS(key kernel.VirtualServerKey, touchers []string) {
	k := p.r.k.IPVS
	names := blame(p.r.store.vsOwners[key], touchers)
	want, ok := p.r.store.wantVS(key)
	var cur kernel.VirtualServer
	var err error
	if p.listed != nil {
		var ok bool
		if cur, ok = p.listed[key]; !ok {
			err = kernel.ErrNotFound
		}
	} else {
		cur, err = k.GetVirtualServer(key)
	}
	exists := err == nil
	if err != nil && !errors.Is(err, kernel.ErrNotFound) {
		p.fail(names, "ipvs get "+key.String(), err)
		return
	}
	if !ok {
		// Like kube-proxy, a virtual server nobody wants is deleted with its
		// real servers, draining or not: their connections go with it.
		forget := func() {
			delete(p.r.programmed, key)
			delete(p.r.drains, key) // deleted, or excluded and so not ours
		}
		if !exists || p.excluded(key.Address) {
			forget()
			return
		}
		p.count(OpDeleteService)
		p.queueIPVS(kernel.IPVSOp{Kind: kernel.DeleteVirtualServer, Server: kernel.VirtualServer{Key: key}}, func(err error) {
			if err != nil && !errors.Is(err, kernel.ErrNotFound) {
				p.fail(names, "ipvs delete "+key.String(), err)
				return
			}
			forget()
		})
		return
	}
	p.r.programmed[key] = struct{}{}
	vs := want.kernelVS(p.s.defaultScheduler)
	// The server's write goes first in the queue and the kernel applies a
	// batch in order, so its destinations below find it.
	switch {
	case !exists:
		p.count(OpAddService)
		p.queueIPVS(kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: vs}, func(err error) {
			if err != nil {
				p.fail(names, "ipvs add "+key.String(), err)
			}
		})
	case cur != vs:
		p.count(OpUpdateService)
		p.queueIPVS(kernel.IPVSOp{Kind: kernel.UpdateVirtualServer, Server: vs}, func(err error) {
			if err != nil {
				p.fail(names, "ipvs update "+key.String(), err)
			}
		})
	}
	p.syncDests(key, want.dests, exists, names)
}

func (p *pass) syncDests(key kernel.VirtualServerKey, want []kernel.Destination, exists bool, names []string) {
	k := p.r.k.IPVS
	have := map[kernel.DestinationKey]kernel.Destination{}
	if exists {
		list, ok := p.listedDests[key]
		if !ok {
			var err error
			if list, err = k.ListDestinations(key); err != nil {
				p.fail(names, "ipvs list destinations "+key.String(), err)
				return
			}
		}
		for _, d := range list {
			have[d.Key()] = d
		}
	}
	for _, d := range want {
		cur, ok := have[d.Key()]
		delete(have, d.Key())
		// Wanted again while draining: the weight update below restores it
		// (no delete/re-add, its connections stay).
		p.r.untrack(key, d.Key())
		server := kernel.VirtualServer{Key: key}
		switch {
		case !ok:
			p.count(OpAddDestination)
			p.queueIPVS(kernel.IPVSOp{Kind: kernel.AddDestination, Server: server, Destination: d},
				p.destDone(key, fmt.Sprintf("ipvs add destination %v -> %v", key, d.Key()), names))
		case cur.Weight != d.Weight || cur.Forward != d.Forward:
			p.count(OpUpdateDestination)
			p.queueIPVS(kernel.IPVSOp{Kind: kernel.UpdateDestination, Server: server, Destination: d},
				p.destDone(key, fmt.Sprintf("ipvs update destination %v -> %v", key, d.Key()), names))
		}
	}
	stale := make([]kernel.Destination, 0, len(have))
	for _, d := range have {
		stale = append(stale, d)
	}
	slices.SortFunc(stale, func(a, b kernel.Destination) int { return a.Key().Compare(b.Key()) })
	for _, d := range stale {
		p.removeDestination(key, d, names)
	}
}

// ---- addresses on kube-ipvs0 ----

func (p *pass) loadBound() error {
	rec := &p.r.rec
	if rec.bound != nil {
		return nil
	}
	list, err := p.r.k.Links.BoundAddresses(kernel.DummyDevice)
	rec.dummyGone = false
	switch {
	case errors.Is(err, kernel.ErrNotFound):
		rec.dummyGone = true
	case err != nil:
		return err
	}
	rec.bound = make(map[netip.Addr]bool, len(list))
	for _, a := range list {
		rec.bound[a.Unmap()] = true
	}
	return nil
}

func (p *pass) loadLocal() error {
	if p.localElse != nil {
		return nil
	}
	list, err := p.r.k.Links.LocalAddresses()
	if err != nil {
		return err
	}
	p.setLocal(list)
	return nil
}

// setLocal records the addresses held by interfaces other than kube-ipvs0.
func (p *pass) setLocal(list []kernel.InterfaceAddress) {
	p.localElse = map[netip.Addr]bool{}
	for _, ia := range list {
		if ia.Interface != kernel.DummyDevice {
			p.localElse[ia.Prefix.Addr().Unmap()] = true
		}
	}
}

// bindWanted: some virtual server on addr wants it bound (ALWAYS, or
// UNLESS_LOCAL while no other interface holds it).
func (p *pass) bindWanted(addr netip.Addr) (bool, error) {
	always, unlessLocal := p.r.store.bindings(addr)
	if always || !unlessLocal {
		return always, nil
	}
	if err := p.loadLocal(); err != nil {
		return false, err
	}
	return !p.localElse[addr], nil
}

func (p *pass) syncAddr(addr netip.Addr, touchers []string) {
	var owners []string
	for key := range p.r.store.addrVS[addr] {
		owners = append(owners, p.r.store.vsOwners[key]...)
	}
	names := blame(owners, touchers)
	if err := p.loadBound(); err != nil {
		p.fail(names, "list addresses of "+kernel.DummyDevice, err)
		return
	}
	want, err := p.bindWanted(addr)
	if err != nil {
		p.fail(names, "list local addresses", err)
		return
	}
	rec := &p.r.rec
	// KUBE-IPVS-IPS holds exactly the addresses bound for services: its
	// entry follows a bind or unbind once that succeeded.
	entry := func() {
		if fam := kernel.FamilyOf(addr); p.r.families.has(fam) {
			p.syncEntry(entryKey{set: setRef{rules.SetIPVSIPs, fam}, entry: kernel.Entry{IP: addr}}, names)
		}
	}
	switch {
	case want && !rec.bound[addr]:
		if rec.dummyGone {
			p.count(OpCreateDummy)
			if _, err := p.r.k.Links.EnsureDummy(kernel.DummyDevice); err != nil {
				p.fail(names, "create "+kernel.DummyDevice, err)
				return
			}
			rec.dummyGone = false
		}
		p.count(OpBind)
		p.queueAddr(kernel.AddressOp{Kind: kernel.BindAddress, Addr: addr}, p.bindDone(addr, names, entry, true))
	case !want && rec.bound[addr] && !p.excluded(addr):
		p.count(OpUnbind)
		p.queueAddr(kernel.AddressOp{Kind: kernel.UnbindAddress, Addr: addr}, func(err error) {
			if err != nil {
				p.fail(names, fmt.Sprintf("unbind %v from %s", addr, kernel.DummyDevice), err)
				return
			}
			delete(p.r.rec.bound, addr)
			entry()
		})
	default:
		entry()
	}
}

// bindDone handles the outcome of a queued bind of addr: on success it
// records the address as bound and runs then (the KUBE-IPVS-IPS entry).
// ErrNotFound means kube-ipvs0 was deleted behind the record's back: with
// retry, the dummy is created again (once per pass: the binds of the same
// batch all find it missing) and the bind queued once more.
func (p *pass) bindDone(addr netip.Addr, names []string, then func(), retry bool) func(error) {
	return func(err error) {
		if retry && errors.Is(err, kernel.ErrNotFound) {
			if !p.dummyMade {
				p.count(OpCreateDummy)
				if _, err = p.r.k.Links.EnsureDummy(kernel.DummyDevice); err == nil {
					p.dummyMade = true
				}
			}
			if p.dummyMade {
				p.queueAddr(kernel.AddressOp{Kind: kernel.BindAddress, Addr: addr}, p.bindDone(addr, names, then, false))
				return
			}
		}
		if err != nil {
			p.fail(names, fmt.Sprintf("bind %v to %s", addr, kernel.DummyDevice), err)
			return
		}
		if p.r.rec.bound != nil {
			p.r.rec.bound[addr] = true
		}
		then()
	}
}

// ---- ipsets ----

// managedSets are the sets the agent owns entirely (kube-proxy's, per
// family): entries no resource wants are deleted.
func (r *Reconciler) managedSets() []setRef {
	var out []setRef
	for _, f := range r.families {
		for _, s := range rules.AllSets() {
			out = append(out, setRef{s, f})
		}
	}
	return out
}

// ensureSets creates the missing sets; existing ones are left alone.
func (p *pass) ensureSets() {
	rec := &p.r.rec
	if rec.sets == nil {
		list, err := p.r.k.IPSets.ListSets()
		if err != nil {
			p.fail(nil, "list ipsets", err)
			return
		}
		rec.sets = make(map[string]kernel.IPSet, len(list))
		for _, s := range list {
			rec.sets[s.Name] = s
		}
	}
	for _, ref := range p.r.managedSets() {
		spec := ref.spec()
		cur, ok := rec.sets[spec.Name]
		switch {
		case ok && cur.SameAs(spec):
		case ok:
			p.fail(p.setUsers(ref), "ipset "+spec.Name, fmt.Errorf("exists as %s %v maxelem %d, want %s %v: %w",
				cur.Type, cur.Family, cur.MaxElem, spec.Type, spec.Family, kernel.ErrExist))
		default:
			p.count(OpCreateSet)
			if err := p.r.k.IPSets.CreateSet(spec); err != nil {
				p.fail(p.setUsers(ref), "create ipset "+spec.Name, err)
				continue
			}
			rec.sets[spec.Name] = spec.Normalize()
			rec.setEntries[spec.Name] = map[kernel.Entry]bool{}
		}
	}
}

func (p *pass) setUsers(ref setRef) []string {
	var out []string
	for ek, owners := range p.r.store.entryRefs {
		if ek.set == ref {
			for _, o := range owners {
				out = appendOnce(out, o)
			}
		}
	}
	slices.Sort(out)
	return out
}

func (p *pass) loadEntries(ref setRef) (map[kernel.Entry]bool, error) {
	name := ref.name()
	if m, ok := p.r.rec.setEntries[name]; ok {
		return m, nil
	}
	list, err := p.r.k.IPSets.ListEntries(name)
	if err != nil {
		return nil, err
	}
	m := make(map[kernel.Entry]bool, len(list))
	for _, e := range list {
		e.Comment = ""
		m[e.Normalize()] = true
	}
	p.r.rec.setEntries[name] = m
	return m, nil
}

func (p *pass) wantEntry(ek entryKey) (bool, error) {
	if p.r.entryAdmitted(ek, p.r.store.entryRefs[ek]) {
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
	keys := sortedKeys(entries, compareEntryKeys)
	wanted := make([]bool, len(keys))
	for i, ek := range keys {
		wanted[i], _ = p.wantEntry(ek) // errors are reported by syncEntry
		if !wanted[i] {
			p.syncEntry(ek, entries[ek])
		}
	}
	for i, ek := range keys {
		if wanted[i] {
			p.syncEntry(ek, entries[ek])
		}
	}
}

func (p *pass) syncEntry(ek entryKey, touchers []string) {
	names := blame(p.r.store.entryRefs[ek], touchers)
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
		p.count(OpAddEntry)
		p.queueEntry(kernel.EntryOp{Kind: kernel.AddEntry, Set: spec, Entry: ek.entry}, func(err error) {
			if err != nil {
				p.fail(names, "ipset add "+ek.String(), err)
				return
			}
			have[ek.entry] = true
		})
	case !want && have[ek.entry]:
		p.count(OpDelEntry)
		p.queueEntry(kernel.EntryOp{Kind: kernel.DelEntry, Set: spec, Entry: ek.entry}, func(err error) {
			if err != nil {
				p.fail(names, "ipset del "+ek.String(), err)
				return
			}
			delete(have, ek.entry)
		})
	}
}

// ---- node settings ----

func (p *pass) syncSettings() {
	var names []string
	if _, ok := p.r.store.res[SettingsResource]; ok {
		names = []string{SettingsResource}
	}
	sc := p.r.k.Sysctl
	type kv struct {
		name string
		val  int
	}
	want := []kv{
		{kernel.SysctlVSConntrack, 1},
		{kernel.SysctlVSExpireNodestConn, 1},
		{kernel.SysctlVSExpireQuiescentTmpl, 1},
		{kernel.SysctlIPForward, 1},
	}
	if v, err := sc.KernelVersion(); err != nil {
		p.fail(names, "read kernel version", err)
	} else if !v.AtLeast(5, 9) {
		// Kernels before 5.9 drop the first packets of a reused connection
		// to a deleted real server with conn_reuse_mode=1 (kubernetes#81775).
		want = append(want, kv{kernel.SysctlVSConnReuseMode, 0})
	}
	if p.s.strictARP {
		want = append(want, kv{kernel.SysctlArpIgnoreAll, 1}, kv{kernel.SysctlArpAnnounceAll, 2})
	}
	for _, w := range want {
		cur, err := sc.Get(w.name)
		if err != nil {
			p.fail(names, "sysctl "+w.name, err)
			continue
		}
		if cur != w.val {
			p.count(OpSysctl)
			if err := sc.Set(w.name, w.val); err != nil {
				p.fail(names, fmt.Sprintf("sysctl %s=%d", w.name, w.val), err)
			}
		}
	}
	t := p.s.timeouts
	if t == (kernel.Timeouts{}) {
		return
	}
	cur, err := p.r.k.IPVS.Timeouts()
	if err != nil {
		p.fail(names, "read ipvs timeouts", err)
		return
	}
	var set kernel.Timeouts
	if t.TCP != 0 && t.TCP != cur.TCP {
		set.TCP = t.TCP
	}
	if t.TCPFin != 0 && t.TCPFin != cur.TCPFin {
		set.TCPFin = t.TCPFin
	}
	if t.UDP != 0 && t.UDP != cur.UDP {
		set.UDP = t.UDP
	}
	if set != (kernel.Timeouts{}) {
		p.count(OpSetTimeouts)
		if err := p.r.k.IPVS.SetTimeouts(set); err != nil {
			p.fail(names, "set ipvs timeouts", err)
		}
	}
}

func secs(s uint32) time.Duration { return time.Duration(s) * time.Second }

// ---- iptables ----

func (r *Reconciler) rulesInput(fam kernel.Family, s settings, liberal bool) rules.Input {
	in := rules.Input{
		Family:              fam,
		MasqueradeAll:       s.masqueradeAll,
		MasqueradeBit:       s.masqueradeBit,
		RandomFully:         r.k.IPTables.Info().RandomFully,
		ConntrackTCPLiberal: liberal,
	}
	for _, c := range s.clusterCIDRs {
		if kernel.FamilyOf(c.Addr()) == fam {
			in.ClusterCIDR = c
			break
		}
	}
	for ref := range r.store.setRefs {
		if ref.family == fam {
			in.NonEmpty = in.NonEmpty.With(ref.set)
		}
	}
	// Only the resources with loadBalancerSourceRanges are read (the
	// SOURCE-IP entries that matter sit beside their FW entries).
	var fw, sourceIP []kernel.Entry
	for name := range r.store.firewalled {
		for _, ek := range r.store.res[name].entries {
			switch {
			case ek.set.family != fam, !r.entryAdmitted(ek, r.store.entryRefs[ek]):
			case ek.set.set == rules.SetLoadBalancerFW:
				fw = append(fw, ek.entry)
			case ek.set.set == rules.SetLoadBalancerSourceIP:
				sourceIP = append(sourceIP, ek.entry)
			}
		}
	}
	in.LoadBalancerNoNodeAccess = rules.NoNodeAccess(fw, sourceIP)
	return in
}

// syncIPTables renders the rules of each family and, when the rendering
// changed since the last successful apply (or verify is set, or nothing
// was applied yet in this process), compares them with iptables-save and
// applies one iptables-restore --noflush if anything differs. Errors are
// blamed on names (nil: global).
func (p *pass) syncIPTables(verify bool, names []string) {
	liberal := false
	if v, err := p.r.k.Sysctl.Get(sysctlConntrackTCPLiberal); err == nil {
		liberal = v != 0
	}
	for _, fam := range p.r.families {
		rs, err := rules.Render(p.r.rulesInput(fam, p.s, liberal))
		if err != nil {
			p.fail(names, "render iptables rules", err)
			continue
		}
		full := rs.Payload(rs.Jumps)
		if !verify && bytes.Equal(full, p.r.lastRules[fam]) {
			continue
		}
		delete(p.r.lastRules, fam)
		var dumps []kernel.TableDump
		readErr := error(nil)
		for _, t := range rs.TableNames() {
			b, err := p.r.k.IPTables.Save(p.ctx, fam, t)
			if err == nil {
				var d []kernel.TableDump
				if d, err = kernel.ParseSave(b); err == nil {
					dumps = append(dumps, d...)
				}
			}
			if err != nil {
				readErr = err
				break
			}
		}
		if readErr != nil {
			p.fail(names, fmt.Sprintf("iptables-save (%v)", fam), readErr)
			continue
		}
		missing, differ := rs.Check(dumps)
		if differ || len(missing) > 0 {
			payload := rs.Payload(missing)
			// Last line of defence: only our chains and the fixed jumps.
			if err := rules.CheckPayload(payload); err != nil {
				p.fail(names, fmt.Sprintf("iptables payload (%v) refused", fam), err)
				continue
			}
			p.count(OpRestore)
			if err := p.r.k.IPTables.Restore(p.ctx, fam, payload); err != nil {
				p.fail(names, fmt.Sprintf("iptables-restore (%v)", fam), err)
				continue
			}
		}
		p.r.lastRules[fam] = full
	}
}
