// Command vsplane-controlplane watches the API server once and streams each
// node's desired IPVS state to the vsplane agents. Flags and wiring only; see
// package app.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	"github.com/vsplane/vsplane/internal/wire"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vsplane-controlplane:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig    = flag.String("kubeconfig", "", "kubeconfig file (default: in-cluster config)")
		listen        = flag.String("listen", ":18000", "gRPC address (agent stream, inspection, health, reflection)")
		metricsAddr   = flag.String("metrics-address", "127.0.0.1:18001", "address for /metrics; empty disables")
		minSync       = flag.Duration("min-sync-interval", 100*time.Millisecond, "longest coalescing wait between recomputations while changes keep coming (a cheap recomputation waits 4x its duration)")
		maxSync       = flag.Duration("max-sync-interval", time.Hour, "maximum interval between recomputations (periodic resync)")
		scheduler     = flag.String("scheduler", wire.DefaultScheduler, "default IPVS scheduler")
		tcpTimeout    = flag.Duration("ipvs-tcp-timeout", 0, "IPVS TCP timeout; 0 leaves the kernel's value")
		tcpFinTimeout = flag.Duration("ipvs-tcpfin-timeout", 0, "IPVS TCP FIN timeout; 0 leaves the kernel's value")
		udpTimeout    = flag.Duration("ipvs-udp-timeout", 0, "IPVS UDP timeout; 0 leaves the kernel's value")
		strictARP     = flag.Bool("ipvs-strict-arp", false, "set arp_ignore=1 and arp_announce=2 on nodes")
		masqAll       = flag.Bool("masquerade-all", false, "SNAT all traffic to Service addresses")
		masqBit       = flag.Uint("masquerade-bit", wire.DefaultMasqueradeBit, "packet-mark bit requesting masquerade")
		clusterCIDRs  = flag.String("cluster-cidr", "", "comma-separated pod CIDRs (local-traffic detection)")
		excludeCIDRs  = flag.String("ipvs-exclude-cidrs", "", "comma-separated CIDRs whose virtual servers agents never delete")
		npAddrs       = flag.String("nodeport-addresses", "", "comma-separated CIDRs selecting NodePort addresses (empty: all)")
		agentPeriod   = flag.Duration("agent-reconcile-period", 0, "agents' full-reconcile period; 0 keeps each agent's flag")
		qps           = flag.Float64("kube-api-qps", 50, "API server client QPS")
		tlsCert       = flag.String("tls-cert-file", "/etc/vsplane/tls/tls.crt", "serving certificate (PEM) of the gRPC listener; reloaded when it changes")
		tlsKey        = flag.String("tls-key-file", "/etc/vsplane/tls/tls.key", "its private key (PEM)")
		tlsCA         = flag.String("tls-ca-file", "/etc/vsplane/tls/ca.crt", "CA bundle (PEM) to verify peer replicas with")
		tlsName       = flag.String("tls-server-name", wire.DefaultServerName, "name in the replicas' certificate, verified when calling peers")
		peerToken     = flag.String("peer-token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token", "token this replica presents to its peers (needs get inspection.vsplane.io)")
		agentSA       = flag.String("agent-service-account", "vsplane-system/vsplane-agent", "comma-separated namespace/name of the ServiceAccounts agents run as")
		insecure      = flag.Bool("insecure-plaintext", false, "local development only: no TLS, no agent authentication, no inspection authorization; --listen must be a loopback address")
		rollouts      = flag.Bool("rollouts", true, "watch SchedulerRollouts (vsplane.io/v1alpha1; the CRD must be installed) and take part in electing their leader")
		rolloutLease  = flag.String("rollout-lease", "vsplane-system/vsplane-rollout-leader", "namespace/name of the Lease the replicas elect the rollout leader with")
		advertise     = flag.String("advertise-address", "", "this replica's gRPC address as the other replicas reach it (default: $POD_IP and the --listen port)")
		peerList      = flag.String("peers", "", "comma-separated gRPC addresses of the other replicas (static; see --peer-service)")
		peerService   = flag.String("peer-service", "", "namespace/name of a Service whose EndpointSlices (port \"grpc\") list the replicas, for the fleet-wide inspection view")
		connAge       = flag.Duration("max-connection-age", 30*time.Minute, "agent connections end after about this long (±10%), so agents spread over the replicas again after a rollout; 0 disables")
		connAgeGrace  = flag.Duration("max-connection-age-grace", 30*time.Second, "time an aged-out connection's stream gets before it is closed")
		ackTimeout    = flag.Duration("ack-timeout", stream.DefaultAckTimeout, "close an agent stream whose Delta stays unacknowledged this long")
		unknownWait   = flag.Duration("unknown-node-timeout", stream.DefaultUnknownNodeTimeout, "close the stream of an agent whose node is not in the cluster after this long")
		unknownMax    = flag.Int("max-unknown-node-streams", stream.DefaultMaxUnknownNodeStreams, "at most this many streams may wait for nodes that are not in the cluster")
		maxInFlight   = flag.Int("max-inflight-deltas", 2, "Deltas an agent may have unacknowledged at once (2: the next one waits at the agent while it applies one)")
		deltaTarget   = flag.Duration("delta-target-apply-time", stream.DefaultTargetApplyTime, "size each Delta so its agent applies it in about this long, from the kernel-operation rate the agent reports")
		deltaMinOps   = flag.Int("min-delta-ops", stream.DefaultMinDeltaOps, "smallest Delta budget (estimated kernel operations), however slow the agent")
		deltaMaxOps   = flag.Int("max-delta-ops", stream.DefaultMaxDeltaOps, "largest Delta budget (estimated kernel operations), however fast the agent")
		debug         = flag.Bool("debug", false, "debug logging")
	)
	flag.Parse()

	logCfg := zap.NewProductionConfig()
	if *debug {
		logCfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	log, err := logCfg.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	tcfg := translate.Config{
		DefaultScheduler: *scheduler,
		TCPTimeout:       *tcpTimeout,
		TCPFinTimeout:    *tcpFinTimeout,
		UDPTimeout:       *udpTimeout,
		StrictARP:        *strictARP,
		MasqueradeAll:    *masqAll,
		MasqueradeBit:    uint32(*masqBit),
		ReconcilePeriod:  *agentPeriod,
	}
	for _, f := range []struct {
		name string
		in   string
		out  *[]netip.Prefix
	}{{"cluster-cidr", *clusterCIDRs, &tcfg.ClusterCIDRs}, {"ipvs-exclude-cidrs", *excludeCIDRs, &tcfg.ExcludeCIDRs}, {"nodeport-addresses", *npAddrs, &tcfg.NodePortAddresses}} {
		if *f.out, err = parseCIDRs(f.in); err != nil {
			return fmt.Errorf("--%s: %w", f.name, err)
		}
	}
	if *masqBit > 31 {
		return fmt.Errorf("--masquerade-bit %d: must be 0..31", *masqBit)
	}
	if *maxInFlight < 1 {
		return fmt.Errorf("--max-inflight-deltas %d: must be at least 1", *maxInFlight)
	}
	if *deltaTarget <= 0 {
		return fmt.Errorf("--delta-target-apply-time %v: must be positive", *deltaTarget)
	}
	if *deltaMinOps < 1 || *deltaMaxOps < *deltaMinOps {
		return fmt.Errorf("--min-delta-ops %d, --max-delta-ops %d: want 1 <= min <= max", *deltaMinOps, *deltaMaxOps)
	}

	var restCfg *rest.Config
	if *kubeconfig != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		restCfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	restCfg.QPS, restCfg.Burst = float32(*qps), int(*qps*2)
	// Protobuf for the typed client (about half the watch bytes of JSON,
	// measured by e2e/apicost); the dynamic client keeps JSON (CRDs have
	// no protobuf encoding).
	typedCfg := rest.CopyConfig(restCfg)
	typedCfg.ContentType = "application/vnd.kubernetes.protobuf"
	typedCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	kube, err := kubernetes.NewForConfig(typedCfg)
	if err != nil {
		return err
	}

	grpcLn, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	cfg := app.Config{
		Kube:         kube,
		GRPCListener: grpcLn,
		Watch:        watch.Options{MinInterval: *minSync, MaxInterval: *maxSync},
		Translate:    tcfg,
		Logger:       log,
		Stream: stream.Options{AckTimeout: *ackTimeout, UnknownNodeTimeout: *unknownWait,
			MaxUnknownNodeStreams: *unknownMax, MaxInFlight: *maxInFlight, TargetApplyTime: *deltaTarget,
			MinDeltaOps: *deltaMinOps, MaxDeltaOps: *deltaMaxOps},
		MaxConnectionAge:      *connAge,
		MaxConnectionAgeGrace: *connAgeGrace,
	}
	if *metricsAddr != "" {
		if cfg.MetricsListener, err = net.Listen("tcp", *metricsAddr); err != nil {
			return fmt.Errorf("listen %s: %w", *metricsAddr, err)
		}
	}
	cfg.PeerService = *peerService
	if *rollouts {
		if cfg.Dynamic, err = dynamic.NewForConfig(restCfg); err != nil {
			return err
		}
		cfg.Rollouts, cfg.RolloutLease = true, *rolloutLease
	}
	for _, p := range strings.Split(*peerList, ",") {
		if p = strings.TrimSpace(p); p != "" {
			cfg.Peers = append(cfg.Peers, p)
		}
	}
	cfg.Advertise = *advertise
	if cfg.Advertise == "" && os.Getenv("POD_IP") != "" {
		_, port, _ := net.SplitHostPort(grpcLn.Addr().String())
		cfg.Advertise = net.JoinHostPort(os.Getenv("POD_IP"), port)
	}
	if *insecure {
		log.Warn("--insecure-plaintext: no TLS and no authentication; loopback only")
	} else {
		srv, err := tlsfiles.NewServer(*tlsCert, *tlsKey)
		if err != nil {
			return fmt.Errorf("%w (or --insecure-plaintext for local development)", err)
		}
		cfg.TLS = srv.Config()
		var accounts []string
		for _, sa := range strings.Split(*agentSA, ",") {
			if sa = strings.TrimSpace(sa); sa != "" {
				if strings.Count(sa, "/") != 1 {
					return fmt.Errorf("--agent-service-account %q: want namespace/name", sa)
				}
				accounts = append(accounts, sa)
			}
		}
		cfg.AgentAuth = auth.NewAgents(kube, accounts...).Node
		cfg.InspectAuth = auth.NewInspectors(kube).Authorize
		if len(cfg.Peers) > 0 || cfg.PeerService != "" {
			cli, err := tlsfiles.NewClient(*tlsCA, *tlsName)
			if err != nil {
				return fmt.Errorf("peers: %w", err)
			}
			cfg.PeerDialOptions = []grpc.DialOption{
				grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())),
				grpc.WithPerRPCCredentials(bearer.File{Path: *peerToken}),
			}
		}
	}
	replica, err := app.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return replica.Run(ctx)
}

func parseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
