package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/internal/configfile"
	"github.com/vsplane/vsplane/internal/wire"
)

// maxIPVSTimeout is the kernel's limit for IPVS timeouts (what the agent
// accepts: (2^31-1) ms in seconds).
const maxIPVSTimeout = (1<<31 - 1) / 1000 * time.Second

// maxSysctlSeconds is the longest conntrack timeout a sysctl holds.
const maxSysctlSeconds = (1<<31 - 1) * time.Second

// Validate checks c and returns every problem found, each naming the field
// path and its value: `ipvs.scheduler "foo": not a known IPVS scheduler`.
func (c *VsplaneConfiguration) Validate() error {
	var errs configfile.Problems
	bad := errs.Add
	if s := c.IPVS.Scheduler; !slices.Contains(model.Schedulers, s) {
		bad("ipvs.scheduler", s, "not a known IPVS scheduler (one of %s)", strings.Join(model.Schedulers, ", "))
	}
	for _, t := range []struct {
		path string
		d    metav1.Duration
	}{{"ipvs.tcpTimeout", c.IPVS.TCPTimeout}, {"ipvs.tcpFinTimeout", c.IPVS.TCPFinTimeout}, {"ipvs.udpTimeout", c.IPVS.UDPTimeout}} {
		switch {
		case t.d.Duration < 0:
			bad(t.path, t.d.Duration, "must be >= 0")
		case t.d.Duration > maxIPVSTimeout:
			bad(t.path, t.d.Duration, "must be <= %v (the kernel's limit)", maxIPVSTimeout)
		}
	}
	cidrs := func(path string, list []string) {
		for i, s := range list {
			if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
				bad(fmt.Sprintf("%s[%d]", path, i), s, "not a CIDR")
			}
		}
	}
	cidrs("ipvs.excludeCIDRs", c.IPVS.ExcludeCIDRs)
	cidrs("clusterCIDRs", c.ClusterCIDRs)
	seen := map[string]bool{}
	for i, s := range c.NodePortAddresses {
		s = strings.TrimSpace(s)
		path := fmt.Sprintf("nodePortAddresses[%d]", i)
		switch {
		case slices.Contains(NodePortKeywords, s) && seen[s]:
			bad(path, s, "duplicate keyword")
		case slices.Contains(NodePortKeywords, s):
			seen[s] = true
		default:
			if _, err := netip.ParsePrefix(s); err != nil {
				bad(path, s, "not a CIDR or one of the keywords %s", strings.Join(NodePortKeywords, ", "))
			}
		}
	}
	for _, n := range []struct {
		path string
		v    int32
	}{{"conntrack.maxPerCore", c.Conntrack.MaxPerCore}, {"conntrack.min", c.Conntrack.Min}} {
		if n.v < 0 {
			bad(n.path, n.v, "must be >= 0 (0 leaves the kernel's value)")
		}
	}
	for _, t := range []struct {
		path string
		d    metav1.Duration
	}{{"conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout}, {"conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout},
		{"conntrack.udpTimeout", c.Conntrack.UDPTimeout}, {"conntrack.udpStreamTimeout", c.Conntrack.UDPStreamTimeout}} {
		switch {
		case t.d.Duration < 0:
			bad(t.path, t.d.Duration, "must be >= 0 (0 leaves the kernel's value)")
		case t.d.Duration > maxSysctlSeconds:
			bad(t.path, t.d.Duration, "must be <= %v (a sysctl's int)", maxSysctlSeconds)
		}
	}
	switch m := c.DetectLocalMode; m {
	case "", DetectLocalClusterCIDR, DetectLocalNodeCIDR:
	case DetectLocalBridgeInterface:
		if err := wire.CheckInterfaceName(c.DetectLocal.BridgeInterface, false); err != nil {
			bad("detectLocal.bridgeInterface", c.DetectLocal.BridgeInterface, "%v (detectLocalMode %s)", err, m)
		}
	case DetectLocalInterfaceNamePrefix:
		if err := wire.CheckInterfaceName(c.DetectLocal.InterfaceNamePrefix, true); err != nil {
			bad("detectLocal.interfaceNamePrefix", c.DetectLocal.InterfaceNamePrefix, "%v (detectLocalMode %s)", err, m)
		}
	default:
		bad("detectLocalMode", m, "not one of %s", strings.Join(DetectLocalModes, ", "))
	}
	if b := c.MasqueradeBit; b < 1 || b > 31 {
		bad("masqueradeBit", b, "must be 1..31 (0 cannot be sent: agents read it as the default %d)", Defaults().MasqueradeBit)
	}
	if d := c.AgentReconcilePeriod.Duration; d < 0 {
		bad("agentReconcilePeriod", d, "must be >= 0")
	}

	p := &c.ControlPlane
	if _, _, err := net.SplitHostPort(p.ListenAddress); err != nil {
		bad("controlPlane.listenAddress", p.ListenAddress, "want host:port")
	}
	if p.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(p.MetricsAddress); err != nil {
			bad("controlPlane.metricsAddress", p.MetricsAddress, "want host:port, or empty to disable")
		}
	}
	if p.EnableProfiling && p.MetricsAddress == "" {
		bad("controlPlane.enableProfiling", true, "needs controlPlane.metricsAddress (profiles are served there)")
	}
	if p.KubeAPIQPS <= 0 {
		bad("controlPlane.kubeAPIQPS", p.KubeAPIQPS, "must be > 0")
	}
	if p.AuthAPIQPS <= 0 {
		bad("controlPlane.authAPIQPS", p.AuthAPIQPS, "must be > 0")
	}
	positive := func(path string, d metav1.Duration) {
		if d.Duration <= 0 {
			bad(path, d.Duration, "must be > 0")
		}
	}
	positive("controlPlane.minSyncInterval", p.MinSyncInterval)
	positive("controlPlane.maxSyncInterval", p.MaxSyncInterval)
	if p.MinSyncInterval.Duration > p.MaxSyncInterval.Duration {
		bad("controlPlane.minSyncInterval", p.MinSyncInterval.Duration, "must be <= controlPlane.maxSyncInterval (%v)", p.MaxSyncInterval.Duration)
	}
	positive("controlPlane.ackTimeout", p.AckTimeout)
	positive("controlPlane.unknownNodeTimeout", p.UnknownNodeTimeout)
	positive("controlPlane.deltaTargetApplyTime", p.DeltaTargetApplyTime)
	if p.MaxUnknownNodeStreams < 0 {
		bad("controlPlane.maxUnknownNodeStreams", p.MaxUnknownNodeStreams, "must be >= 0")
	}
	if p.MaxInflightDeltas < 1 {
		bad("controlPlane.maxInflightDeltas", p.MaxInflightDeltas, "must be >= 1")
	}
	if p.MinDeltaOps < 1 {
		bad("controlPlane.minDeltaOps", p.MinDeltaOps, "must be >= 1")
	}
	if p.MaxDeltaOps < p.MinDeltaOps {
		bad("controlPlane.maxDeltaOps", p.MaxDeltaOps, "must be >= controlPlane.minDeltaOps (%d)", p.MinDeltaOps)
	}
	if d := p.MaxConnectionAge.Duration; d < 0 {
		bad("controlPlane.maxConnectionAge", d, "must be >= 0 (0 disables)")
	}
	if d := p.MaxConnectionAgeGrace.Duration; d < 0 {
		bad("controlPlane.maxConnectionAgeGrace", d, "must be >= 0")
	}
	return errs.Err()
}
