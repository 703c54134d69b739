// Command kubeenv runs a throw-away etcd + kube-apiserver on 127.0.0.1 (see
// package e2e/kubeenv), writes an admin kubeconfig to --kubeconfig, prints
// it, and serves until SIGINT/SIGTERM or --duration, then cleans up,
// removing the kubeconfig it wrote (it is useless once the server is gone).
//
// Needs the binaries from scripts/kube/build.sh (or --bin / $VSPLANE_KUBE_BIN).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/e2e/kubeenv"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err) // errors already carry a "kubeenv:" prefix
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "write the admin kubeconfig to this path (required)")
	duration := flag.Duration("duration", 0, "stop after this long (0: run until SIGINT/SIGTERM)")
	bin := flag.String("bin", "", "directory with kube-apiserver and etcd (default: $"+kubeenv.EnvBinDir+" or .cache/kube/*/bin)")
	timeout := flag.Duration("start-timeout", 90*time.Second, "bound on start-up")
	keep := flag.Bool("keep-dir", false, "keep the env directory (logs, etcd data) on exit")
	quiet := flag.Bool("quiet", false, "do not print the kubeconfig to stdout")
	flag.Parse()
	if *kubeconfig == "" {
		return errors.New("--kubeconfig is required")
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", flag.Args())
	}
	if *duration < 0 {
		return errors.New("--duration must not be negative")
	}

	log, err := zap.NewDevelopment()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	env, err := kubeenv.Start(ctx, kubeenv.Options{
		BinDir: *bin, StartTimeout: *timeout, KeepDir: *keep, Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := env.Stop(); err != nil {
			log.Warn("stop", zap.Error(err))
		}
	}()

	data, err := os.ReadFile(env.Kubeconfig)
	if err != nil {
		return err
	}
	if dir := filepath.Dir(*kubeconfig); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(*kubeconfig, data, 0o600); err != nil {
		return err
	}
	defer os.Remove(*kubeconfig)
	if !*quiet {
		os.Stdout.Write(data)
	}
	log.Info("kube-apiserver ready; stop with SIGINT/SIGTERM",
		zap.String("kubeconfig", *kubeconfig), zap.String("host", env.Host),
		zap.Duration("startup", env.StartupDuration), zap.Duration("duration", *duration))

	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	<-ctx.Done()
	log.Info("stopping", zap.String("reason", context.Cause(ctx).Error()))
	return nil
}
