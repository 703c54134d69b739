// Command vsplane-controlplane watches the API server once and streams each
// node's desired IPVS state to the vsplane agents. It only parses and runs:
// the command line and the --config file (a VsplaneConfiguration) are
// config.ParseCommandLine, the wiring is package app (app.FromCommandLine,
// app.New).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/internal/memlimit"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vsplane-controlplane:", err)
		os.Exit(1)
	}
}

func run() error {
	// Every flag, the --config file under them, validated: see config.
	cl, err := config.ParseCommandLine(flag.CommandLine, os.Args[1:], os.Getenv)
	if err != nil {
		return err
	}

	logCfg := zap.NewProductionConfig()
	if cl.Debug {
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
	for _, w := range cl.Loaded.Warnings {
		log.Warn(w, zap.String("file", cl.ConfigFile))
	}
	if cl.ConfigFile != "" {
		log.Info("configuration file loaded", zap.String("file", cl.ConfigFile), zap.String("kind", cl.Loaded.Kind),
			zap.Strings("overriddenByFlags", cl.Overridden))
	}

	cfg, err := app.FromCommandLine(cl, log)
	if err != nil {
		return err
	}
	replica, err := app.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return replica.Run(ctx)
}
