package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

func requestCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("request", flag.ContinueOnError)
	fs.SetOutput(stderr)
	proto := fs.String("proto", "tcp", "tcp or udp")
	addr := fs.String("addr", "", "HOST:PORT to send to (required)")
	count := fs.Int("count", 1, "number of requests (1..100000)")
	timeout := fs.Duration("timeout", 2*time.Second, "timeout of each request")
	interval := fs.Duration("interval", 0, "pause between requests")
	sourceFrom := fs.String("source-from", "", "tcp: request i (from 0) leaves from this IPv4 address plus i (the addresses must be on the client)")
	sourcePort := fs.Int("source-port", 0, "the local port of every request (tcp: with --source-from; udp: one fixed source port, so every datagram is the same flow; without it every UDP request leaves from a port of its own)")
	stopFile := fs.String("stop-file", "", "stop before the next request once this file exists (a loop of unknown length: --count is then a bound)")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	if *addr == "" || *count < 1 || *count > 100000 || *timeout <= 0 || *interval < 0 {
		return usageError("request needs --addr, 1 <= --count <= 100000, --timeout > 0, --interval >= 0")
	}
	if *sourcePort < 0 || *sourcePort > 65535 || (*sourcePort > 0 && *proto == "tcp" && *sourceFrom == "") {
		return usageError("--source-port needs 1..65535 (and --source-from with --proto tcp)")
	}
	var from netip.Addr
	if *sourceFrom != "" {
		var err error
		if from, err = netip.ParseAddr(*sourceFrom); err != nil || !from.Is4() || *proto != "tcp" || *sourcePort < 1 || *sourcePort > 65535 {
			return usageError("--source-from needs an IPv4 address, --proto tcp and 1 <= --source-port <= 65535")
		}
	}
	var once func(context.Context) (string, error)
	next := 0
	switch *proto {
	case "tcp":
		once = func(ctx context.Context) (string, error) {
			if !from.IsValid() {
				return tcpOnce(ctx, *addr, *timeout, nil)
			}
			src := from
			for range next {
				src = src.Next()
			}
			next++
			line, err := tcpOnce(ctx, *addr, *timeout, &net.TCPAddr{IP: src.AsSlice(), Port: *sourcePort})
			return src.String() + " " + line, err
		}
	case "udp":
		// Without --source-port every request must be a new flow: a socket
		// closed early frees its ephemeral port, the kernel may hand the same
		// port to a later request, and IPVS (whose UDP entries live for
		// minutes) then sends that request where the first one went. Holding
		// the last heldUDPSockets sockets open until the end keeps their
		// ports distinct.
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		once = func(ctx context.Context) (string, error) {
			if *sourcePort > 0 {
				return udpOnce(ctx, *addr, *timeout, *sourcePort)
			}
			conn, line, err := udpExchange(ctx, *addr, *timeout, 0)
			if conn == nil {
				return line, err
			}
			if len(held) == heldUDPSockets {
				held[0].Close()
				held = held[1:]
			}
			held = append(held, conn)
			return line, err
		}
	default:
		return usageError(fmt.Sprintf("unknown --proto %q", *proto))
	}
	sum := wire.Summary{Backends: map[string]int{}}
	attempts := *count
	for i := 1; i <= *count; i++ {
		if ctx.Err() != nil {
			break
		}
		if *stopFile != "" {
			if _, err := os.Stat(*stopFile); err == nil {
				attempts = i - 1
				break
			}
		}
		started, stalls := time.Now(), startStallWatch()
		line, err := once(ctx)
		stall := stalls.stop()
		if err != nil {
			sum.Fail++
			fmt.Fprintf(stdout, "%d fail: %v [at %s, took %v, longest stall %v]\n", i, err,
				started.UTC().Format("15:04:05.000"), time.Since(started).Round(time.Millisecond), stall.Round(time.Millisecond))
		} else {
			sum.OK++
			answer := line
			if from.IsValid() { // "SOURCE BACKEND ...": count by backend
				_, answer, _ = strings.Cut(line, " ")
			}
			sum.Backends[backendOf(answer)]++
			fmt.Fprintf(stdout, "%d ok %s\n", i, line)
		}
		if *interval > 0 && i < *count {
			select {
			case <-ctx.Done():
			case <-time.After(*interval):
			}
		}
	}
	if err := printSummary(stdout, sum); err != nil {
		return err
	}
	if sum.Fail > 0 || sum.OK < attempts {
		return fmt.Errorf("%d of %d requests failed", attempts-sum.OK, attempts)
	}
	return nil
}

func backendOf(answer string) string {
	if f := strings.Fields(answer); len(f) > 0 {
		return f[0]
	}
	return ""
}

func printSummary(w io.Writer, sum wire.Summary) error {
	data, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s\n", wire.SummaryPrefix, data)
	return err
}

func tcpOnce(ctx context.Context, addr string, timeout time.Duration, local *net.TCPAddr) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := net.Dialer{}
	if local != nil {
		d.LocalAddr = local
		// The same source address and port again (to another destination)
		// while the last connection from it is in TIME_WAIT.
		d.Control = reuseAddr
	}
	witness := newSocketWitness()
	defer witness.close()
	d.Control = witness.control(d.Control)
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", &requestError{err: err, socket: witness.describe()}
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	line, err := bufio.NewReader(conn).ReadString('\n')
	// A server that writes its answer and closes (agnhost serve-hostname
	// --tcp) ends it with EOF, not a newline.
	if err != nil && !(errors.Is(err, io.EOF) && strings.TrimSpace(line) != "") {
		return "", &requestError{err: fmt.Errorf("read answer: %w", err), socket: witness.describe()}
	}
	return strings.TrimSpace(line), nil
}

// requestError is a failed request with what its socket said at the time.
type requestError struct {
	err    error
	socket string
}

func (e *requestError) Error() string {
	if e.socket == "" {
		return e.err.Error()
	}
	return fmt.Sprintf("%v [%s]", e.err, e.socket)
}

func (e *requestError) Unwrap() error { return e.err }

// reuseAddr sets SO_REUSEADDR: the same local port again at once.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}

// heldUDPSockets bounds the UDP sockets one request run keeps open (far
// below the usual 1024 open files, far above any count a test uses to judge
// a round robin).
const heldUDPSockets = 512

// udpOnce sends one datagram, reads the answer and closes the socket.
func udpOnce(ctx context.Context, addr string, timeout time.Duration, localPort int) (string, error) {
	conn, line, err := udpExchange(ctx, addr, timeout, localPort)
	if conn != nil {
		conn.Close()
	}
	return line, err
}

// udpExchange is udpOnce leaving the socket open (when it made one): the
// caller decides when its port may be reused.
func udpExchange(ctx context.Context, addr string, timeout time.Duration, localPort int) (net.Conn, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	if localPort > 0 {
		d.LocalAddr = &net.UDPAddr{Port: localPort}
		d.Control = reuseAddr
	}
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return nil, "", err
	}
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		return conn, "", err
	}
	buf := make([]byte, 2048)
	n, err := conn.Read(buf)
	if err != nil {
		return conn, "", fmt.Errorf("read answer: %w", err)
	}
	return conn, strings.TrimSpace(string(buf[:n])), nil
}

// holdCmd keeps one TCP connection open, sending a line every interval and
// expecting its echo, for duration. It reports the backend that answered.
func holdCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "HOST:PORT to connect to (required)")
	interval := fs.Duration("interval", time.Second, "pause between echoed lines")
	duration := fs.Duration("duration", 10*time.Second, "how long to hold the connection (at most 1h)")
	timeout := fs.Duration("timeout", 2*time.Second, "timeout of the connect and of each echo")
	sourcePort := fs.Int("source-port", 0, "the connection's local port (0: the kernel picks one); another connection may use it at the same time towards another destination")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	if *addr == "" || *interval <= 0 || *duration <= 0 || *duration > time.Hour || *timeout <= 0 || *sourcePort < 0 || *sourcePort > 65535 {
		return usageError("hold needs --addr, --interval > 0, 0 < --duration <= 1h, --timeout > 0, 0 <= --source-port <= 65535")
	}
	dctx, cancel := context.WithTimeout(ctx, *timeout)
	var d net.Dialer
	if *sourcePort > 0 {
		d.LocalAddr = &net.TCPAddr{Port: *sourcePort}
		d.Control = reuseAddr
	}
	conn, err := d.DialContext(dctx, "tcp", *addr)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(*timeout))
	greeting, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	greeting = strings.TrimSpace(greeting)
	backend := backendOf(greeting)
	fmt.Fprintf(stdout, "connected %s\n", greeting)
	sum := wire.Summary{Backends: map[string]int{}}
	end := time.Now().Add(*duration)
	for i := 1; time.Now().Before(end) && ctx.Err() == nil; i++ {
		_ = conn.SetDeadline(time.Now().Add(*timeout))
		line, err := echo(conn, r, fmt.Sprintf("tick %d", i))
		if err != nil {
			sum.Fail++
			fmt.Fprintf(stdout, "%d fail: %v\n", i, err)
			break
		}
		sum.OK++
		sum.Backends[backendOf(line)]++
		fmt.Fprintf(stdout, "%d ok %s\n", i, line)
		select {
		case <-ctx.Done():
		case <-time.After(*interval):
		}
	}
	if err := printSummary(stdout, sum); err != nil {
		return err
	}
	if sum.Fail > 0 {
		return fmt.Errorf("connection to %s (backend %s) broke", *addr, backend)
	}
	return nil
}

func echo(conn net.Conn, r *bufio.Reader, msg string) (string, error) {
	if _, err := fmt.Fprintln(conn, msg); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSpace(line)
	if !strings.HasSuffix(line, "echo: "+msg) {
		return line, fmt.Errorf("unexpected echo %q for %q", line, msg)
	}
	return line, nil
}

// waitCmd polls until a TCP connection to addr succeeds.
func waitCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "HOST:PORT to connect to (required)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	if *addr == "" || *timeout <= 0 {
		return usageError("wait needs --addr and --timeout > 0")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var lastErr error
	for {
		var d net.Dialer
		actx, acancel := context.WithTimeout(ctx, time.Second)
		conn, err := d.DialContext(actx, "tcp", *addr)
		acancel()
		if err == nil {
			conn.Close()
			fmt.Fprintf(stdout, "%s is up\n", *addr)
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%s not reachable within %v", *addr, *timeout), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
