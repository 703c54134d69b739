package translate

import (
	"github.com/vsplane/vsplane/internal/wire"
	"net/netip"
	"time"

	"github.com/vsplane/vsplane/controlplane/model"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Config is the engine-level configuration that shapes every node's state.
// Zero values mean defaults (see WithDefaults).
type Config struct {
	// DefaultScheduler is the IPVS scheduler of virtual servers that name none. Default "rr".
	DefaultScheduler string
	// IPVS timeouts; 0 leaves the kernel's value.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
	StrictARP                             bool
	MasqueradeAll                         bool
	// MasqueradeBit is the packet-mark bit requesting masquerade. Default 14 (0 means default).
	MasqueradeBit uint32
	// ClusterCIDRs are the pod CIDRs (local-traffic detection).
	ClusterCIDRs []netip.Prefix
	// ExcludeCIDRs: virtual servers inside them are never deleted by agents.
	ExcludeCIDRs []netip.Prefix
	// NodePortAddresses select NodePort addresses; empty = all node addresses.
	NodePortAddresses []netip.Prefix
	// ReconcilePeriod of the agents' full reconcile; 0 = agent default.
	ReconcilePeriod time.Duration
}

// WithDefaults returns c with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.DefaultScheduler == "" {
		c.DefaultScheduler = wire.DefaultScheduler
	}
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = wire.DefaultMasqueradeBit
	}
	return c
}

// NodeSettings returns the "node/settings" resource body for node.
func NodeSettings(node *model.Node, cfg Config) *vsplanev1.NodeSettings {
	cfg = cfg.WithDefaults()
	ns := &vsplanev1.NodeSettings{
		DefaultScheduler:       cfg.DefaultScheduler,
		TcpTimeoutSeconds:      seconds(cfg.TCPTimeout),
		TcpFinTimeoutSeconds:   seconds(cfg.TCPFinTimeout),
		UdpTimeoutSeconds:      seconds(cfg.UDPTimeout),
		StrictArp:              cfg.StrictARP,
		MasqueradeAll:          cfg.MasqueradeAll,
		MasqueradeBit:          cfg.MasqueradeBit,
		ClusterCidrs:           prefixes(cfg.ClusterCIDRs),
		ExcludeCidrs:           prefixes(cfg.ExcludeCIDRs),
		NodePortAddresses:      prefixes(cfg.NodePortAddresses),
		Zone:                   node.Zone,
		ReconcilePeriodSeconds: seconds(cfg.ReconcilePeriod),
		NodeDeleting:           node.Deleting,
	}
	for _, a := range node.Addresses {
		ns.NodeIps = append(ns.NodeIps, a.String())
	}
	return ns
}

func seconds(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32((d + time.Second - 1) / time.Second)
}

func prefixes(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// UsesNodePortAddresses reports whether Service(in, node, cfg) reads
// cfg.NodePortAddresses for svc. Contract: it is the only field of Config
// that Service reads, and only for a Service with an external or
// load-balancer IP on a port that is one of its NodePorts (is that address
// a NodePort address of the node?); every other field shapes NodeSettings
// only. So a Config change needs the node settings rewritten, and Services
// recomputed only where this is true and NodePortAddresses changed.
func UsesNodePortAddresses(svc *model.Service) bool {
	if svc == nil || len(svc.ExternalIPs)+len(svc.LoadBalancerIPs) == 0 {
		return false
	}
	for _, sp := range svc.Ports {
		if _, ok := nodePortClaiming(svc, sp.Port, sp.Protocol); ok {
			return true
		}
	}
	return false
}
