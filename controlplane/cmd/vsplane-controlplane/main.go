// Command vsplane-controlplane watches the API server once and streams each
// node's desired IPVS state to the vsplane agents. Flags and wiring only; see
// package app.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/watch"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/memlimit"
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
		configFile   = flag.String("config", "", "configuration file: a VsplaneConfiguration (config.vsplane.io/v1alpha1) or a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1), YAML or JSON. Precedence: a flag given on the command line > the file > the defaults. The file is checked every --config-check-interval: a valid new version's fleet settings (ipvs, masquerade*, clusterCIDRs, nodePortAddresses, agentReconcilePeriod) are pushed to every node without a restart; an invalid one is logged and not applied; changed controlPlane settings need a restart")
		configCheck  = flag.Duration("config-check-interval", config.DefaultCheckInterval, "how often --config is read for changes")
		kubeconfig   = flag.String("kubeconfig", "", "kubeconfig file (default: in-cluster config)")
		tlsCert      = flag.String("tls-cert-file", "/etc/vsplane/tls/tls.crt", "serving certificate (PEM) of the gRPC listener; reloaded when it changes")
		tlsKey       = flag.String("tls-key-file", "/etc/vsplane/tls/tls.key", "its private key (PEM)")
		tlsCA        = flag.String("tls-ca-file", "/etc/vsplane/tls/ca.crt", "CA bundle (PEM) to verify peer replicas with")
		tlsName      = flag.String("tls-server-name", wire.DefaultServerName, "name in the replicas' certificate, verified when calling peers")
		peerToken    = flag.String("peer-token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token", "token this replica presents to its peers (needs get inspection.vsplane.io)")
		agentSA      = flag.String("agent-service-account", "vsplane-system/vsplane-agent", "comma-separated namespace/name of the ServiceAccounts agents run as")
		insecure     = flag.Bool("insecure-plaintext", false, "local development only: no TLS, no agent authentication, no inspection authorization; --listen must be a loopback address")
		rollouts     = flag.Bool("rollouts", true, "watch SchedulerRollouts (vsplane.io/v1alpha1; the CRD must be installed) and take part in electing their leader")
		rolloutLease = flag.String("rollout-lease", "vsplane-system/vsplane-rollout-leader", "namespace/name of the Lease the replicas elect the rollout leader with")
		advertise    = flag.String("advertise-address", "", "this replica's gRPC address as the other replicas reach it (default: $POD_IP and the --listen port)")
		peerList     = flag.String("peers", "", "comma-separated gRPC addresses of the other replicas (static; see --peer-service)")
		peerService  = flag.String("peer-service", "", "namespace/name of a Service whose EndpointSlices (port \"grpc\") list the replicas, for the fleet-wide inspection view")
		debug        = flag.Bool("debug", false, "debug logging")
	)
	// The settings a --config file can also hold; Source.Load applies the
	// ones given on the command line over the file.
	flagCfg := config.Defaults()
	config.Bind(flag.CommandLine, &flagCfg)
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
	if soft, err := memlimit.Set(memlimit.CgroupFiles); err != nil {
		log.Warn("reading the container's memory limit", zap.Error(err))
	} else if soft > 0 {
		log.Info("Go memory limit set from the container's", zap.Int64("bytes", soft), zap.Float64("fraction", memlimit.Fraction))
	}

	src := config.Source{Path: *configFile, Flags: flag.CommandLine}
	loaded, err := src.Load()
	if err != nil {
		return err
	}
	for _, w := range loaded.Warnings {
		log.Warn(w, zap.String("file", *configFile))
	}
	if *configFile != "" {
		log.Info("configuration file loaded", zap.String("file", *configFile), zap.String("kind", loaded.Kind),
			zap.Strings("overriddenByFlags", config.Explicit(flag.CommandLine)))
	}
	pc := loaded.Config.ControlPlane

	var restCfg *rest.Config
	if *kubeconfig != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		restCfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	restCfg.QPS, restCfg.Burst = float32(pc.KubeAPIQPS), int(pc.KubeAPIQPS*2)
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

	grpcLn, err := net.Listen("tcp", pc.ListenAddress)
	if err != nil {
		return fmt.Errorf("listen %s: %w", pc.ListenAddress, err)
	}
	cfg := app.Config{
		Kube:         kube,
		GRPCListener: grpcLn,
		Watch:        watch.Options{MinInterval: pc.MinSyncInterval.Duration, MaxInterval: pc.MaxSyncInterval.Duration},
		Translate:    loaded.Config.Translate(),
		Logger:       log,
		Stream: stream.Options{AckTimeout: pc.AckTimeout.Duration, UnknownNodeTimeout: pc.UnknownNodeTimeout.Duration,
			MaxUnknownNodeStreams: pc.MaxUnknownNodeStreams, MaxInFlight: pc.MaxInflightDeltas, TargetApplyTime: pc.DeltaTargetApplyTime.Duration,
			MinDeltaOps: pc.MinDeltaOps, MaxDeltaOps: pc.MaxDeltaOps},
		MaxConnectionAge:      pc.MaxConnectionAge.Duration,
		MaxConnectionAgeGrace: pc.MaxConnectionAgeGrace.Duration,
	}
	if pc.MetricsAddress != "" {
		cfg.Profiling = pc.EnableProfiling
		if cfg.MetricsListener, err = net.Listen("tcp", pc.MetricsAddress); err != nil {
			return fmt.Errorf("listen %s: %w", pc.MetricsAddress, err)
		}
	}
	if *configFile != "" {
		cfg.Reload = config.NewReloader(src, loaded, *configCheck, log.Named("config"))
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
		// Reviews go through a client of their own (see AuthAPIQPS).
		authCfg := rest.CopyConfig(typedCfg)
		authCfg.QPS, authCfg.Burst = float32(pc.AuthAPIQPS), int(pc.AuthAPIQPS*2)
		authKube, err := kubernetes.NewForConfig(authCfg)
		if err != nil {
			return err
		}
		cfg.AgentAuth = auth.NewAgents(authKube, accounts...).Node
		cfg.InspectAuth = auth.NewInspectors(authKube).Authorize
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
