// Command vmexec runs inside the VM test bed and executes commands sent by the
// host (see e2e/vm/wire). /init starts it under busybox init, which respawns it.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/e2e/vm/guest"
)

func main() {
	listen := flag.String("listen", ":7000", "TCP address to serve on")
	logDir := flag.String("log-dir", "/tmp/vmexec", "directory for background processes' logs")
	flag.Parse()

	log, err := zap.NewProduction()
	if err != nil {
		fmt.Fprintln(os.Stderr, "vmexec: logger:", err)
		os.Exit(1)
	}
	defer log.Sync() //nolint:errcheck

	env := []string{
		"PATH=/usr/local/bin:/usr/sbin:/usr/bin",
		"HOME=/root",
		"TMPDIR=/tmp",
	}
	srv, err := guest.NewServer(log, *logDir, env)
	if err != nil {
		log.Fatal("cannot start", zap.Error(err))
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal("cannot listen", zap.String("addr", *listen), zap.Error(err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// The guest's uptime tells boot-time analysis when vmexec became ready.
	uptime, _ := os.ReadFile("/proc/uptime")
	log.Info("vmexec serving", zap.String("addr", ln.Addr().String()), zap.ByteString("uptime", bytes.TrimSpace(uptime)))
	if err := srv.Serve(ctx, ln); err != nil {
		log.Fatal("serve", zap.Error(err))
	}
}
