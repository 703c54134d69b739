package freeport

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestPickNeverRepeatsAndLeavesPortsFree(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		ps, err := Pick(4)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 4 {
			t.Fatalf("Pick(4) = %v", ps)
		}
		for _, p := range ps {
			if seen[p] {
				t.Fatalf("port %d returned twice", p)
			}
			seen[p] = true
		}
	}
	// The ports are released: a server can bind the one it was given.
	p, err := One()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		t.Fatalf("bind picked port %d: %v", p, err)
	}
	ln.Close()
}

type fakeListener struct {
	net.Listener
	port int
}

func (f fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: f.port} }
func (f fakeListener) Close() error   { return nil }

// withKernelPorts makes listen hand out the given ports in order, as a
// kernel reusing a just-released port would, then the last one forever.
func withKernelPorts(t *testing.T, ports ...int) {
	real := listen
	t.Cleanup(func() { listen = real })
	listen = func() (net.Listener, error) {
		p := ports[0]
		if len(ports) > 1 {
			ports = ports[1:]
		}
		return fakeListener{port: p}, nil
	}
}

func TestPickSkipsAPortAlreadyGiven(t *testing.T) {
	// The CI failure: the same port for two replicas picked one at a time.
	withKernelPorts(t, 61001, 61001, 61002)
	a, err := One()
	if err != nil {
		t.Fatal(err)
	}
	b, err := One()
	if err != nil {
		t.Fatal(err)
	}
	if a != 61001 || b != 61002 {
		t.Fatalf("got ports %d and %d, want 61001 and 61002", a, b)
	}
}

func TestPickFailsWhenTheKernelKeepsRepeating(t *testing.T) {
	withKernelPorts(t, 61011)
	if _, err := One(); err != nil {
		t.Fatal(err)
	}
	_, err := One()
	if err == nil || !strings.Contains(err.Error(), "unused ports") {
		t.Fatalf("err = %v, want a bounded failure", err)
	}
}
