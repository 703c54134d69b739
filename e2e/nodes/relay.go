package nodes

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Relay is a relay from a unix socket on the host to a TCP address known
// only later: the apiserver starts before the VM, but its egress selector
// needs the CONNECT proxy's address at start; the relay's socket stands in
// and forwards to the VM's hostfwd once SetTarget is called. Connections
// before that are closed at once.
type Relay struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	done   chan struct{}
	wg     sync.WaitGroup
}

// NewRelay listens on the unix socket sock.
func NewRelay(sock string) (*Relay, error) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// Addr is the relay's socket path.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// SetTarget makes new connections go to addr.
func (r *Relay) SetTarget(addr string) {
	r.mu.Lock()
	r.target = addr
	r.mu.Unlock()
}

// Close stops listening and ends every relayed connection.
func (r *Relay) Close() {
	select {
	case <-r.done:
		return
	default:
	}
	close(r.done)
	r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *Relay) track(c net.Conn, add bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if add {
		select {
		case <-r.done:
			return false
		default:
		}
		r.conns[c] = struct{}{}
	} else {
		delete(r.conns, c)
	}
	return true
}

func (r *Relay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.relay(c)
		}()
	}
}

func (r *Relay) relay(down net.Conn) {
	defer down.Close()
	r.mu.Lock()
	target := r.target
	r.mu.Unlock()
	if target == "" || !r.track(down, true) {
		return
	}
	defer r.track(down, false)
	up, err := net.DialTimeout("tcp", target, 10*time.Second)
	if err != nil {
		return
	}
	if !r.track(up, true) {
		up.Close()
		return
	}
	defer r.track(up, false)
	defer up.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(up, down)
		closeWrite(up)
	}()
	_, _ = io.Copy(down, up)
	closeWrite(down)
	wg.Wait()
}

// closeWrite half-closes a TCP or unix connection: the peer sees EOF and
// can still answer.
func closeWrite(c net.Conn) {
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
}

// DialThroughProxy opens a TCP connection to target (an address inside the
// VM: a node's, a Pod's) through the HTTP CONNECT proxy at proxy (the host
// side of its hostfwd): how host-side tests reach what only the VM routes.
func DialThroughProxy(ctx context.Context, proxy, target string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", proxy)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("CONNECT %s via %s: %w", target, proxy, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("CONNECT %s via %s: %s", target, proxy, resp.Status)
	}
	_ = c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		// The target spoke first and its bytes came with the response.
		return &bufferedConn{Conn: c, r: br}, nil
	}
	return c, nil
}

// bufferedConn reads what the CONNECT response's reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }
