package app

import (
	"fmt"
	"net"

	"go.uber.org/zap"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/watch"
)

// FromCommandLine returns the Config of the replica vsplane-controlplane
// runs with cl (config.ParseCommandLine): the API client configuration of
// cl.Kubeconfig (or the in-cluster one), the listeners of its addresses
// (opened here), the Reloader
// of its --config file, and Security unless cl.InsecurePlaintext. The
// clients themselves are built by New.
func FromCommandLine(cl *config.CommandLine, log *zap.Logger) (cfg Config, err error) {
	if log == nil {
		log = zap.NewNop()
	}
	c := &cl.Loaded.Config
	pc := &c.ControlPlane
	if cl.Kubeconfig != "" {
		cfg.REST, err = clientcmd.BuildConfigFromFlags("", cl.Kubeconfig)
	} else {
		cfg.REST, err = rest.InClusterConfig()
	}
	if err != nil {
		return Config{}, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.KubeAPIQPS, cfg.AuthAPIQPS = pc.KubeAPIQPS, pc.AuthAPIQPS
	cfg.Watch = watch.Options{MinInterval: pc.MinSyncInterval.Duration, MaxInterval: pc.MaxSyncInterval.Duration}
	cfg.Translate = c.Translate()
	cfg.Logger = log
	cfg.Stream = stream.Options{AckTimeout: pc.AckTimeout.Duration, UnknownNodeTimeout: pc.UnknownNodeTimeout.Duration,
		MaxUnknownNodeStreams: pc.MaxUnknownNodeStreams, MaxInFlight: pc.MaxInflightDeltas, TargetApplyTime: pc.DeltaTargetApplyTime.Duration,
		MinDeltaOps: pc.MinDeltaOps, MaxDeltaOps: pc.MaxDeltaOps}
	cfg.MaxConnectionAge, cfg.MaxConnectionAgeGrace = pc.MaxConnectionAge.Duration, pc.MaxConnectionAgeGrace.Duration
	if cl.ConfigFile != "" {
		cfg.Reload = config.NewReloader(cl.Source, cl.Loaded, cl.ConfigCheckInterval, log.Named("config"))
	}
	cfg.Rollouts, cfg.RolloutLease = cl.Rollouts, cl.RolloutLease
	cfg.Peers, cfg.PeerService = cl.Peers, cl.PeerService
	if cl.InsecurePlaintext {
		log.Warn("--insecure-plaintext: no TLS and no authentication; loopback only")
	} else {
		cfg.Security = &Security{CertFile: cl.TLS.CertFile, KeyFile: cl.TLS.KeyFile, AgentServiceAccounts: cl.AgentServiceAccounts,
			CAFile: cl.TLS.CAFile, ServerName: cl.TLS.ServerName, PeerTokenFile: cl.PeerTokenFile,
			CAConfigMap: cl.CAConfigMap}
	}

	if cfg.GRPCListener, err = net.Listen("tcp", pc.ListenAddress); err != nil {
		return Config{}, fmt.Errorf("listen %s: %w", pc.ListenAddress, err)
	}
	cfg.Advertise = cl.AdvertiseAddress
	if cfg.Advertise == "" && cl.PodIP != "" {
		_, port, _ := net.SplitHostPort(cfg.GRPCListener.Addr().String())
		cfg.Advertise = net.JoinHostPort(cl.PodIP, port)
	}
	if pc.MetricsAddress != "" {
		cfg.Profiling = pc.EnableProfiling
		if cfg.MetricsListener, err = net.Listen("tcp", pc.MetricsAddress); err != nil {
			cfg.GRPCListener.Close()
			return Config{}, fmt.Errorf("listen %s: %w", pc.MetricsAddress, err)
		}
	}
	return cfg, nil
}
