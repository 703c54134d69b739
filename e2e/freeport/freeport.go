// Package freeport names loopback TCP ports for servers a test starts later
// (a control-plane replica process, etcd, QEMU's host forwards): the port
// has to be written into flags or a guestfwd rule before anything binds it.
//
// The kernel may hand the same ephemeral port to two bind(0) calls once the
// first listener is closed, so picking ports one at a time and releasing each
// can name one port twice (it did: a CI run failed with "guest forward port
// given twice"). Pick never returns a port it returned before in this
// process. Another process can still take a port between Pick and the
// server's bind; callers that can retry on a bind failure should.
package freeport

import (
	"fmt"
	"net"
	"strconv"
	"sync"
)

// maxAttempts bounds the listens one Pick makes; each listener is held
// until Pick returns, so every attempt gets a port not held by this call.
const maxAttempts = 256

var (
	mu    sync.Mutex
	given = map[int]bool{}
	// listen is the kernel's choice; tests replace it to force a repeat.
	listen = func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
)

// Pick returns n distinct loopback TCP ports, none returned by an earlier
// Pick in this process, and none bound when it returns.
func Pick(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for attempt := 0; len(ports) < n; attempt++ {
		if attempt == maxAttempts {
			return nil, fmt.Errorf("freeport: %d listens gave only %d unused ports of %d", maxAttempts, len(ports), n)
		}
		l, err := listen()
		if err != nil {
			return nil, fmt.Errorf("freeport: %w", err)
		}
		held = append(held, l)
		p := l.Addr().(*net.TCPAddr).Port
		if !given[p] {
			given[p] = true
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// One returns one port as Pick does.
func One() (int, error) {
	ps, err := Pick(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// Addr is the loopback host:port a server given port binds.
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
