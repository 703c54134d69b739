package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

var proxyRE = regexp.MustCompile(`connect-proxy serving on (\S+)`)

// startProxy runs "e2ehelper connect-proxy" on loopback allowing allow and
// returns its address.
func startProxy(t *testing.T, allow string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	var out syncBuffer
	go func() {
		done <- run(ctx, []string{"connect-proxy", "--listen", "127.0.0.1:0", "--allow", allow}, &out, &out)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("connect-proxy exited %d: %s", code, out.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := proxyRE.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect-proxy not serving: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connect sends CONNECT target through proxy and returns the status code
// and, on 200, the tunnel.
func connect(t *testing.T, proxy, target string) (int, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		c.Close()
		return resp.StatusCode, nil, nil
	}
	return resp.StatusCode, c, br
}

// TestConnectProxyTunnels: a CONNECT to an allowed target tunnels both ways
// (the echo server answers through it); targets outside --allow and
// non-CONNECT requests are refused.
func TestConnectProxyTunnels(t *testing.T) {
	tcpAddr, _ := startServe(t, "echo")
	proxy := startProxy(t, "127.0.0.0/8")

	code, c, br := connect(t, proxy, tcpAddr)
	if code != http.StatusOK {
		t.Fatalf("CONNECT %s: status %d", tcpAddr, code)
	}
	defer c.Close()
	greeting, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(greeting, "echo from 127.0.0.1:") {
		t.Fatalf("greeting through the tunnel: %q, %v", greeting, err)
	}
	fmt.Fprintf(c, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo echo: hello\n" {
		t.Fatalf("echo through the tunnel: %q, %v", line, err)
	}

	other := startProxy(t, "198.18.0.0/15")
	if code, _, _ := connect(t, other, tcpAddr); code != http.StatusForbidden {
		t.Errorf("CONNECT outside --allow: status %d, want 403", code)
	}
	if code, _, _ := connect(t, proxy, "localhost:80"); code != http.StatusForbidden {
		t.Errorf("CONNECT to a name: status %d, want 403", code)
	}
	resp, err := http.Get("http://" + proxy + "/")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want 405", resp.StatusCode)
	}
}
