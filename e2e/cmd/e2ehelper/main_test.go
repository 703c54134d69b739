package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingRE = regexp.MustCompile(`serving (tcp|udp) (\S+)`)

// startServe runs "e2ehelper serve" on loopback and returns its TCP and UDP addresses.
func startServe(t *testing.T, name string) (tcpAddr, udpAddr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	var out syncBuffer
	go func() {
		done <- run(ctx, []string{"serve", "--name", name, "--tcp", "127.0.0.1:0", "--udp", "127.0.0.1:0"}, &out, &out)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, out.String())
		}
	})
	if err := awaitOutput(&out, "ready", 10*time.Second); err != nil {
		t.Fatalf("serve not ready: %v", err)
	}
	for _, m := range servingRE.FindAllStringSubmatch(out.String(), -1) {
		if m[1] == "tcp" {
			tcpAddr = m[2]
		} else {
			udpAddr = m[2]
		}
	}
	return tcpAddr, udpAddr
}

func summaryOf(t *testing.T, out string) wire.Summary {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	rest, ok := strings.CutPrefix(last, wire.SummaryPrefix)
	if !ok {
		t.Fatalf("no summary line in %q", out)
	}
	var s wire.Summary
	if err := json.Unmarshal([]byte(rest), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRequestTCPAndUDP(t *testing.T) {
	tcpAddr, udpAddr := startServe(t, "pod-a")
	for _, tc := range []struct{ proto, addr string }{{"tcp", tcpAddr}, {"udp", udpAddr}} {
		t.Run(tc.proto, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), []string{"request", "--proto", tc.proto, "--addr", tc.addr,
				"--count", "5", "--timeout", "5s"}, &out, &errOut)
			if code != 0 {
				t.Fatalf("exit %d: %s %s", code, out.String(), errOut.String())
			}
			sum := summaryOf(t, out.String())
			if sum.OK != 5 || sum.Fail != 0 || sum.Backends["pod-a"] != 5 {
				t.Errorf("summary %+v", sum)
			}
			if !strings.Contains(out.String(), "1 ok pod-a from 127.0.0.1:") {
				t.Errorf("answer lines should name the peer: %s", out.String())
			}
		})
	}
}

// TestRequestUDPFlowsAreDistinct: without --source-port every UDP request
// leaves from a port no earlier request of the run used (IPVS would send a
// reused port's datagram where the first one went, unbalancing a round robin).
func TestRequestUDPFlowsAreDistinct(t *testing.T) {
	_, udpAddr := startServe(t, "pod-u")
	const count = 300
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"request", "--proto", "udp", "--addr", udpAddr,
		"--count", fmt.Sprint(count), "--timeout", "5s"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out.String(), errOut.String())
	}
	peers := regexp.MustCompile(` ok pod-u from (127\.0\.0\.1:\d+)`).FindAllStringSubmatch(out.String(), -1)
	if len(peers) != count {
		t.Fatalf("want %d answers naming the peer, got %d:\n%s", count, len(peers), out.String())
	}
	seen := map[string]int{}
	for i, m := range peers {
		if j, ok := seen[m[1]]; ok {
			t.Errorf("requests %d and %d both left from %s", j+1, i+1, m[1])
		}
		seen[m[1]] = i
	}
}

func TestRequestFailureExitsNonZero(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"request", "--addr", addr, "--count", "2", "--timeout", "2s"}, &out, &errOut)
	if code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, out.String())
	}
	if sum := summaryOf(t, out.String()); sum.Fail != 2 || sum.OK != 0 {
		t.Errorf("summary %+v", sum)
	}
}

// TestRequestFailureSaysWhatTheSocketSaw: a failed request's line carries
// its socket's TCP state and local port (read from a duplicate of the
// socket, after Go closed its own) and the longest stall of the process,
// so a failure in the VM can be told apart from a test bed that stalled.
func TestRequestFailureSaysWhatTheSocketSaw(t *testing.T) {
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, tc := range []struct {
		addr string
		want []string
	}{
		{refusedAddr, []string{"connection refused", "tcp state CLOSE,", "local port "}},
		{silent.Addr().String(), []string{"read answer", "tcp state ESTABLISHED,", "local port "}},
	} {
		var out, errOut bytes.Buffer
		run(context.Background(), []string{"request", "--addr", tc.addr, "--count", "1", "--timeout", "300ms"}, &out, &errOut)
		line, _, _ := strings.Cut(out.String(), "\n")
		for _, w := range append(tc.want, " fail: ", "longest stall ", "took ") {
			if !strings.Contains(line, w) {
				t.Errorf("%s: failure line %q lacks %q", tc.addr, line, w)
			}
		}
		if strings.Contains(line, "local port 0,") {
			t.Errorf("%s: no local port in %q", tc.addr, line)
		}
	}
}

// TestRequestStopFile: --stop-file ends the loop between requests (none
// cut short), the summary counts what was sent, and the exit is 0.
func TestRequestStopFile(t *testing.T) {
	tcpAddr, _ := startServe(t, "pod-s")
	stop := filepath.Join(t.TempDir(), "stop")
	out := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), []string{"request", "--addr", tcpAddr, "--count", "100000",
			"--interval", "5ms", "--stop-file", stop}, out, io.Discard)
	}()
	if err := awaitOutput(out, "3 ok", 10*time.Second); err != nil {
		t.Fatalf("no third answer: %v", err)
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not stop")
	}
	sum := summaryOf(t, out.String())
	if sum.OK < 3 || sum.OK >= 100000 || sum.Fail != 0 || sum.Backends["pod-s"] != sum.OK {
		t.Errorf("summary %+v", sum)
	}
}

// TestFlow: every datagram leaves from the one source port, each attempt is
// labelled with the phase file's word at the time, and the stop file ends it.
func TestFlow(t *testing.T) {
	_, udpAddr := startServe(t, "pod-f")
	dir := t.TempDir()
	phase, stop := filepath.Join(dir, "phase"), filepath.Join(dir, "stop")
	if err := os.WriteFile(phase, []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	out := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), []string{"flow", "--addr", udpAddr, "--source-port", fmt.Sprint(port),
			"--interval", "5ms", "--timeout", "2s", "--phase-file", phase, "--stop-file", stop}, out, io.Discard)
	}()
	awaitOut := func(re string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !regexp.MustCompile(re).MatchString(out.String()) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in %s", re, out.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	awaitOut(`(?m)^\d+ first ok pod-f from 127\.0\.0\.1:` + fmt.Sprint(port) + `$`)
	if err := os.WriteFile(phase, []byte("second"), 0o644); err != nil {
		t.Fatal(err)
	}
	awaitOut(`(?m)^\d+ second ok pod-f from 127\.0\.0\.1:` + fmt.Sprint(port) + `$`)
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the flow did not stop")
	}
	if strings.Contains(out.String(), " fail ") || strings.Count(out.String(), "from 127.0.0.1:"+fmt.Sprint(port)) != strings.Count(out.String(), "\n") {
		t.Errorf("every attempt must answer from the fixed source port:\n%s", out.String())
	}
}

func TestHold(t *testing.T) {
	tcpAddr, _ := startServe(t, "pod-b")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"hold", "--addr", tcpAddr, "--interval", "10ms",
		"--duration", "200ms"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out.String(), errOut.String())
	}
	sum := summaryOf(t, out.String())
	if sum.OK < 2 || sum.Fail != 0 || sum.Backends["pod-b"] != sum.OK {
		t.Errorf("summary %+v\n%s", sum, out.String())
	}
	if !strings.Contains(out.String(), "pod-b echo: tick 1") {
		t.Errorf("no echo in %s", out.String())
	}
}

func TestWait(t *testing.T) {
	tcpAddr, _ := startServe(t, "w")
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"wait", "--addr", tcpAddr, "--timeout", "5s"}, &out, &errOut); code != 0 {
		t.Fatalf("wait for a listening server: exit %d %s", code, errOut.String())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	errOut.Reset()
	if code := run(context.Background(), []string{"wait", "--addr", closed, "--timeout", "300ms"}, &out, &errOut); code != 1 {
		t.Fatalf("wait for nothing: exit %d, want 1", code)
	}
	if !strings.Contains(errOut.String(), "not reachable") {
		t.Errorf("stderr %q", errOut.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frob"},
		{"serve", "--name", "x"},
		{"serve", "--tcp", ":0"},
		{"request"},
		{"request", "--addr", "a:1", "--count", "0"},
		{"request", "--addr", "a:1", "--proto", "sctp"},
		{"hold", "--addr", "a:1", "--duration", "2h"},
		{"wait"},
		{"request", "--bogus"},
		{"flow", "--addr", "a:1", "--phase-file", "p", "--stop-file", "s"},
		{"flow", "--addr", "a:1", "--source-port", "4000", "--stop-file", "s"},
	} {
		t.Run(fmt.Sprint(args), func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := run(context.Background(), args, &out, &errOut); code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, errOut.String())
			}
		})
	}
}

// conntrack lists this namespace's entries, one line each in the format
// the flow test's dumps are read in; a bad protocol is a usage error.
func TestConntrackCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"conntrack", "--proto", "icmp"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "icmp") {
		t.Errorf("--proto icmp: exit %d, %q; want 2 naming it", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run(context.Background(), []string{"conntrack", "--proto", "udp"}, &out, &errOut); code != 0 {
		t.Fatalf("conntrack --proto udp: exit %d: %s", code, errOut.String())
	}
	line := regexp.MustCompile(`^udp \S+:\d+ -> \S+:\d+ \| reply \S+:\d+ -> \S+:\d+$`)
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if l != "" && !line.MatchString(l) {
			t.Errorf("line %q is not in the dump's format", l)
		}
	}
}
