package reconcile

import (
	"errors"
	"slices"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/wire"
)

// IPVS virtual servers and their real servers (destinations).
//
//   - Update (syncVS, wanted key): the virtual server the winning resource
//     asks for (store.wantVS), with the node's default scheduler, is added
//     when absent and updated when it differs; then its real servers:
//     missing ones are added, ones whose weight or forwarding differs are
//     updated (never deleted and re-added), unwanted ones are removed
//     (removeDestination, drain.go: kept at weight 0 while they drain).
//   - Delete (syncVS, key nobody wants): deleted with its real servers,
//     draining or not, unless its address is excluded; absent is fine.
//   - Prune (full pass, virtualServersToCompare): besides the wanted keys,
//     those this process programmed, those on addresses bound to
//     kube-ipvs0 (not excluded) and fwmark servers with an in-cluster mark
//     (incluster.go), so Services deleted while the agent was down go too.
//     Others are left alone.
//   - Status: a failure is blamed on the key's owners and the changed
//     resources that touched it; known.programmed records the keys this
//     process owns. A destination write that failed only because its
//     server's add failed in the same batch is not reported twice.
//
// Writes are queued (queue.go): a server before its destinations.

// listThreshold: an incremental pass touching at least this many virtual
// servers (and a quarter of those programmed) lists the table once
// instead of reading each server.
const listThreshold = 64

// listVirtualServers reads the whole IPVS table into p.listed (which
// syncVS then uses instead of one get per key) and returns it; on error it
// records the failure and leaves p.listed nil (syncVS reads per key).
func (p *pass) listVirtualServers() map[kernel.VirtualServerKey]kernel.VirtualServer {
	list, err := p.k.IPVS.ListVirtualServers()
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

// virtualServersToCompare are the keys a full pass syncs: wanted,
// programmed by this process, or on a bound or node-local, not excluded
// address (or an in-cluster firewall mark of ours).
func (p *pass) virtualServersToCompare() map[kernel.VirtualServerKey][]string {
	keys := make(map[kernel.VirtualServerKey][]string, len(p.desired.vsOwners)) // steady state: programmed = wanted
	for key := range p.desired.vsOwners {
		keys[key] = nil
	}
	for key := range p.known.programmed {
		keys[key] = nil
	}
	listed := p.listed
	if listed == nil {
		listed = p.listVirtualServers()
	}
	// A virtual server on one of the node's own addresses is ours too, as
	// kube-proxy takes every virtual server: NodePorts live on the node's
	// interface addresses, and one dropped while the agent was down (a
	// Service turned ClusterIP, deleted) is in no state the restarted agent
	// knows (found by the chaos soak: such NodePorts stayed forever).
	localOK := true
	if err := p.loadLocal(); err != nil {
		p.fail(nil, "list local addresses", err)
		localOK = false
	}
	for key := range listed {
		ours := key.FWMark == 0 && (p.known.bound[key.Address] || localOK && p.localElse[key.Address]) && !p.excluded(key.Address)
		if ours || p.marks.isOurs(key.FWMark) {
			keys[key] = nil
		}
	}
	return keys
}

// syncVS makes the virtual server key and its real servers match the
// desired state; touchers are the changed resources that touched it.
func (p *pass) syncVS(key kernel.VirtualServerKey, touchers []string) {
	names := ownersToBlame(p.desired.vsOwners[key], touchers)
	want, ok := p.desired.wantVS(key)
	var cur kernel.VirtualServer
	var err error
	if p.listed != nil {
		var ok bool
		if cur, ok = p.listed[key]; !ok {
			err = kernel.ErrNotFound
		}
	} else {
		cur, err = p.k.IPVS.GetVirtualServer(key)
	}
	exists := err == nil
	if err != nil && !errors.Is(err, kernel.ErrNotFound) {
		p.fail(names, "ipvs get "+key.String(), err)
		return
	}
	if !ok {
		// Like kube-proxy, a virtual server nobody wants is deleted with its
		// real servers, draining or not: their connections go with it.
		notOurs := func() {
			delete(p.known.programmed, key)
			delete(p.drains.byVS, key) // deleted, or excluded and so not ours
		}
		if !exists || p.excluded(key.Address) {
			notOurs()
			return
		}
		p.count(wire.OpDeleteService)
		p.queueIPVS(kernel.IPVSOp{Kind: kernel.DeleteVirtualServer, Server: kernel.VirtualServer{Key: key}}, func(err error) {
			if err != nil && !errors.Is(err, kernel.ErrNotFound) {
				p.fail(names, "ipvs delete "+key.String(), err)
				return
			}
			notOurs()
		})
		return
	}
	p.known.programmed[key] = struct{}{}
	vs := want.kernelVS(p.s.defaultScheduler)
	// The server's write goes first in the queue and the kernel applies a
	// batch in order, so its destinations below find it.
	switch {
	case !exists:
		p.count(wire.OpAddService)
		p.queueIPVS(kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: vs}, func(err error) {
			if err != nil {
				p.fail(names, "ipvs add "+key.String(), err)
			}
		})
	case cur != vs:
		p.count(wire.OpUpdateService)
		p.queueIPVS(kernel.IPVSOp{Kind: kernel.UpdateVirtualServer, Server: vs}, func(err error) {
			if err != nil {
				p.fail(names, "ipvs update "+key.String(), err)
			}
		})
	}
	p.syncDests(key, want.dests, exists, names)
}

// syncDests makes the real servers of key match want (exists: the server
// was in the kernel, so it has real servers to list). Both lists are sorted
// by key (desiredVS.dests; the kernel.IPVS contract), so one merge walk
// compares them: a full pass does this for every server (20k at 10k
// Services), where a map per server, even one reused, cost hashing every
// real server twice.
func (p *pass) syncDests(key kernel.VirtualServerKey, want []desiredDest, exists bool, names []string) {
	var have []kernel.Destination
	if exists {
		list, ok := p.listedDests[key]
		// Read once per pass: let what the full pass read go as it goes
		// (200k real servers at 10k Services).
		delete(p.listedDests, key)
		if !ok {
			var err error
			if list, err = p.k.IPVS.ListDestinations(key); err != nil {
				p.fail(names, "ipvs list destinations "+key.String(), err)
				return
			}
		}
		have = list
		if !slices.IsSortedFunc(have, compareDestinations) { // a broken contract must not delete servers
			have = slices.Clone(have)
			slices.SortFunc(have, compareDestinations)
		}
	}
	var stale []kernel.Destination
	i := 0
	for _, dd := range want {
		d := dd.kernel()
		dk := d.Key()
		for i < len(have) && have[i].Key().Compare(dk) < 0 {
			stale = append(stale, have[i])
			i++
		}
		cur, ok := kernel.Destination{}, false
		if i < len(have) && have[i].Key() == dk {
			cur, ok = have[i], true
			i++
		}
		// Wanted again while draining: the weight update below restores it
		// (no delete/re-add, its connections stay).
		p.drains.stop(key, dk)
		server := kernel.VirtualServer{Key: key}
		switch {
		case !ok:
			p.count(wire.OpAddDestination)
			p.queueIPVS(kernel.IPVSOp{Kind: kernel.AddDestination, Server: server, Destination: d},
				p.destDone(key, "add", dk, names))
		case cur.Weight != d.Weight || cur.Forward != d.Forward:
			p.count(wire.OpUpdateDestination)
			p.queueIPVS(kernel.IPVSOp{Kind: kernel.UpdateDestination, Server: server, Destination: d},
				p.destDone(key, "update", dk, names))
		}
	}
	stale = append(stale, have[i:]...)
	for _, d := range stale {
		p.removeDestination(key, d, names)
	}
}

func compareDestinations(a, b kernel.Destination) int { return a.Key().Compare(b.Key()) }
