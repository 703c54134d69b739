package translate

import (
	"net/netip"
	"slices"
	"time"

	"github.com/vsplane/vsplane/internal/wire"

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
	// NodePortAddresses select NodePort addresses; a family with none of
	// them (and no primary address from NodePortPrimary) serves NodePorts on
	// all its node addresses.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary adds each node's primary address of each family (the
	// first of that family in Node.status.addresses, as a /32 or /128):
	// kube-proxy's nodePortAddresses keyword "primary". Per node, so it
	// cannot be folded into NodePortAddresses.
	NodePortPrimary bool
	// ReconcilePeriod of the agents' full reconcile; 0 = agent default.
	ReconcilePeriod time.Duration
	// LocalDetect is how agents tell Pod traffic (kube-proxy's
	// detectLocalMode); the zero value detects by ClusterCIDRs.
	LocalDetect LocalDetect
	// Conntrack is kube-proxy's conntrack configuration (zero: leave).
	Conntrack Conntrack
}

// Conntrack is kube-proxy's conntrack configuration; zero values leave the
// kernel's settings.
type Conntrack struct {
	MaxPerCore, Min                            uint32
	TCPEstablishedTimeout, TCPCloseWaitTimeout time.Duration
	TCPBeLiberal                               bool
	UDPTimeout, UDPStreamTimeout               time.Duration
}

// LocalDetect is kube-proxy's detectLocalMode with its interface.
type LocalDetect struct {
	Mode LocalDetectMode
	// Interface: the bridge (LocalByBridge) or the interface name prefix
	// (LocalByInterfacePrefix).
	Interface string
}

// LocalDetectMode says what tells Pod traffic.
type LocalDetectMode uint8

const (
	LocalByClusterCIDR     LocalDetectMode = iota // Config.ClusterCIDRs
	LocalByNodeCIDR                               // each node's spec.podCIDRs
	LocalByBridge                                 // arriving on LocalDetect.Interface
	LocalByInterfacePrefix                        // arriving on an interface named LocalDetect.Interface*
)

// wire is the mode's NodeSettings enum.
func (m LocalDetectMode) wire() vsplanev1.LocalDetectMode {
	switch m {
	case LocalByNodeCIDR:
		return vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_NODE_CIDR
	case LocalByBridge:
		return vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_BRIDGE_INTERFACE
	case LocalByInterfacePrefix:
		return vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_INTERFACE_NAME_PREFIX
	}
	return vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_CLUSTER_CIDR
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
		NodePortAddresses:      prefixes(cfg.nodePortPrefixes(node)),
		Zone:                   node.Zone,
		ReconcilePeriodSeconds: seconds(cfg.ReconcilePeriod),
		NodeDeleting:           node.Deleting,
		LocalDetectMode:        cfg.LocalDetect.Mode.wire(),
		NodePodCidrs:           prefixes(node.PodCIDRs),
	}
	if ct := cfg.Conntrack; ct != (Conntrack{}) {
		ns.Conntrack = &vsplanev1.ConntrackSettings{MaxPerCore: ct.MaxPerCore, Min: ct.Min,
			TcpEstablishedTimeoutSeconds: seconds(ct.TCPEstablishedTimeout), TcpCloseWaitTimeoutSeconds: seconds(ct.TCPCloseWaitTimeout),
			TcpBeLiberal: ct.TCPBeLiberal, UdpTimeoutSeconds: seconds(ct.UDPTimeout), UdpStreamTimeoutSeconds: seconds(ct.UDPStreamTimeout)}
	}
	switch cfg.LocalDetect.Mode {
	case LocalByBridge, LocalByInterfacePrefix:
		ns.LocalInterface = cfg.LocalDetect.Interface
	}
	for _, a := range node.Addresses {
		ns.NodeIps = append(ns.NodeIps, a.String())
	}
	return ns
}

// nodePortPrefixes are the CIDRs that select node's NodePort addresses:
// NodePortAddresses plus, with NodePortPrimary, the node's primary address
// of each family. A node without addresses adds none (kube-proxy then pins
// "primary" to loopback, which serves no NodePort, and falls back to every
// address of a family without CIDRs, as the agent does).
func (c Config) nodePortPrefixes(node *model.Node) []netip.Prefix {
	if !c.NodePortPrimary {
		return c.NodePortAddresses
	}
	out := slices.Clone(c.NodePortAddresses)
	var have4, have6 bool
	for _, a := range node.Addresses {
		switch {
		case a.Is4() && !have4:
			have4 = true
		case a.Is6() && !have6:
			have6 = true
		default:
			continue
		}
		if p := netip.PrefixFrom(a, a.BitLen()); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// NodePortSelectionEqual reports whether a and b select the same NodePort
// addresses on every node.
func NodePortSelectionEqual(a, b Config) bool {
	return a.NodePortPrimary == b.NodePortPrimary && slices.Equal(a.NodePortAddresses, b.NodePortAddresses)
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
// recomputed only where this is true and NodePortAddresses changed. It
// counts every NodePort and external IP of svc, also those Input.Conflicts
// may leave out.
func UsesNodePortAddresses(svc *model.Service) bool {
	if svc == nil || len(svc.ExternalIPs)+len(svc.LoadBalancerIPs) == 0 {
		return false
	}
	for _, sp := range svc.Ports {
		if _, ok := nodePortClaiming(svc, Conflicts{}, sp.Port, sp.Protocol); ok {
			return true
		}
	}
	return false
}
