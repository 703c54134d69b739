package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// connectProxyCmd serves HTTP CONNECT on --listen and tunnels to targets
// inside --allow only: the real-node test bed's way for the apiserver on the
// host (its egress selector's "cluster" traffic, through QEMU's hostfwd) to
// reach kubelets and Pods in the VM (logs, exec, port-forward, proxy).
func connectProxyCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("connect-proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", ":7100", "address to serve HTTP CONNECT on")
	allow := fs.String("allow", "198.18.0.0/15", "comma-separated CIDRs targets must be in (the test bed's addresses)")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	var allowed []netip.Prefix
	for _, s := range strings.Split(*allow, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return usageError(fmt.Sprintf("--allow: %v", err))
		}
		allowed = append(allowed, p)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: &connectProxy{allowed: allowed, log: stdout}, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	fmt.Fprintf(stdout, "connect-proxy serving on %s for %s\n", ln.Addr(), *allow)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type connectProxy struct {
	allowed []netip.Prefix
	mu      sync.Mutex
	log     io.Writer
}

func (p *connectProxy) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.log, format+"\n", args...)
}

func (p *connectProxy) permitted(hostport string) error {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return fmt.Errorf("target %q is not IP:PORT", hostport)
	}
	for _, pre := range p.allowed {
		if pre.Contains(ap.Addr().Unmap()) {
			return nil
		}
	}
	return fmt.Errorf("target %s is outside the allowed ranges", hostport)
}

func (p *connectProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "only CONNECT", http.StatusMethodNotAllowed)
		return
	}
	if err := p.permitted(r.Host); err != nil {
		p.logf("refused CONNECT %s: %v", r.Host, err)
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	up, err := net.DialTimeout("tcp", r.Host, 10*time.Second)
	if err != nil {
		p.logf("CONNECT %s: %v", r.Host, err)
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "cannot hijack", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if _, err := down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		up.Close()
		down.Close()
		return
	}
	// Bytes the client sent after its request line are already buffered.
	if n := buf.Reader.Buffered(); n > 0 {
		pending, _ := buf.Reader.Peek(n)
		if _, err := up.Write(pending); err != nil {
			up.Close()
			down.Close()
			return
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(*net.TCPConn); ok {
			_ = c.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	go pipe(up, down)
	go pipe(down, up)
	wg.Wait()
	up.Close()
	down.Close()
}
