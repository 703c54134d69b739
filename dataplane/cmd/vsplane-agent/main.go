// Command vsplane-agent programs this node's kernel (IPVS, kube-ipvs0,
// ipsets, iptables, sysctls) from the per-node state the vsplane control
// plane streams to it. Flags and wiring only; see package agent.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/inspect"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	"github.com/vsplane/vsplane/internal/wire"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vsplane-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		controlPlane = flag.String("controlplane", "", "control-plane replicas' gRPC addresses (host:port, comma-separated); every reconnect tries another one")
		tlsCA        = flag.String("tls-ca-file", "/etc/vsplane/tls/ca.crt", "CA bundle (PEM) that signed the control plane's certificate; reloaded when it changes")
		tlsName      = flag.String("tls-server-name", wire.DefaultServerName, "name to verify in the control plane's certificate, whatever address is dialled")
		tokenFile    = flag.String("token-file", "/var/run/secrets/vsplane/token", "projected ServiceAccount token (audience \"vsplane\"), re-read at every reconnect")
		insecure     = flag.Bool("insecure-plaintext", false, "local development only: no TLS and no token; every --controlplane address must be on loopback")
		firstDelta   = flag.Duration("first-delta-timeout", 30*time.Second, "try another control-plane replica when one sends no first Delta within this time (it is still computing its first full state)")
		removalShare = flag.Float64("max-removal-share", 0.5, "hold a first Delta after (re)connect that would remove more than this share of the node's Services until the control plane confirms it (1 disables)")
		removalWait  = flag.Duration("removal-confirmation", 30*time.Second, "how long such a Delta is held before the agent asks the control plane again and applies it if it still says the same")
		nodeName     = flag.String("node-name", os.Getenv("NODE_NAME"), "this node's Kubernetes Node name (default $NODE_NAME)")
		period       = flag.Duration("reconcile-period", 30*time.Second, "period of the full reconcile against the kernel")
		ipv6         = flag.String("ipv6", "auto", "manage IPv6 too (ip6tables, KUBE-6- sets): auto (when the node has a global IPv6 address, like kube-proxy's dual-stack detection), true or false")
		metricsAddr  = flag.String("metrics-address", "127.0.0.1:10249", "address for /metrics and /healthz; empty disables")
		healthzAddr  = flag.String("healthz-address", "0.0.0.0:10256", "address for /healthz and /livez only, probed by load balancers (kube-proxy's --healthz-bind-address); empty disables")
		backoffMax   = flag.Duration("reconnect-backoff-max", 30*time.Second, "upper bound of the reconnect delay")
		stateDir     = flag.String("state-dir", "/run/vsplane", "where the agent keeps its applied state across restarts (use a tmpfs); empty disables")
		debug        = flag.Bool("debug", false, "debug logging")
		drainCheck   = flag.Duration("drain-check-interval", 5*time.Second, "how often draining (weight-0) TCP real servers are checked for connections")
		inspectAddr  = flag.String("inspect-address", inspect.DefaultAddress, "read-only inspection gRPC endpoint (grpcurl): host:port (keep it on loopback) or unix:///run/vsplane/inspect.sock; empty disables")
		maxDrain     = flag.Duration("max-drain", 10*time.Minute, "a draining real server still holding connections this long is deleted anyway")
		healthPorts  = flag.Bool("health-check-node-ports", true, "serve the healthCheckNodePort of externalTrafficPolicy: Local Services (kube-proxy's service health server)")
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

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *removalShare <= 0 || *firstDelta <= 0 || *removalWait <= 0 {
		return fmt.Errorf("--max-removal-share, --first-delta-timeout and --removal-confirmation must be > 0, got %v, %v and %v",
			*removalShare, *firstDelta, *removalWait)
	}
	if *drainCheck <= 0 || *maxDrain <= 0 {
		return fmt.Errorf("--drain-check-interval and --max-drain must be > 0, got %v and %v", *drainCheck, *maxDrain)
	}
	families := []kernel.Family{kernel.FamilyIPv4}
	detect := false
	switch *ipv6 {
	case "auto":
		detect = true
	case "true":
		families = append(families, kernel.FamilyIPv6)
	case "false":
	default:
		return fmt.Errorf("--ipv6 %q: want auto, true or false", *ipv6)
	}
	cfg := agent.Config{
		ControlPlane: *controlPlane,
		NodeName:     *nodeName,
		Reconcile: reconcile.Config{Period: *period, Families: families,
			DrainCheckInterval: *drainCheck, MaxDrain: *maxDrain},
		DetectIPv6:           detect,
		BackoffMax:           *backoffMax,
		FirstDeltaTimeout:    *firstDelta,
		MaxRemovalShare:      *removalShare,
		RemovalConfirmation:  *removalWait,
		StateDir:             *stateDir,
		Logger:               log,
		HealthCheckNodePorts: *healthPorts,
	}
	if !*insecure {
		cli, err := tlsfiles.NewClient(*tlsCA, *tlsName)
		if err != nil {
			return fmt.Errorf("%w (or --insecure-plaintext for local development)", err)
		}
		cfg.TLS, cfg.TokenFile = cli.Config(), *tokenFile
	}
	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		cfg.MetricsListener = ln
	}
	if *healthzAddr != "" {
		ln, err := net.Listen("tcp", *healthzAddr)
		if err != nil {
			return fmt.Errorf("healthz listener: %w", err)
		}
		cfg.HealthzListener = ln
	}
	if *inspectAddr != "" {
		ln, err := inspect.Listen(*inspectAddr)
		if err != nil {
			return fmt.Errorf("inspect listener: %w", err)
		}
		cfg.InspectListener = ln
	}
	a, err := agent.New(ctx, cfg)
	if err != nil {
		return err
	}
	log.Info("agent starting", zap.String("node", *nodeName), zap.String("controlplane", *controlPlane), zap.String("version", agent.Version))
	return a.Run(ctx)
}
