// Package config is the control plane's configuration file: a versioned
// VsplaneConfiguration (config.vsplane.io/v1alpha1), or an existing
// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) whose IPVS-mode
// fields map to the same settings.
//
// A file has two parts. The fleet settings (the IPVS scheduler and
// timeouts, strictARP, excludeCIDRs, masquerading, nodePortAddresses,
// clusterCIDRs, the agents' reconcile period) become translate.Config: what
// every node receives as its "node/settings" resource. They are applied
// live when the file changes (Reloader). The process settings under
// controlPlane (listen addresses, sync intervals, stream limits) are read
// at start; a change is reported as needing a restart.
//
// Precedence: a flag given on the command line > the file > the defaults
// (Defaults). Decode, Validate, Bind/Overlay and Reloader are the pieces;
// Source ties them together, and ParseCommandLine is the binary's whole
// command line: those flags, the file, and the flags-only settings
// (CommandLine: TLS files, tokens, ServiceAccounts, peers, rollouts).
package config

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/internal/wire"
)

// The kinds a file may hold.
const (
	APIVersion          = "config.vsplane.io/v1alpha1"
	Kind                = "VsplaneConfiguration"
	KubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	KubeProxyKind       = "KubeProxyConfiguration"
)

// VsplaneConfiguration configures the control plane. Fields left out of a
// file keep their defaults (Defaults); durations are Go durations ("30s").
type VsplaneConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// Fleet settings: pushed to every node (node/settings), applied live.

	// IPVS: scheduler, timeouts, strict ARP, excluded CIDRs.
	IPVS IPVSConfiguration `json:"ipvs"`
	// MasqueradeAll SNATs all traffic to Service addresses. Default false.
	MasqueradeAll bool `json:"masqueradeAll"`
	// MasqueradeBit is the packet-mark bit requesting masquerade, 1..31.
	// Default 14 (0 cannot be sent: on the wire it means the default).
	MasqueradeBit int32 `json:"masqueradeBit"`
	// ClusterCIDRs are the pod CIDRs (local-traffic detection). Default none.
	ClusterCIDRs []string `json:"clusterCIDRs"`
	// DetectLocalMode is how agents tell Pod traffic, as kube-proxy's
	// detectLocalMode: ClusterCIDR (by clusterCIDRs; "" means it), NodeCIDR
	// (each node's spec.podCIDRs), BridgeInterface or InterfaceNamePrefix
	// (the interface the traffic arrives on, from detectLocal).
	DetectLocalMode string `json:"detectLocalMode"`
	// DetectLocal names the interface of the interface modes.
	DetectLocal DetectLocalConfiguration `json:"detectLocal"`
	// Conntrack: connection-tracking settings every agent applies, as
	// kube-proxy's conntrack. Default: all 0, the kernel's values stay.
	Conntrack ConntrackConfiguration `json:"conntrack"`
	// NodePortAddresses select the node addresses NodePorts are served on.
	// Default none: every node address.
	NodePortAddresses []string `json:"nodePortAddresses"`
	// AgentReconcilePeriod is the agents' full-reconcile period; 0 (default)
	// keeps each agent's own flag.
	AgentReconcilePeriod metav1.Duration `json:"agentReconcilePeriod"`

	// ControlPlane holds the process settings, read at start: a change
	// needs a restart.
	ControlPlane ControlPlaneConfiguration `json:"controlPlane"`
}

// ConntrackConfiguration is kube-proxy's conntrack configuration; a zero
// value leaves the kernel's setting.
type ConntrackConfiguration struct {
	// MaxPerCore: nf_conntrack_max is MaxPerCore x the node's CPUs, at
	// least Min (host-wide; the table's hashsize is raised to a quarter).
	MaxPerCore int32 `json:"maxPerCore"`
	Min        int32 `json:"min"`
	// TCPEstablishedTimeout, TCPCloseWaitTimeout, UDPTimeout and
	// UDPStreamTimeout set nf_conntrack_*_timeout* (whole seconds).
	TCPEstablishedTimeout metav1.Duration `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   metav1.Duration `json:"tcpCloseWaitTimeout"`
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal=1.
	TCPBeLiberal     bool            `json:"tcpBeLiberal"`
	UDPTimeout       metav1.Duration `json:"udpTimeout"`
	UDPStreamTimeout metav1.Duration `json:"udpStreamTimeout"`
}

// DetectLocalConfiguration is kube-proxy's detectLocal.
type DetectLocalConfiguration struct {
	// BridgeInterface: Pods' traffic arrives on this bridge.
	BridgeInterface string `json:"bridgeInterface"`
	// InterfaceNamePrefix: Pods' traffic arrives on interfaces named so.
	InterfaceNamePrefix string `json:"interfaceNamePrefix"`
}

// The detectLocalMode values (kube-proxy's).
const (
	DetectLocalClusterCIDR         = "ClusterCIDR"
	DetectLocalNodeCIDR            = "NodeCIDR"
	DetectLocalBridgeInterface     = "BridgeInterface"
	DetectLocalInterfaceNamePrefix = "InterfaceNamePrefix"
)

// DetectLocalModes lists the detectLocalMode values.
var DetectLocalModes = []string{DetectLocalClusterCIDR, DetectLocalNodeCIDR, DetectLocalBridgeInterface, DetectLocalInterfaceNamePrefix}

// IPVSConfiguration is the IPVS part of the fleet settings.
type IPVSConfiguration struct {
	// Scheduler of virtual servers that name none. Default "rr".
	Scheduler string `json:"scheduler"`
	// Timeouts; 0 (default) leaves the kernel's value.
	TCPTimeout    metav1.Duration `json:"tcpTimeout"`
	TCPFinTimeout metav1.Duration `json:"tcpFinTimeout"`
	UDPTimeout    metav1.Duration `json:"udpTimeout"`
	// StrictARP sets arp_ignore=1 and arp_announce=2. Default false.
	StrictARP bool `json:"strictARP"`
	// ExcludeCIDRs: virtual servers inside them are never deleted by agents.
	ExcludeCIDRs []string `json:"excludeCIDRs"`
}

// ControlPlaneConfiguration is the process settings of a replica.
type ControlPlaneConfiguration struct {
	// ListenAddress serves gRPC (agents, inspection, health). Default ":18000".
	ListenAddress string `json:"listenAddress"`
	// MetricsAddress serves /metrics; "" disables. Default "127.0.0.1:18001".
	MetricsAddress string `json:"metricsAddress"`
	// EnableProfiling serves Go's /debug/pprof/ handlers on MetricsAddress
	// (as kube-proxy's enableProfiling). Default false: a profile shows
	// memory contents and costs CPU; keep the address loopback-only.
	EnableProfiling bool `json:"enableProfiling"`
	// KubeAPIQPS is the API client's QPS (burst twice that). Default 50.
	KubeAPIQPS float64 `json:"kubeAPIQPS"`
	// AuthAPIQPS is the QPS (burst twice that) of the separate API client
	// that checks agents' and inspectors' tokens (TokenReview,
	// SubjectAccessReview). Default 50. A client apart from the watch
	// client, so reviews and the replica's own requests do not queue
	// behind each other. The limit also paces a fleet's cold start: at
	// 200, 1,000 agents authenticated within 7 s instead of 18 s, but then
	// all their streams sent their full state at once and the replica's
	// peak RSS doubled (2.3 against 1.2 GiB, e2e/fanout) while the last
	// agent was in sync no sooner (35 against 32 s).
	AuthAPIQPS float64 `json:"authAPIQPS"`
	// MinSyncInterval (default 100ms) and MaxSyncInterval (default 1h):
	// the recomputation's longest coalescing wait and periodic resync.
	MinSyncInterval metav1.Duration `json:"minSyncInterval"`
	MaxSyncInterval metav1.Duration `json:"maxSyncInterval"`
	// AckTimeout (default 5m), UnknownNodeTimeout (10m),
	// MaxUnknownNodeStreams (256): see stream.Options.
	AckTimeout            metav1.Duration `json:"ackTimeout"`
	UnknownNodeTimeout    metav1.Duration `json:"unknownNodeTimeout"`
	MaxUnknownNodeStreams int             `json:"maxUnknownNodeStreams"`
	// MaxInflightDeltas (default 2), DeltaTargetApplyTime (250ms),
	// MinDeltaOps (256), MaxDeltaOps (50000): the Delta budget.
	MaxInflightDeltas    int             `json:"maxInflightDeltas"`
	DeltaTargetApplyTime metav1.Duration `json:"deltaTargetApplyTime"`
	MinDeltaOps          int             `json:"minDeltaOps"`
	MaxDeltaOps          int             `json:"maxDeltaOps"`
	// MaxConnectionAge (default 30m; 0 disables) and its grace (30s).
	MaxConnectionAge      metav1.Duration `json:"maxConnectionAge"`
	MaxConnectionAgeGrace metav1.Duration `json:"maxConnectionAgeGrace"`
}

// Defaults returns the configuration of an empty file (and of no file).
func Defaults() VsplaneConfiguration {
	d := func(v time.Duration) metav1.Duration { return metav1.Duration{Duration: v} }
	return VsplaneConfiguration{
		TypeMeta:      metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		IPVS:          IPVSConfiguration{Scheduler: wire.DefaultScheduler},
		MasqueradeBit: wire.DefaultMasqueradeBit,
		ControlPlane: ControlPlaneConfiguration{
			ListenAddress:         ":18000",
			MetricsAddress:        "127.0.0.1:18001",
			KubeAPIQPS:            50,
			AuthAPIQPS:            50,
			MinSyncInterval:       d(100 * time.Millisecond),
			MaxSyncInterval:       d(time.Hour),
			AckTimeout:            d(stream.DefaultAckTimeout),
			UnknownNodeTimeout:    d(stream.DefaultUnknownNodeTimeout),
			MaxUnknownNodeStreams: stream.DefaultMaxUnknownNodeStreams,
			MaxInflightDeltas:     stream.DefaultMaxInFlight,
			DeltaTargetApplyTime:  d(stream.DefaultTargetApplyTime),
			MinDeltaOps:           stream.DefaultMinDeltaOps,
			MaxDeltaOps:           stream.DefaultMaxDeltaOps,
			MaxConnectionAge:      d(30 * time.Minute),
			MaxConnectionAgeGrace: d(30 * time.Second),
		},
	}
}

// Translate returns the fleet settings as the translator's configuration.
// c must be valid (Validate); unparsable CIDRs are skipped.
func (c *VsplaneConfiguration) Translate() translate.Config {
	return translate.Config{
		DefaultScheduler:  c.IPVS.Scheduler,
		TCPTimeout:        c.IPVS.TCPTimeout.Duration,
		TCPFinTimeout:     c.IPVS.TCPFinTimeout.Duration,
		UDPTimeout:        c.IPVS.UDPTimeout.Duration,
		StrictARP:         c.IPVS.StrictARP,
		MasqueradeAll:     c.MasqueradeAll,
		MasqueradeBit:     uint32(c.MasqueradeBit),
		ClusterCIDRs:      prefixes(c.ClusterCIDRs),
		ExcludeCIDRs:      prefixes(c.IPVS.ExcludeCIDRs),
		NodePortAddresses: prefixes(expandNodePortKeywords(c.NodePortAddresses)),
		NodePortPrimary:   slices.Contains(trimmed(c.NodePortAddresses), NodePortPrimary),
		ReconcilePeriod:   c.AgentReconcilePeriod.Duration,
		LocalDetect:       c.localDetect(),
		Conntrack: translate.Conntrack{
			MaxPerCore: uint32(max(c.Conntrack.MaxPerCore, 0)), Min: uint32(max(c.Conntrack.Min, 0)),
			TCPEstablishedTimeout: c.Conntrack.TCPEstablishedTimeout.Duration, TCPCloseWaitTimeout: c.Conntrack.TCPCloseWaitTimeout.Duration,
			TCPBeLiberal: c.Conntrack.TCPBeLiberal, UDPTimeout: c.Conntrack.UDPTimeout.Duration, UDPStreamTimeout: c.Conntrack.UDPStreamTimeout.Duration,
		},
	}.WithDefaults()
}

// localDetect is the translator's form of detectLocalMode (c valid).
func (c *VsplaneConfiguration) localDetect() translate.LocalDetect {
	switch c.DetectLocalMode {
	case DetectLocalNodeCIDR:
		return translate.LocalDetect{Mode: translate.LocalByNodeCIDR}
	case DetectLocalBridgeInterface:
		return translate.LocalDetect{Mode: translate.LocalByBridge, Interface: c.DetectLocal.BridgeInterface}
	case DetectLocalInterfaceNamePrefix:
		return translate.LocalDetect{Mode: translate.LocalByInterfacePrefix, Interface: c.DetectLocal.InterfaceNamePrefix}
	}
	return translate.LocalDetect{Mode: translate.LocalByClusterCIDR}
}

// The keywords nodePortAddresses accepts besides CIDRs, as kube-proxy's
// (v1.37) do.
const (
	// NodePortPrimary: each node's primary address of each family.
	NodePortPrimary = "primary"
	// NodePortLocalhost: 127.0.0.0/8 and ::1/128. IPVS never serves a
	// NodePort on a loopback address (kube-proxy's IPVS mode skips them
	// too), so on its own it leaves NodePorts on no address.
	NodePortLocalhost = "localhost"
	// NodePortAll: 0.0.0.0/0 and ::/0, the same as an empty list.
	NodePortAll = "all"
)

// NodePortKeywords lists the nodePortAddresses keywords.
var NodePortKeywords = []string{NodePortPrimary, NodePortLocalhost, NodePortAll}

// expandNodePortKeywords replaces "localhost" and "all" by their CIDRs and
// drops "primary" (per node: translate.Config.NodePortPrimary).
func expandNodePortKeywords(in []string) []string {
	var out []string
	for _, s := range trimmed(in) {
		switch s {
		case NodePortPrimary:
		case NodePortLocalhost:
			out = append(out, "127.0.0.0/8", "::1/128")
		case NodePortAll:
			out = append(out, "0.0.0.0/0", "::/0")
		default:
			out = append(out, s)
		}
	}
	return out
}

func trimmed(in []string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

func prefixes(in []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range in {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}
