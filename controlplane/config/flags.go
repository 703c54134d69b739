package config

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
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
	fs.Var((*int32Value)(&c.MasqueradeBit), "masquerade-bit", "packet-mark bit requesting masquerade, 1..31"+overrides)
	fs.Var((*listValue)(&c.ClusterCIDRs), "cluster-cidr", "comma-separated pod CIDRs (local-traffic detection)"+overrides)
	fs.Var((*listValue)(&c.IPVS.ExcludeCIDRs), "ipvs-exclude-cidrs", "comma-separated CIDRs whose virtual servers agents never delete"+overrides)
	fs.Var((*listValue)(&c.NodePortAddresses), "nodeport-addresses", "comma-separated CIDRs selecting NodePort addresses (empty: all)"+overrides)
	dur(&c.AgentReconcilePeriod.Duration, "agent-reconcile-period", "agents' full-reconcile period; 0 keeps each agent's flag")
	// Process settings.
	fs.StringVar(&p.ListenAddress, "listen", p.ListenAddress, "gRPC address (agent stream, inspection, health, reflection)"+overrides)
	fs.StringVar(&p.MetricsAddress, "metrics-address", p.MetricsAddress, "address for /metrics; empty disables"+overrides)
	fs.Float64Var(&p.KubeAPIQPS, "kube-api-qps", p.KubeAPIQPS, "API server client QPS"+overrides)
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
	bound := flag.NewFlagSet("config", flag.ContinueOnError)
	Bind(bound, dst)
	var err error
	set.Visit(func(f *flag.Flag) {
		if bound.Lookup(f.Name) == nil || err != nil {
			return
		}
		if e := bound.Set(f.Name, f.Value.String()); e != nil {
			err = fmt.Errorf("--%s: %w", f.Name, e)
		}
	})
	return err
}

// Explicit returns the names of the flags of set that Bind knows and the
// command line set, for the log.
func Explicit(set *flag.FlagSet) []string {
	bound := flag.NewFlagSet("config", flag.ContinueOnError)
	c := Defaults()
	Bind(bound, &c)
	var out []string
	set.Visit(func(f *flag.Flag) {
		if bound.Lookup(f.Name) != nil {
			out = append(out, f.Name)
		}
	})
	return out
}

// listValue is a comma-separated list flag; String round-trips through Set.
type listValue []string

func (l *listValue) String() string { return strings.Join(*l, ",") }

func (l *listValue) Set(s string) error {
	*l = nil
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			*l = append(*l, f)
		}
	}
	return nil
}

type int32Value int32

func (v *int32Value) String() string { return strconv.Itoa(int(*v)) }

func (v *int32Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return err
	}
	*v = int32Value(n)
	return nil
}
