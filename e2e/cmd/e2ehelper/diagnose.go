package main

import (
	"fmt"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A request that fails in the VM test bed is either the data path losing
// packets or the test bed itself stalling (TCG vCPUs starved by the host,
// so guest time jumps past a deadline before the guest ran the network
// stack). The failure line says which: the socket's own view (state, SYNs
// and segments retransmitted, local port for matching IPVS/conntrack
// entries) and the longest stall of a 10 ms ticker while the request ran.

// socketWitness keeps a duplicate of a dialer's socket, so its TCP_INFO can
// be read after the dial failed and Go closed its own descriptor.
type socketWitness struct {
	mu sync.Mutex
	fd int
}

func newSocketWitness() *socketWitness { return &socketWitness{fd: -1} }

// control is a net.Dialer Control hook (chained after any other).
func (w *socketWitness) control(next func(network, address string, c syscall.RawConn) error) func(string, string, syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if next != nil {
			if err := next(network, address, c); err != nil {
				return err
			}
		}
		return c.Control(func(fd uintptr) {
			if dup, err := unix.Dup(int(fd)); err == nil {
				w.mu.Lock()
				w.fd = dup
				w.mu.Unlock()
			}
		})
	}
}

// describe reads the socket's TCP state; empty if there is no socket.
func (w *socketWitness) describe() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return ""
	}
	return describeTCPSocket(w.fd)
}

func (w *socketWitness) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}

func describeTCPSocket(fd int) string {
	local := "?"
	if sa, err := unix.Getsockname(fd); err == nil {
		if in, ok := sa.(*unix.SockaddrInet4); ok {
			local = fmt.Sprint(in.Port)
		} else if in6, ok := sa.(*unix.SockaddrInet6); ok {
			local = fmt.Sprint(in6.Port)
		}
	}
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return fmt.Sprintf("local port %s, tcp_info: %v", local, err)
	}
	return fmt.Sprintf("local port %s, tcp state %s, retransmits %d (total %d), rto %v",
		local, tcpStateName(info.State), info.Retransmits, info.Total_retrans, time.Duration(info.Rto)*time.Microsecond)
}

func tcpStateName(s uint8) string {
	names := map[uint8]string{1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
		6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}
	if n, ok := names[s]; ok {
		return n
	}
	return fmt.Sprint(s)
}

// stallWatch measures the longest gap between the ticks of a 10 ms ticker
// from start to stop: how long the process (or the whole guest) did not run.
type stallWatch struct {
	done chan struct{}
	max  chan time.Duration
}

const stallTick = 10 * time.Millisecond

func startStallWatch() *stallWatch {
	w := &stallWatch{done: make(chan struct{}), max: make(chan time.Duration, 1)}
	go func() {
		t := time.NewTicker(stallTick)
		defer t.Stop()
		last, longest := time.Now(), time.Duration(0)
		for {
			select {
			case <-w.done:
				if gap := time.Since(last); gap > longest {
					longest = gap
				}
				w.max <- longest
				return
			case <-t.C:
				now := time.Now()
				if gap := now.Sub(last); gap > longest {
					longest = gap
				}
				last = now
			}
		}
	}()
	return w
}

// stop ends the watch and returns the longest gap seen.
func (w *stallWatch) stop() time.Duration {
	close(w.done)
	return <-w.max
}
