package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// freePort returns a loopback TCP port nobody listens on right now.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

type answer struct {
	code    int
	header  http.Header
	body    string
	refused bool
}

func probe(t *testing.T, port uint16) answer {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return answer{refused: true}
		}
		t.Fatalf("GET :%d: %v", port, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func TestServesKubeProxyAnswer(t *testing.T) {
	var unhealthy atomic.Bool
	s := New(Config{Logger: zaptest.NewLogger(t), ProxyHealthy: func() bool { return !unhealthy.Load() }})
	defer s.Close()
	port := freePort(t)
	web := Service{Namespace: "default", Name: "web", Port: port, IPv4: true, LocalEndpoints4: 2}
	if errs := s.Sync([]Service{web}, loopback); len(errs) != 0 {
		t.Fatal(errs)
	}
	a := probe(t, port)
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
	if a.code != 200 || a.body != want {
		t.Errorf("answer %d %q, want 200 %q", a.code, a.body, want)
	}
	for h, v := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff", "X-Load-Balancing-Endpoint-Weight": "2"} {
		if got := a.header.Get(h); got != v {
			t.Errorf("header %s = %q, want %q", h, got, v)
		}
	}
	var parsed struct {
		Service             struct{ Namespace, Name string }
		LocalEndpoints      int
		ServiceProxyHealthy bool
	}
	if err := json.Unmarshal([]byte(a.body), &parsed); err != nil || parsed.Service.Name != "web" || parsed.LocalEndpoints != 2 {
		t.Errorf("body is not the expected JSON: %+v %v", parsed, err)
	}

	// No local endpoint: 503, same server (no reopen).
	web.LocalEndpoints4 = 0
	s.Sync([]Service{web}, loopback)
	if a := probe(t, port); a.code != 503 || !strings.Contains(a.body, `"localEndpoints": 0`) || a.header.Get("X-Load-Balancing-Endpoint-Weight") != "0" {
		t.Errorf("no endpoints: %+v", a)
	}
	// Endpoints but the proxy is unhealthy: 503, serviceProxyHealthy false.
	web.LocalEndpoints4 = 1
	s.Sync([]Service{web}, loopback)
	unhealthy.Store(true)
	if a := probe(t, port); a.code != 503 || !strings.Contains(a.body, `"serviceProxyHealthy": false`) {
		t.Errorf("unhealthy proxy: %+v", a)
	}
	unhealthy.Store(false)
	if a := probe(t, port); a.code != 200 {
		t.Errorf("healthy again: %+v", a)
	}

	// The port changes: the old one closes, the new one answers.
	newPort := freePort(t)
	web.Port = newPort
	s.Sync([]Service{web}, loopback)
	if a := probe(t, port); !a.refused {
		t.Errorf("old port still answers: %+v", a)
	}
	if a := probe(t, newPort); a.code != 200 {
		t.Errorf("new port: %+v", a)
	}
	// The Service goes away: closed.
	s.Sync(nil, loopback)
	if a := probe(t, newPort); !a.refused {
		t.Errorf("removed Service still answers: %+v", a)
	}
}

// A port that is taken is reported, never fatal; others still serve, and
// the next Sync after the port is free opens it.
func TestBindFailureReportedAndRetried(t *testing.T) {
	s := New(Config{Logger: zaptest.NewLogger(t)})
	defer s.Close()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	takenPort := uint16(taken.Addr().(*net.TCPAddr).Port)
	okPort := freePort(t)
	svcs := []Service{
		{Namespace: "default", Name: "busy", Port: takenPort, IPv4: true, LocalEndpoints4: 1},
		{Namespace: "default", Name: "ok", Port: okPort, IPv4: true, LocalEndpoints4: 1},
	}
	errs := s.Sync(svcs, loopback)
	if len(errs) != 1 || !strings.Contains(errs["default/busy"], fmt.Sprintf("health check node port %d of default/busy", takenPort)) {
		t.Fatalf("errors = %v", errs)
	}
	if got := s.Errors(); len(got) != 1 {
		t.Errorf("Errors() = %v", got)
	}
	if a := probe(t, okPort); a.code != 200 {
		t.Errorf("other Service: %+v", a)
	}
	taken.Close()
	if errs := s.Sync(svcs, loopback); len(errs) != 0 {
		t.Fatalf("retry errors = %v", errs)
	}
	if a := probe(t, takenPort); a.code != 200 || !strings.Contains(a.body, `"name": "busy"`) {
		t.Errorf("after the port was freed: %+v", a)
	}
	if len(s.Errors()) != 0 {
		t.Errorf("Errors() after retry = %v", s.Errors())
	}
	// No address to listen on (CIDRs match nothing): an error, not a crash.
	if errs := s.Sync(svcs, []netip.Addr{}); len(errs) != 2 {
		t.Errorf("errors without addresses = %v", errs)
	}
	// Closed: nothing answers and Sync is a no-op.
	s.Close()
	if errs := s.Sync(svcs, loopback); errs != nil {
		t.Errorf("Sync after Close = %v", errs)
	}
	if a := probe(t, okPort); !a.refused {
		t.Errorf("after Close: %+v", a)
	}
}

// The listen addresses change (NodePort addresses moved): servers reopen
// on the new set.
func TestListenAddressChange(t *testing.T) {
	var listened []string
	s := New(Config{Logger: zaptest.NewLogger(t), Listen: func(n, addr string) (net.Listener, error) {
		listened = append(listened, addr)
		return net.Listen(n, addr)
	}})
	defer s.Close()
	port := freePort(t)
	svc := Service{Namespace: "ns", Name: "a", Port: port, IPv4: true, LocalEndpoints4: 1}
	s.Sync([]Service{svc}, loopback)
	s.Sync([]Service{svc}, loopback) // unchanged: no reopen
	two := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
	if errs := s.Sync([]Service{svc}, two); len(errs) != 0 {
		t.Fatal(errs)
	}
	p := fmt.Sprint(port)
	want := []string{"127.0.0.1:" + p, "127.0.0.1:" + p, "127.0.0.2:" + p}
	if fmt.Sprint(listened) != fmt.Sprint(want) {
		t.Errorf("listened %v, want %v", listened, want)
	}
	if a := probe(t, port); a.code != 200 {
		t.Errorf("after reopen: %+v", a)
	}
}

// A dual-stack Service gets one listener per family, each answering its own
// family's count (kube-proxy runs a health server per proxied family).
func TestDualStackAnswersPerFamily(t *testing.T) {
	if ln, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Fatalf("this machine has no IPv6 loopback, which the test needs: %v", err)
	} else {
		ln.Close()
	}
	s := New(Config{Logger: zaptest.NewLogger(t)})
	defer s.Close()
	port := freePort(t)
	dual := Service{Namespace: "ns", Name: "dual", Port: port, IPv4: true, IPv6: true, LocalEndpoints4: 1, LocalEndpoints6: 2}
	if errs := s.Sync([]Service{dual}, []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}); len(errs) != 0 {
		t.Fatal(errs)
	}
	get := func(host string) answer {
		t.Helper()
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://%s/", net.JoinHostPort(host, fmt.Sprint(port))))
		if err != nil {
			t.Fatalf("GET %s: %v", host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{code: resp.StatusCode, header: resp.Header, body: string(b)}
	}
	for host, want := range map[string]string{"127.0.0.1": "1", "::1": "2"} {
		a := get(host)
		if a.code != 200 || !strings.Contains(a.body, `"localEndpoints": `+want) || a.header.Get("X-Load-Balancing-Endpoint-Weight") != want {
			t.Errorf("%s: %d %q weight %q, want localEndpoints %s", host, a.code, a.body, a.header.Get("X-Load-Balancing-Endpoint-Weight"), want)
		}
	}
	// An IPv6-only Service gets no IPv4 listener.
	s.Sync([]Service{{Namespace: "ns", Name: "v6", Port: port, IPv6: true, LocalEndpoints6: 1}}, nil)
	c := &http.Client{Timeout: 2 * time.Second}
	if resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
		resp.Body.Close()
		t.Error("an IPv6-only Service answers on IPv4")
	}
}
