package main

import (
	"context"
	"flag"
	"io"

	"github.com/vsplane/vsplane/e2e/vm/flowlog"
)

// flowCmd keeps one UDP flow (one fixed source port) going while the host
// changes the cluster, logging every attempt (see package flowlog).
func flowCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("flow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := flowlog.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	if err := f.Check(); err != nil {
		return usageError(err.Error())
	}
	attempt := func(ctx context.Context) (string, error) { return udpOnce(ctx, f.Addr, f.Timeout, f.SourcePort) }
	return flowlog.Run(ctx, f.Options, attempt, stdout)
}
