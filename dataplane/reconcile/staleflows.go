package reconcile

import (
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Stale connection-tracking entries of UDP and SCTP virtual servers,
// decided the way kube-proxy's pkg/proxy/conntrack (CleanStaleEntries)
// decides for UDP.
//
// A UDP flow keeps its conntrack entry while it sends (the entry's timeout
// restarts with every datagram), and an SCTP client re-associating from the
// same port keeps its entry alive with every INIT. An entry made while
// nothing served the address — the Service deleted and re-created, no
// endpoints then a first one — keeps the decisions of that moment: no IPVS
// translation in its reply tuple, no masquerade. The flow then never
// reaches the new real server, or its replies never come back, until the
// client pauses for the whole conntrack timeout. So after a pass wrote a
// UDP or SCTP virtual server or its real servers, the entries to that
// server's address and port whose reply source is none of its real servers
// are deleted (one table dump per family and protocol; never a flush).
// Entries of healthy flows have a real server as reply source
// (net/ipv4/vs/conntrack=1 makes IPVS rewrite the reply tuple) and stay.
// The first Delta (entries left by whatever ran before) and every periodic
// full reconcile sweep every UDP and SCTP virtual server: an entry made
// after a sweep (a packet in flight, a retransmission of an association
// being torn down) then pins a flow for at most one period.
//
// Where kube-proxy differs: it cleans UDP only, sweeps on every sync, keys
// NodePorts by port alone (any destination address) and skips Services
// without serving endpoints; the agent sweeps right after the writes that
// can leave entries stale, keys every virtual server by its own address and
// port (NodePort servers exist per node address), and counts as allowed
// reply sources the server's real servers (draining ones included) and its
// in-cluster real servers: an entry pointing at an endpoint this node does
// not forward to cannot carry traffic anyway (IPVS expire_nodest_conn).

// sweptProtocols are the protocols whose flows outlive a change of what
// serves them (TCP connections end with their endpoint).
var sweptProtocols = []kernel.Protocol{kernel.ProtocolUDP, kernel.ProtocolSCTP}

// noteFlowWrite records a queued write to a UDP or SCTP virtual server for
// the sweep (a deleted server needs none: nothing answers on it any more).
func (p *pass) noteFlowWrite(op kernel.IPVSOp) {
	key := op.Server.Key
	if !slices.Contains(sweptProtocols, key.Protocol) || key.FWMark != 0 || op.Kind == kernel.DeleteVirtualServer {
		return
	}
	if p.flowsWritten == nil {
		p.flowsWritten = map[kernel.VirtualServerKey]struct{}{}
	}
	p.flowsWritten[key] = struct{}{}
}

// sweepStaleFlows deletes the stale entries of the UDP and SCTP virtual
// servers the pass wrote (every such virtual server with all: the first
// Delta and the periodic reconcile): one dump per family and protocol that
// has any. A failure is logged and counted, never
// a NACK: kube-proxy's sync does not fail on it either, and the next sweep
// tries again.
func (r *Reconciler) sweepStaleFlows(p *pass, all bool) {
	if r.k.Conntrack == nil || (!all && len(p.flowsWritten) == 0) {
		return
	}
	for _, fam := range r.families {
		for _, proto := range sweptProtocols {
			allowed := allowedReplySources(r, p.flowsWritten, fam, proto)
			if all {
				allowed = allowedReplySources(r, r.desired.vsOwners, fam, proto)
			}
			r.sweepStale(fam, proto, allowed)
		}
	}
}

// allowedReplySources maps each virtual server of keys in fam and proto
// that this node serves to the reply sources its healthy flows have: its
// real servers (draining ones included) and its in-cluster real servers.
func allowedReplySources[V any](r *Reconciler, keys map[kernel.VirtualServerKey]V, fam kernel.Family, proto kernel.Protocol) map[netip.AddrPort]map[netip.Addr]bool {
	allowed := map[netip.AddrPort]map[netip.Addr]bool{}
	for key := range keys {
		if key.Family != fam || key.Protocol != proto || key.FWMark != 0 {
			continue
		}
		want, ok := r.desired.wantVS(key)
		if !ok {
			continue
		}
		srcs := map[netip.Addr]bool{}
		for _, d := range want.dests {
			srcs[d.addr] = true
		}
		for _, d := range want.inCluster {
			srcs[d.addr] = true
		}
		for d := range r.drains.byVS[key] {
			srcs[d.Address] = true
		}
		allowed[netip.AddrPortFrom(key.Address, key.Port)] = srcs
	}
	return allowed
}

// sweepStale deletes fam's proto entries to a virtual server of allowed
// whose reply source is not one of its allowed sources.
func (r *Reconciler) sweepStale(fam kernel.Family, proto kernel.Protocol, allowed map[netip.AddrPort]map[netip.Addr]bool) {
	if len(allowed) == 0 {
		return
	}
	start := time.Now()
	n, err := r.k.Conntrack.DeleteEntries(fam, proto, func(e kernel.ConntrackEntry) bool {
		srcs, ok := allowed[e.Orig.Dst]
		return ok && !srcs[e.Reply.Src.Addr()]
	})
	r.stats.StaleFlowsDeleted += uint64(n)
	if err != nil {
		r.stats.StaleFlowSweepErrors++
		r.log.Warn("deleting stale conntrack entries", zap.Stringer("family", fam), zap.Stringer("protocol", proto),
			zap.Int("deleted", n), zap.Error(err))
		return
	}
	if n > 0 {
		r.log.Info("deleted stale conntrack entries", zap.Stringer("family", fam), zap.Stringer("protocol", proto),
			zap.Int("deleted", n), zap.Int("servers", len(allowed)), zap.Duration("took", time.Since(start)))
	}
}
