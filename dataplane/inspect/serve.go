package inspect

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/vsplane/vsplane/internal/grpcserver"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// DefaultAddress is the agent's default inspection address. Loopback only;
// the port is one no Kubernetes component uses by default (kube-proxy has
// 10249 and 10256, the kubelet 10250 and 10255, the controller managers and
// scheduler 10257-10259).
const DefaultAddress = "127.0.0.1:10263"

// unixPrefix selects a Unix socket: unix:///run/vsplane/inspect.sock.
const unixPrefix = "unix://"

// Listen opens addr: "host:port" (TCP) or "unix:///absolute/path". For a
// socket it creates the parent directory and replaces a stale socket left by
// a previous run (but never a file that is not a socket); the socket is
// accessible to its owner only (0600), since the endpoint has no auth.
func Listen(addr string) (net.Listener, error) {
	if !strings.HasPrefix(addr, unixPrefix) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("inspect address %q: want host:port or unix:///path: %w", addr, err)
		}
		// The agent's inspection has no authentication: it stays on the
		// node (hostNetwork agents would otherwise expose it to the network).
		if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("inspect address %q: must be a loopback address or unix:///path (it has no authentication)", addr)
		}
		return net.Listen("tcp", addr)
	}
	path := strings.TrimPrefix(addr, unixPrefix)
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("inspect address %q: socket path must be absolute (unix:///path)", addr)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("inspect socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("inspect socket %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale inspect socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("inspect socket permissions: %w", err)
	}
	return ln, nil
}

// Serve serves s on ln (with health and reflection, so `grpcurl -plaintext
// ADDR list` works) until ctx ends, then stops within a few seconds.
func Serve(ctx context.Context, ln net.Listener, s *Server, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	gs, err := grpcserver.New(grpcserver.Options{Logger: log},
		func(r grpc.ServiceRegistrar) { vsplanev1.RegisterAgentInspectServiceServer(r, s) })
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("inspect server: %w", err)
	}
	log.Info("serving inspection", zap.String("address", ln.Addr().String()))
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-stop.Done()
		gs.Stop(2 * time.Second)
	}()
	err = gs.Serve(ln)
	cancel()
	<-done
	if ctx.Err() != nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}
