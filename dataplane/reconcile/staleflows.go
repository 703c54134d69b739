package reconcile

import (
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Stale connection-tracking entries of UDP virtual servers, decided the way
// kube-proxy's pkg/proxy/conntrack (CleanStaleEntries) decides, per virtual
// server instead of per sync.
//
// A UDP flow keeps its conntrack entry while it sends (the entry's timeout
// restarts with every datagram). An entry made while nothing served the
// address — the Service deleted and re-created, no endpoints then a first
// one — keeps the decisions of that moment: no IPVS translation in its reply
// tuple, no masquerade. The flow then never reaches the new real server, or
// its replies never come back, until the client pauses for the whole UDP
// timeout. So after a pass wrote a UDP virtual server or its real servers,
// the entries to that server's address and port whose reply source is none
// of its real servers are deleted (one table dump per family; never a
// flush). Entries of healthy flows have a real server as reply source
// (net/ipv4/vs/conntrack=1 makes IPVS rewrite the reply tuple) and stay.
//
// Where kube-proxy differs: it sweeps on every sync and keys NodePorts by
// port alone (any destination address); the agent sweeps only after UDP
// writes, plus once on its first Delta (kube-proxy's first sync: entries
// left by whatever ran before), and keys every virtual server by its own
// address and port (NodePort servers exist per node address). The allowed
// reply sources are the server's real servers (draining ones included) and
// its in-cluster real servers: an entry pointing at an endpoint this node
// does not forward to cannot carry traffic anyway (IPVS expire_nodest_conn).

// noteUDPWrite records a queued write to a UDP virtual server for the sweep
// (a deleted server needs none: nothing answers on it any more).
func (p *pass) noteUDPWrite(op kernel.IPVSOp) {
	key := op.Server.Key
	if key.Protocol != kernel.ProtocolUDP || key.FWMark != 0 || op.Kind == kernel.DeleteVirtualServer {
		return
	}
	if p.udpWritten == nil {
		p.udpWritten = map[kernel.VirtualServerKey]struct{}{}
	}
	p.udpWritten[key] = struct{}{}
}

// sweepStaleFlows deletes the stale entries of the UDP virtual servers the
// pass wrote (every UDP virtual server with all). A failure is logged and
// counted, never a NACK: kube-proxy's sync does not fail on it either, and
// the next sweep tries again.
func (r *Reconciler) sweepStaleFlows(p *pass, all bool) {
	if r.k.Conntrack == nil || (!all && len(p.udpWritten) == 0) {
		return
	}
	for _, fam := range r.families {
		allowed := map[netip.AddrPort]map[netip.Addr]bool{}
		add := func(key kernel.VirtualServerKey) {
			if key.Family != fam || key.Protocol != kernel.ProtocolUDP || key.FWMark != 0 {
				return
			}
			want, ok := r.desired.wantVS(key)
			if !ok {
				return
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
		if all {
			for key := range r.desired.vsOwners {
				add(key)
			}
		} else {
			for key := range p.udpWritten {
				add(key)
			}
		}
		if len(allowed) == 0 {
			continue
		}
		start := time.Now()
		n, err := r.k.Conntrack.DeleteEntries(fam, kernel.ProtocolUDP, func(e kernel.ConntrackEntry) bool {
			srcs, ok := allowed[e.Orig.Dst]
			return ok && !srcs[e.Reply.Src.Addr()]
		})
		r.stats.StaleFlowsDeleted += uint64(n)
		if err != nil {
			r.stats.StaleFlowSweepErrors++
			r.log.Warn("deleting stale UDP conntrack entries", zap.Stringer("family", fam), zap.Int("deleted", n), zap.Error(err))
			continue
		}
		if n > 0 {
			r.log.Info("deleted stale UDP conntrack entries", zap.Stringer("family", fam), zap.Int("deleted", n),
				zap.Int("servers", len(allowed)), zap.Duration("took", time.Since(start)))
		}
	}
}
