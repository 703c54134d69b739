// Command sctphelper is e2ehelper's SCTP counterpart for the VM test bed
// (busybox has no SCTP tool, Go's net package has no SCTP). It uses one-to-one
// style SCTP sockets (SOCK_STREAM, IPPROTO_SCTP) through raw syscalls:
//
//	sctphelper serve   --name NAME --addr :PORT
//	sctphelper request --addr HOST:PORT [--count N] [--timeout D]
//	sctphelper flow    --addr HOST:PORT --source-port P --phase-file PATH --stop-file PATH [--interval D] [--timeout D] [--max N]
//
// serve answers each association with "NAME from IP:PORT\n" (the peer as the
// server saw it), and again for every message the peer sends; it prints
// "ready" once it listens. request prints one line per attempt and a final
// wire.Summary line like e2ehelper request (answers per backend name); it
// exits 1 if any attempt failed. flow keeps one association and sends a line
// per interval, connecting again from the same source port after a failed
// attempt, and logs each attempt with its time and phase (package
// e2e/vm/flowlog). IPv4 only.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/e2e/vm/flowlog"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sctphelper serve|request|flow [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:], os.Stdout)
	case "request":
		err = request(os.Args[2:], os.Stdout)
	case "flow":
		err = flow(os.Args[2:], os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sctphelper:", err)
		os.Exit(1)
	}
}

func serve(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	name := fs.String("name", "", "name to answer with (required)")
	addr := fs.String("addr", ":8080", "address to listen on (IPv4; empty host = any)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("serve needs --name")
	}
	sa, err := sockaddr(*addr)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("SCTP socket (is the sctp module there?): %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return err
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind %s: %w", *addr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s serving sctp %s\nready\n", *name, *addr)
	// SIGTERM ends the process; the kernel aborts open associations.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	errc := make(chan error, 1)
	go func() {
		for {
			nfd, peer, err := unix.Accept(fd)
			if err != nil {
				if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
					continue
				}
				errc <- fmt.Errorf("accept: %w", err)
				return
			}
			go answer(nfd, *name, peer)
		}
	}()
	select {
	case <-sig:
		return nil
	case err := <-errc:
		return err
	}
}

// answer greets the association, then answers each message it sends the
// same way until the peer closes (request reads the greeting and closes;
// flow keeps sending) or stays silent for 30 s.
func answer(fd int, name string, peer unix.Sockaddr) {
	defer unix.Close(fd)
	msg := []byte(fmt.Sprintf("%s from %s\n", name, sockaddrString(peer)))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 30})
	buf := make([]byte, 256)
	for {
		if _, err := ignoringEINTR(func() (int, error) { return unix.Write(fd, msg) }); err != nil {
			return
		}
		if n, err := ignoringEINTR(func() (int, error) { return unix.Read(fd, buf) }); err != nil || n == 0 {
			return
		}
	}
}

func request(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("request", flag.ContinueOnError)
	addr := fs.String("addr", "", "HOST:PORT (IPv4) to connect to (required)")
	count := fs.Int("count", 1, "number of requests (1..10000)")
	timeout := fs.Duration("timeout", 2*time.Second, "timeout of each connect and read")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" || *count < 1 || *count > 10000 || *timeout <= 0 {
		return errors.New("request needs --addr, 1 <= --count <= 10000, --timeout > 0")
	}
	sa, err := sockaddr(*addr)
	if err != nil {
		return err
	}
	sum := wire.Summary{Backends: map[string]int{}}
	for i := 1; i <= *count; i++ {
		line, err := once(sa, *timeout)
		if err != nil {
			sum.Fail++
			fmt.Fprintf(out, "%d fail: %v\n", i, err)
			continue
		}
		sum.OK++
		if f := strings.Fields(line); len(f) > 0 {
			sum.Backends[f[0]]++
		}
		fmt.Fprintf(out, "%d ok %s\n", i, line)
	}
	data, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s%s\n", wire.SummaryPrefix, data)
	if sum.Fail > 0 {
		return fmt.Errorf("%d of %d requests failed", sum.Fail, *count)
	}
	return nil
}

func flow(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("flow", flag.ContinueOnError)
	f := flowlog.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := f.Check(); err != nil {
		return err
	}
	sa, err := sockaddr(f.Addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	a := &association{sa: sa, timeout: f.Timeout, port: f.SourcePort, fd: -1}
	defer a.close()
	return flowlog.Run(ctx, f.Options, func(context.Context) (string, error) { return a.attempt() }, out)
}

// association is flow's one long-lived association, as SCTP applications
// keep theirs: each attempt sends a line and reads the answer; a failed
// attempt aborts it and the next one connects again, from the same port.
type association struct {
	sa      unix.Sockaddr
	timeout time.Duration
	port    int
	fd      int // -1: not connected
}

func (a *association) attempt() (string, error) {
	if a.fd < 0 {
		fd, err := dial(a.sa, a.timeout, a.port)
		if err != nil {
			return "", err
		}
		a.fd = fd
		line, err := readLine(fd)
		if err != nil {
			a.close()
		}
		return line, err
	}
	if _, err := ignoringEINTR(func() (int, error) { return unix.Write(a.fd, []byte("ping\n")) }); err != nil {
		a.close()
		return "", fmt.Errorf("send: %w", err)
	}
	line, err := readLine(a.fd)
	if err != nil {
		a.close()
	}
	return line, err
}

// close aborts the association, as an application gives up on a peer that
// stopped answering. A graceful close would leave it in the kernel
// retransmitting SHUTDOWN to the dead peer for minutes, holding the source
// port (the next connect to the same peer gets EADDRNOTAVAIL) and making
// conntrack entries of its own wherever the address leads by then (seen in
// the VM: a flow stuck after its Service was re-created, on either proxy).
func (a *association) close() {
	if a.fd >= 0 {
		_ = unix.SetsockoptLinger(a.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		unix.Close(a.fd)
		a.fd = -1
	}
}

// once makes one association, reads the answer line and closes.
func once(sa unix.Sockaddr, timeout time.Duration) (string, error) {
	fd, err := dial(sa, timeout, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	return readLine(fd)
}

// dial connects an association (from localPort unless 0) whose sends,
// connect and reads time out after timeout.
func dial(sa unix.Sockaddr, timeout time.Duration, localPort int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return -1, fmt.Errorf("SCTP socket (is the sctp module there?): %w", err)
	}
	fail := func(err error) (int, error) {
		unix.Close(fd)
		return -1, err
	}
	if localPort > 0 {
		// The same port again while the last association from it closes.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return fail(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: localPort}); err != nil {
			return fail(fmt.Errorf("bind source port %d: %w", localPort, err))
		}
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return fail(err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail(err)
	}
	// A non-blocking connect awaited with poll: a blocking one with a
	// timeout ends in EINTR whenever a signal (Go's preemption) arrives.
	if err := unix.SetNonblock(fd, true); err != nil {
		return fail(err)
	}
	if err := unix.Connect(fd, sa); err != nil {
		if !errors.Is(err, unix.EINPROGRESS) {
			return fail(fmt.Errorf("connect: %w", err))
		}
		if err := awaitConnected(fd, timeout); err != nil {
			return fail(fmt.Errorf("connect: %w", err))
		}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		return fail(err)
	}
	return fd, nil
}

// awaitConnected waits up to timeout for fd's connect to finish and
// returns its outcome.
func awaitConnected(fd int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ms := time.Until(deadline).Milliseconds()
		if ms <= 0 {
			return unix.ETIMEDOUT
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, int(ms))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return unix.ETIMEDOUT
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
	}
}

// ignoringEINTR calls f again while it fails with EINTR: on a socket with
// SO_RCVTIMEO or SO_SNDTIMEO the kernel does not restart a read or write
// that a signal interrupted, and Go's runtime signals its threads (async
// preemption) all the time. Without this the helper's associations broke
// every half minute or so in the VM, flows and server alike.
func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// readLine reads one answer line.
func readLine(fd int) (string, error) {
	var got []byte
	buf := make([]byte, 256)
	for !strings.Contains(string(got), "\n") {
		n, err := ignoringEINTR(func() (int, error) { return unix.Read(fd, buf) })
		if err != nil {
			return "", fmt.Errorf("read answer: %w", err)
		}
		if n == 0 {
			return "", fmt.Errorf("read answer: closed after %q", got)
		}
		got = append(got, buf[:n]...)
	}
	line, _, _ := strings.Cut(string(got), "\n")
	return strings.TrimSpace(line), nil
}

func sockaddr(addr string) (*unix.SockaddrInet4, error) {
	if strings.HasPrefix(addr, ":") {
		addr = "0.0.0.0" + addr
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("bad address %q: %w", addr, err)
	}
	if !ap.Addr().Is4() {
		return nil, fmt.Errorf("address %q: only IPv4 is supported", addr)
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	default:
		return fmt.Sprintf("%v", sa)
	}
}
