// Command vsplane-agent programs this node's kernel (IPVS, kube-ipvs0,
// ipsets, iptables, sysctls) from the per-node state the vsplane control
// plane streams to it. It only parses and runs: the command line and the
// --config file (a VsplaneAgentConfiguration) are package agentconfig, the
// wiring is package agent (agent.FromCommandLine, agent.New).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/agentconfig"
	"github.com/vsplane/vsplane/internal/memlimit"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vsplane-agent:", err)
		os.Exit(1)
	}
}

// agentGCPercent is the agent's default GOGC (see run).
const agentGCPercent = 50

func run() error {
	started := agent.ProcessStart()
	// Every flag, the --config file under them, validated: see agentconfig.
	cl, err := agentconfig.ParseCommandLine(flag.CommandLine, os.Args[1:], os.Getenv)
	if err != nil {
		return err
	}

	logCfg := zap.NewProductionConfig()
	if cl.Config.Debug {
		logCfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	log, err := logCfg.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	// As the control plane: under a container limit, collect harder near it
	// rather than be OOM-killed with garbage on the heap (a cold start at
	// 10k Services allocates several times what it keeps).
	if soft, err := memlimit.Set(memlimit.CgroupFiles); err != nil {
		log.Warn("reading the container's memory limit", zap.Error(err))
	} else if soft > 0 {
		log.Info("Go memory limit set from the container's", zap.Int64("bytes", soft), zap.Float64("fraction", memlimit.Fraction))
	}
	// Collect at 50% heap growth, not Go's 100%: the agent's peak is its
	// live heap times (1 + GOGC/100), and a node agent's memory is the
	// node's (Calico's Felix defaults to 40). Measured in the TCG VM, agent
	// alone at 10k Services, peak RSS over cold start and two full passes:
	// 148 MB at 100, 127 MB at 50, 126 MB at 40; GC's share of the
	// agent's CPU about 1% (gctrace). GOGC overrides.
	if pct, fromEnv := memlimit.SetGCPercent(agentGCPercent); fromEnv {
		log.Info("Go GC target from GOGC", zap.Int("percent", pct))
	}
	if cl.ConfigFile != "" {
		log.Info("configuration file loaded", zap.String("file", cl.ConfigFile), zap.Strings("overriddenByFlags", cl.Overridden))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := agent.FromCommandLine(cl, log)
	if err != nil {
		return err
	}
	cfg.ProcessStart = started
	a, err := agent.New(ctx, cfg)
	if err != nil {
		return err
	}
	log.Info("agent starting", zap.String("node", cl.NodeName), zap.Strings("controlplane", cfg.ControlPlane), zap.String("version", agent.Version))
	return a.Run(ctx)
}
