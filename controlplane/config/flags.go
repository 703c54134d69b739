package config

import (
	"flag"
	"time"

	"github.com/vsplane/vsplane/internal/configfile"
)

// overrides is appended to the help of every flag the file can also set.
const overrides = " (overrides --config)"

// Bind registers on fs one flag per setting the file can hold, each bound
// to its field of c, with c's current values as defaults. The flag names
// are the control plane's historical ones (--scheduler, --listen, ...).
func Bind(fs *flag.FlagSet, c *VsplaneConfiguration) {
	p := &c.ControlPlane
	dur := func(d *time.Duration, name, usage string) { fs.DurationVar(d, name, *d, usage+overrides) }
	// Fleet settings.
	fs.StringVar(&c.IPVS.Scheduler, "scheduler", c.IPVS.Scheduler, "default IPVS scheduler"+overrides)
	dur(&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", "IPVS TCP timeout; 0 leaves the kernel's value")
	dur(&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", "IPVS TCP FIN timeout; 0 leaves the kernel's value")
	dur(&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", "IPVS UDP timeout; 0 leaves the kernel's value")
	fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", c.IPVS.StrictARP, "set arp_ignore=1 and arp_announce=2 on nodes"+overrides)
	fs.BoolVar(&c.MasqueradeAll, "masquerade-all", c.MasqueradeAll, "SNAT all traffic to Service addresses"+overrides)
	fs.Var((*configfile.Int32Value)(&c.MasqueradeBit), "masquerade-bit", "packet-mark bit requesting masquerade, 1..31"+overrides)
	fs.Var((*configfile.ListValue)(&c.ClusterCIDRs), "cluster-cidr", "comma-separated pod CIDRs (local-traffic detection)"+overrides)
	fs.StringVar(&c.DetectLocalMode, "detect-local-mode", c.DetectLocalMode, "how agents tell Pod traffic: ClusterCIDR (default), NodeCIDR, BridgeInterface, InterfaceNamePrefix"+overrides)
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", c.DetectLocal.BridgeInterface, "the Pods' bridge (--detect-local-mode BridgeInterface)"+overrides)
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix, "prefix of the Pods' host-side interfaces (--detect-local-mode InterfaceNamePrefix)"+overrides)
	fs.Var((*configfile.ListValue)(&c.IPVS.ExcludeCIDRs), "ipvs-exclude-cidrs", "comma-separated CIDRs whose virtual servers agents never delete"+overrides)
	fs.Var((*configfile.ListValue)(&c.NodePortAddresses), "nodeport-addresses", "comma-separated CIDRs selecting NodePort addresses, or the keywords primary (the node's primary address per family), localhost, all (empty: all)"+overrides)
	dur(&c.AgentReconcilePeriod.Duration, "agent-reconcile-period", "agents' full-reconcile period; 0 keeps each agent's flag")
	// Process settings.
	fs.StringVar(&p.ListenAddress, "listen", p.ListenAddress, "gRPC address (agent stream, inspection, health, reflection)"+overrides)
	fs.StringVar(&p.MetricsAddress, "metrics-address", p.MetricsAddress, "address for /metrics; empty disables"+overrides)
	fs.BoolVar(&p.EnableProfiling, "profiling", p.EnableProfiling, "serve /debug/pprof/ on --metrics-address"+overrides)
	fs.Float64Var(&p.KubeAPIQPS, "kube-api-qps", p.KubeAPIQPS, "API server client QPS"+overrides)
	fs.Float64Var(&p.AuthAPIQPS, "auth-api-qps", p.AuthAPIQPS, "QPS of the API client that reviews agents' and inspectors' tokens (TokenReview, SubjectAccessReview)"+overrides)
	dur(&p.MinSyncInterval.Duration, "min-sync-interval", "longest coalescing wait between recomputations while changes keep coming (a cheap recomputation waits 4x its duration)")
	dur(&p.MaxSyncInterval.Duration, "max-sync-interval", "maximum interval between recomputations (periodic resync)")
	dur(&p.AckTimeout.Duration, "ack-timeout", "close an agent stream whose Delta stays unacknowledged this long")
	dur(&p.UnknownNodeTimeout.Duration, "unknown-node-timeout", "close the stream of an agent whose node is not in the cluster after this long")
	fs.IntVar(&p.MaxUnknownNodeStreams, "max-unknown-node-streams", p.MaxUnknownNodeStreams, "at most this many streams may wait for nodes that are not in the cluster"+overrides)
	fs.IntVar(&p.MaxInflightDeltas, "max-inflight-deltas", p.MaxInflightDeltas, "Deltas an agent may have unacknowledged at once (2: the next one waits at the agent while it applies one)"+overrides)
	dur(&p.DeltaTargetApplyTime.Duration, "delta-target-apply-time", "size each Delta so its agent applies it in about this long, from the kernel-operation rate the agent reports")
	fs.IntVar(&p.MinDeltaOps, "min-delta-ops", p.MinDeltaOps, "smallest Delta budget (estimated kernel operations), however slow the agent"+overrides)
	fs.IntVar(&p.MaxDeltaOps, "max-delta-ops", p.MaxDeltaOps, "largest Delta budget (estimated kernel operations), however fast the agent"+overrides)
	dur(&p.MaxConnectionAge.Duration, "max-connection-age", "agent connections end after about this long (±10%), so agents spread over the replicas again after a rollout; 0 disables")
	dur(&p.MaxConnectionAgeGrace.Duration, "max-connection-age-grace", "time an aged-out connection's stream gets before it is closed")
}

// Overlay sets on dst the settings whose flags were given explicitly on
// set (flag.Visit: only flags set on the command line), so a flag
// overrides the file. Flags of set that Bind does not know are ignored.
func Overlay(dst *VsplaneConfiguration, set *flag.FlagSet) error {
	return configfile.Overlay(set, func(fs *flag.FlagSet) { Bind(fs, dst) })
}

// Explicit returns the names of the flags of set that Bind knows and the
// command line set, for the log.
func Explicit(set *flag.FlagSet) []string {
	return configfile.Explicit(set, func(fs *flag.FlagSet) {
		c := Defaults()
		Bind(fs, &c)
	})
}
