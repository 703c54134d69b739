package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// --source-from/--source-port: request i leaves from the i-th address with
// the fixed port, and the line names the source.
func TestRequestFromFixedSources(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("srv from " + c.RemoteAddr().String() + "\n"))
			c.Close()
		}
	}()
	var out bytes.Buffer
	err = requestCmd(context.Background(), []string{"--addr", ln.Addr().String(), "--count", "3",
		"--source-from", "127.0.0.10", "--source-port", "41234"}, &out, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"1 ok 127.0.0.10 srv from 127.0.0.10:41234", "2 ok 127.0.0.11 srv from 127.0.0.11:41234", "3 ok 127.0.0.12 srv"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), `"srv":3`) {
		t.Errorf("summary does not count the backend:\n%s", out.String())
	}
	// Again, from the same sources and port, while the first connections
	// are in TIME_WAIT (the client closed them).
	out.Reset()
	if err := requestCmd(context.Background(), []string{"--addr", ln.Addr().String(), "--count", "3",
		"--source-from", "127.0.0.10", "--source-port", "41234"}, &out, &out); err != nil {
		t.Fatalf("second round: %v\n%s", err, out.String())
	}
}

// --proto udp --source-port: every datagram leaves from that port (the
// backend sees it), one flow across requests.
func TestRequestUDPFixedSourcePort(t *testing.T) {
	_, udpAddr := startServe(t, "pod-u")
	var out bytes.Buffer
	if err := requestCmd(context.Background(), []string{"--proto", "udp", "--addr", udpAddr, "--count", "3",
		"--source-port", "41235", "--timeout", "5s"}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if n := strings.Count(out.String(), "pod-u from 127.0.0.1:41235"); n != 3 {
		t.Errorf("%d of 3 answers saw source port 41235:\n%s", n, out.String())
	}
	if err := requestCmd(context.Background(), []string{"--proto", "tcp", "--addr", udpAddr, "--source-port", "41235"}, &out, &out); err == nil {
		t.Error("--source-port without --source-from accepted for tcp")
	}
}

// A TCP server that writes its answer without a newline and closes
// (agnhost serve-hostname --tcp) is an answer, not a failure.
func TestRequestTCPAnswerEndsAtEOF(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("web-7f9c"))
			c.Close()
		}
	}()
	var out bytes.Buffer
	if err := requestCmd(context.Background(), []string{"--addr", ln.Addr().String(), "--count", "2"}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `"web-7f9c":2`) {
		t.Errorf("answers not counted:\n%s", out.String())
	}
}

// hold --source-port: the held connection leaves from that port, and a
// request from the same address and port to another destination can run
// while it is open (what checkPortReuseAcrossServices needs).
func TestHoldFromFixedPortBesideARequest(t *testing.T) {
	tcpA, _ := startServe(t, "pod-a")
	tcpB, _ := startServe(t, "pod-b")
	// A port no connection used yet: a fixed one may still be in
	// TIME_WAIT from the last run, which a wildcard bind can refuse.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	held := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- holdCmd(context.Background(), []string{"--addr", tcpA, "--source-port", port, "--interval", "20ms", "--duration", "1s"}, held, held)
	}()
	if err := awaitOutput(held, "1 ok", 5*time.Second); err != nil {
		select {
		case herr := <-done:
			t.Fatalf("hold ended: %v\n%s", herr, held.String())
		default:
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := requestCmd(context.Background(), []string{"--addr", tcpB, "--source-from", "127.0.0.1", "--source-port", port}, &out, &out); err != nil {
		t.Fatalf("request beside the held connection: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "pod-b from 127.0.0.1:"+port) {
		t.Errorf("the request did not leave from port %s:\n%s", port, out.String())
	}
	if err := <-done; err != nil {
		t.Fatalf("hold: %v\n%s", err, held.String())
	}
	if !strings.Contains(held.String(), "connected pod-a from 127.0.0.1:"+port) {
		t.Errorf("the held connection did not leave from port %s:\n%s", port, held.String())
	}
}

// awaitOutput polls until b holds s (bounded by timeout).
func awaitOutput(b *syncBuffer, s string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			return fmt.Errorf("no %q within %v in:\n%s", s, timeout, b.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
