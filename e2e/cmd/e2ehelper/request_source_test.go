package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
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
