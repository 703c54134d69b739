// Command kubectl-vsplane is the kubectl plugin `kubectl vsplane`: put it
// on PATH and run `kubectl vsplane status`. See controlplane/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/vsplane/vsplane/controlplane/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
