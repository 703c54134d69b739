// Command vsplane-agent programs this node's kernel (IPVS, kube-ipvs0,
// ipsets, iptables, sysctls) from the per-node state the vsplane control
// plane streams to it. Wiring only; the command line and the --config
// file (a VsplaneAgentConfiguration) are package agentconfig, the agent is
// package agent.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/agentconfig"
	"github.com/vsplane/vsplane/dataplane/inspect"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/internal/tlsfiles"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vsplane-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	// Every flag, the --config file under them, validated: see agentconfig.
	cl, err := agentconfig.ParseCommandLine(flag.CommandLine, os.Args[1:], os.Getenv)
	if err != nil {
		return err
	}
	c := &cl.Config

	logCfg := zap.NewProductionConfig()
	if c.Debug {
		logCfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	log, err := logCfg.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	if cl.ConfigFile != "" {
		log.Info("configuration file loaded", zap.String("file", cl.ConfigFile), zap.Strings("overriddenByFlags", cl.Overridden))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	families := []kernel.Family{kernel.FamilyIPv4}
	detect := false
	switch c.IPv6 { // validated
	case agentconfig.IPv6Auto:
		detect = true
	case agentconfig.IPv6True:
		families = append(families, kernel.FamilyIPv6)
	}
	cfg := agent.Config{
		ControlPlane: c.ControlPlane,
		NodeName:     cl.NodeName,
		Reconcile: reconcile.Config{Period: c.ReconcilePeriod.Duration, Families: families,
			DrainCheckInterval: c.DrainCheckInterval.Duration, MaxDrain: c.MaxDrain.Duration},
		DetectIPv6:           detect,
		BackoffMax:           c.ReconnectBackoffMax.Duration,
		FirstDeltaTimeout:    c.FirstDeltaTimeout.Duration,
		MaxRemovalShare:      c.MaxRemovalShare,
		RemovalConfirmation:  c.RemovalConfirmation.Duration,
		StateDir:             c.StateDir,
		Logger:               log,
		HealthCheckNodePorts: c.HealthCheckNodePorts,
	}
	if !cl.InsecurePlaintext {
		cli, err := tlsfiles.NewClient(c.TLS.CAFile, c.TLS.ServerName)
		if err != nil {
			return fmt.Errorf("%w (or --insecure-plaintext for local development)", err)
		}
		cfg.TLS, cfg.TokenFile = cli.Config(), c.TokenFile
	}
	if c.MetricsAddress != "" {
		ln, err := net.Listen("tcp", c.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		cfg.MetricsListener = ln
	}
	if c.HealthzAddress != "" {
		ln, err := net.Listen("tcp", c.HealthzAddress)
		if err != nil {
			return fmt.Errorf("healthz listener: %w", err)
		}
		cfg.HealthzListener = ln
	}
	if c.InspectAddress != "" {
		ln, err := inspect.Listen(c.InspectAddress)
		if err != nil {
			return fmt.Errorf("inspect listener: %w", err)
		}
		cfg.InspectListener = ln
	}
	a, err := agent.New(ctx, cfg)
	if err != nil {
		return err
	}
	log.Info("agent starting", zap.String("node", cl.NodeName), zap.Strings("controlplane", c.ControlPlane), zap.String("version", agent.Version))
	return a.Run(ctx)
}
