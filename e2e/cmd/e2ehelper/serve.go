package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"time"
)

// idleTimeout closes a TCP connection nobody has written to for this long,
// so a forgotten client cannot pin a server goroutine forever.
const idleTimeout = 10 * time.Minute

func serveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "name to answer with (required)")
	tcpAddr := fs.String("tcp", "", "TCP address to listen on, e.g. :8080")
	udpAddr := fs.String("udp", "", "UDP address to listen on, e.g. :8080")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	if *name == "" || (*tcpAddr == "" && *udpAddr == "") {
		return usageError("serve needs --name and at least one of --tcp, --udp")
	}
	s := &server{name: *name}
	errc := make(chan error, 2)
	if *tcpAddr != "" {
		ln, err := net.Listen("tcp", *tcpAddr)
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Fprintf(stdout, "%s serving tcp %s\n", s.name, ln.Addr())
		go func() { errc <- s.serveTCP(ctx, ln) }()
	}
	if *udpAddr != "" {
		pc, err := net.ListenPacket("udp", *udpAddr)
		if err != nil {
			return err
		}
		defer pc.Close()
		fmt.Fprintf(stdout, "%s serving udp %s\n", s.name, pc.LocalAddr())
		go func() { errc <- s.serveUDP(ctx, pc) }()
	}
	fmt.Fprintln(stdout, "ready")
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

type server struct {
	name string
}

func (s *server) serveTCP(ctx context.Context, ln net.Listener) error {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go s.handleTCP(ctx, conn)
	}
}

func (s *server) handleTCP(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if _, err := fmt.Fprintf(conn, "%s from %s\n", s.name, conn.RemoteAddr()); err != nil {
		return
	}
	sc := bufio.NewScanner(conn)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(idleTimeout))
		if !sc.Scan() {
			return
		}
		if _, err := fmt.Fprintf(conn, "%s echo: %s\n", s.name, sc.Text()); err != nil {
			return
		}
	}
}

func (s *server) serveUDP(ctx context.Context, pc net.PacketConn) error {
	go func() { <-ctx.Done(); pc.Close() }()
	buf := make([]byte, 64<<10)
	for {
		_, peer, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if _, err := pc.WriteTo([]byte(fmt.Sprintf("%s from %s\n", s.name, peer)), peer); err != nil {
			return err
		}
	}
}
