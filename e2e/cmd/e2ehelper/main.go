// Command e2ehelper is the test bed's multi-purpose network program, run in
// the VM's pod and client namespaces (a static binary, CGO_ENABLED=0):
//
//	e2ehelper serve   --name NAME [--tcp ADDR] [--udp ADDR]
//	e2ehelper request --proto tcp|udp --addr HOST:PORT [--count N] [--timeout D] [--interval D] [--source-from IP] [--source-port P] [--stop-file PATH]
//	e2ehelper hold    --addr HOST:PORT [--interval D] [--duration D] [--timeout D] [--source-port P]
//	e2ehelper flow    --addr HOST:PORT --source-port P --phase-file PATH --stop-file PATH [--interval D] [--timeout D] [--max N]
//	e2ehelper wait    --addr HOST:PORT [--timeout D]
//	e2ehelper connect-proxy [--listen ADDR] [--allow CIDR,...]
//	e2ehelper conntrack [--proto tcp|udp|sctp] [--ipv6]
//
// serve answers every TCP connection and UDP datagram with "NAME from IP:PORT\n"
// (the peer's address as the backend saw it); on TCP it then echoes each line
// it receives as "NAME echo: LINE\n" until the peer closes, which lets hold keep
// one long-lived connection. request prints one line per attempt and a summary
// (see report); it exits 1 if any attempt failed. wait polls until a TCP
// connection succeeds. flow sends one UDP datagram
// per interval from one fixed source port and logs each attempt with its
// time and phase (package e2e/vm/flowlog). connect-proxy tunnels HTTP CONNECT to targets in the
// allowed ranges (the apiserver's way into the real-node test bed).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: e2ehelper serve|request|hold|wait|flow|connect-proxy|conntrack [flags]")
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serveCmd(ctx, args[1:], stdout, stderr)
	case "request":
		err = requestCmd(ctx, args[1:], stdout, stderr)
	case "hold":
		err = holdCmd(ctx, args[1:], stdout, stderr)
	case "wait":
		err = waitCmd(ctx, args[1:], stdout, stderr)
	case "flow":
		err = flowCmd(ctx, args[1:], stdout, stderr)
	case "connect-proxy":
		err = connectProxyCmd(ctx, args[1:], stdout, stderr)
	case "conntrack":
		err = conntrackCmd(ctx, args[1:], stdout, stderr)
	default:
		err = usageError(fmt.Sprintf("unknown command %q", args[0]))
	}
	if err != nil {
		fmt.Fprintln(stderr, "e2ehelper:", err)
		if _, ok := err.(usageError); ok {
			return 2
		}
		return 1
	}
	return 0
}

type usageError string

func (e usageError) Error() string { return string(e) }
