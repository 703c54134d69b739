// Command ipvsprobe watches the IPVS tables of the VM test bed's network
// namespaces for a measurement on the host (e2e/vmbench's kube-proxy
// comparison; host side: vm.Probe). It is one static process in the VM root
// namespace holding a netlink socket in each namespace it is asked about,
// so polling costs a few netlink requests and no process start:
//
//	ipvsprobe --connect 198.19.255.100:PORT
//
// It dials the host through guestfwd and answers wire.ProbeRequests (JSON
// lines) with wire.ProbeEvents (JSON lines), one request at a time. The host
// timestamps the events as they arrive: the guest clock is never compared
// with the host's. Besides IPVS it reports guest process stats
// (/proc/PID/status, /proc/PID/stat), the VM's fork counter and a metrics
// page fetched inside a namespace.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink/nl"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

func main() {
	connect := flag.String("connect", "", "host address to dial (198.19.255.100:PORT through guestfwd)")
	flag.Parse()
	if *connect == "" {
		fmt.Fprintln(os.Stderr, "ipvsprobe: --connect is required")
		os.Exit(2)
	}
	if err := run(*connect); err != nil {
		fmt.Fprintln(os.Stderr, "ipvsprobe:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	var conn net.Conn
	var err error
	// guestfwd's socat starts per connection; retry briefly while the
	// host side is not yet accepting.
	for range 50 {
		if conn, err = net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Println("ipvsprobe connected to", addr)
	p := &probe{handles: map[string]*ipvs.Handle{}, nft: map[string]*nl.NetlinkSocket{}, out: json.NewEncoder(conn), start: time.Now()}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var req wire.ProbeRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return fmt.Errorf("bad request %q: %w", sc.Text(), err)
		}
		if err := p.serve(req); err != nil {
			if err := p.send(wire.ProbeEvent{ID: req.ID, Kind: "error", Error: err.Error(), Final: true}); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}

type probe struct {
	handles map[string]*ipvs.Handle
	nft     map[string]*nl.NetlinkSocket // per namespace, see nft.go
	out     *json.Encoder
	start   time.Time // GuestUS's origin
}

// guestUS is the probe's monotonic clock (ProbeEvent.GuestUS).
func (p *probe) guestUS() int64 { return time.Since(p.start).Microseconds() }

func (p *probe) send(ev wire.ProbeEvent) error { return p.out.Encode(ev) }

func (p *probe) handle(netns string) (*ipvs.Handle, error) {
	if h, ok := p.handles[netns]; ok {
		return h, nil
	}
	h, err := ipvs.New("/run/netns/" + netns)
	if err != nil {
		return nil, fmt.Errorf("IPVS handle in %s: %w", netns, err)
	}
	p.handles[netns] = h
	return h, nil
}

func (p *probe) serve(req wire.ProbeRequest) error {
	switch req.Op {
	case wire.ProbeCount:
		for _, ns := range req.Netns {
			vs, rs, err := p.count(ns, req.Filter, 0)
			if err != nil {
				return err
			}
			if err := p.send(wire.ProbeEvent{ID: req.ID, Kind: "count", Netns: ns, VS: vs, RS: rs}); err != nil {
				return err
			}
		}
		return p.send(wire.ProbeEvent{ID: req.ID, Kind: "done", Final: true})
	case wire.ProbeNFTCount:
		for _, ns := range req.Netns {
			svcs, eps, err := p.nftCount(ns, firstOf(req.Match))
			if err != nil {
				return err
			}
			if err := p.send(wire.ProbeEvent{ID: req.ID, Kind: "count", Netns: ns, VS: svcs, RS: eps}); err != nil {
				return err
			}
		}
		return p.send(wire.ProbeEvent{ID: req.ID, Kind: "done", Final: true})
	case wire.ProbeAwaitCount:
		return p.awaitCount(req)
	case wire.ProbeAwaitRS:
		return p.awaitRS(req)
	case wire.ProbeDiff:
		return p.diff(req)
	case wire.ProbeProcs:
		procs, err := procStats(req.Match)
		if err != nil {
			return err
		}
		return p.send(wire.ProbeEvent{ID: req.ID, Kind: "procs", Procs: procs, Final: true})
	case wire.ProbeForks:
		n, err := forks()
		if err != nil {
			return err
		}
		return p.send(wire.ProbeEvent{ID: req.ID, Kind: "forks", Forks: n, Final: true})
	case wire.ProbeMetrics:
		if len(req.Netns) != 1 || len(req.Match) != 1 {
			return errors.New("metrics needs one netns and one prefix list")
		}
		text, err := fetchIn(req.Netns[0], req.URL, req.Match[0])
		if err != nil {
			return err
		}
		return p.send(wire.ProbeEvent{ID: req.ID, Kind: "metrics", Netns: req.Netns[0], Text: text, Final: true})
	}
	return fmt.Errorf("unknown op %q", req.Op)
}

// selected returns the virtual servers of netns that f matches.
func (p *probe) selected(netns string, f wire.ProbeFilter) (*ipvs.Handle, []*ipvs.Service, error) {
	h, err := p.handle(netns)
	if err != nil {
		return nil, nil, err
	}
	var pfx netip.Prefix
	if f.CIDR != "" {
		if pfx, err = netip.ParsePrefix(f.CIDR); err != nil {
			return nil, nil, err
		}
	}
	all, err := h.GetServices()
	if err != nil {
		return nil, nil, fmt.Errorf("list virtual servers in %s: %w", netns, err)
	}
	out := all[:0]
	for _, s := range all {
		a, ok := netip.AddrFromSlice(s.Address)
		if s.FWMark != 0 || !ok || (pfx.IsValid() && !pfx.Contains(a.Unmap())) {
			continue
		}
		if len(f.Ports) > 0 && !slices.Contains(f.Ports, s.Port) {
			continue
		}
		out = append(out, s)
	}
	return h, out, nil
}

// count returns the matching virtual servers and, when there are at least
// minVS of them, their real servers (else -1: not counted).
func (p *probe) count(netns string, f wire.ProbeFilter, minVS int) (vs, rs int, err error) {
	h, svcs, err := p.selected(netns, f)
	if err != nil {
		return 0, 0, err
	}
	if len(svcs) < minVS {
		return len(svcs), -1, nil
	}
	for _, s := range svcs {
		ds, err := h.GetDestinations(s)
		if err != nil {
			return 0, 0, fmt.Errorf("list real servers of %s:%d in %s: %w", s.Address, s.Port, netns, err)
		}
		rs += len(ds)
	}
	return len(svcs), rs, nil
}

func (p *probe) awaitCount(req wire.ProbeRequest) error {
	interval, deadline := ticks(req)
	left := slices.Clone(req.Netns)
	for polls := 1; len(left) > 0; polls++ {
		wait := interval
		for _, ns := range slices.Clone(left) {
			start := time.Now()
			vs, rs, err := p.count(ns, req.Filter, req.VS)
			if err != nil {
				return err
			}
			// Counting real servers costs one netlink request per virtual
			// server: keep the probe under a fifth of a CPU so it does not
			// slow down what it measures.
			wait = max(wait, 4*time.Since(start))
			if vs >= req.VS && rs >= req.RS {
				left = slices.DeleteFunc(left, func(s string) bool { return s == ns })
				if err := p.send(wire.ProbeEvent{ID: req.ID, Kind: "reached", Netns: ns, VS: vs, RS: rs, Polls: polls}); err != nil {
					return err
				}
			}
		}
		if len(left) > 0 && time.Now().After(deadline) {
			return fmt.Errorf("not reached %d virtual / %d real servers within %v in %v", req.VS, req.RS, time.Duration(req.TimeoutMS)*time.Millisecond, left)
		}
		if len(left) > 0 {
			time.Sleep(wait)
		}
	}
	return p.send(wire.ProbeEvent{ID: req.ID, Kind: "done", Final: true})
}

type target struct {
	svc *ipvs.Service
	rs  netip.AddrPort
}

func parseTargets(ts []wire.ProbeTarget) ([]target, error) {
	var out []target
	for _, t := range ts {
		vs, err := netip.ParseAddrPort(t.VS)
		if err != nil {
			return nil, err
		}
		rs, err := netip.ParseAddrPort(t.RS)
		if err != nil {
			return nil, err
		}
		fam := uint16(syscall.AF_INET)
		if vs.Addr().Is6() {
			fam = syscall.AF_INET6
		}
		out = append(out, target{svc: &ipvs.Service{AddressFamily: fam, Protocol: syscall.IPPROTO_TCP,
			Address: vs.Addr().AsSlice(), Port: vs.Port()}, rs: rs})
	}
	return out, nil
}

// has reports whether every target's real server is in its virtual
// server with a weight above zero (a missing virtual server is a no).
func has(h *ipvs.Handle, ts []target) bool {
	for _, t := range ts {
		ds, err := h.GetDestinations(t.svc)
		if err != nil {
			return false
		}
		found := false
		for _, d := range ds {
			a, ok := netip.AddrFromSlice(d.Address)
			if ok && a.Unmap() == t.rs.Addr() && d.Port == t.rs.Port() && d.Weight > 0 {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (p *probe) awaitRS(req wire.ProbeRequest) error {
	ts, err := parseTargets(req.Targets)
	if err != nil {
		return err
	}
	// seen reports whether ns holds what the request waits for.
	seen := map[string]func() (bool, error){}
	for _, ns := range req.Netns {
		h, err := p.handle(ns)
		if err != nil {
			return err
		}
		seen[ns] = func() (bool, error) { return has(h, ts), nil }
	}
	for _, ns := range req.NFTNetns {
		if _, err := p.nftSocket(ns); err != nil {
			return err
		}
		seen[ns] = func() (bool, error) { return p.nftHasEndpoints(ns, req.NFTTargets) }
	}
	interval, deadline := ticks(req)
	left := append(slices.Clone(req.Netns), req.NFTNetns...)
	for polls := 1; len(left) > 0; polls++ {
		for _, ns := range slices.Clone(left) {
			ok, err := seen[ns]()
			if err != nil {
				return err
			}
			if ok {
				at := p.guestUS() // after the read: an upper bound
				left = slices.DeleteFunc(left, func(s string) bool { return s == ns })
				if err := p.send(wire.ProbeEvent{ID: req.ID, Kind: "seen", Netns: ns, Polls: polls, GuestUS: at}); err != nil {
					return err
				}
			}
		}
		if polls == 1 {
			// Sent right away: the host takes its arrival as this instant.
			if err := p.send(wire.ProbeEvent{ID: req.ID, Kind: "polling", GuestUS: p.guestUS()}); err != nil {
				return err
			}
		}
		if len(left) > 0 && time.Now().After(deadline) {
			return fmt.Errorf("changes not seen within %v in %v", time.Duration(req.TimeoutMS)*time.Millisecond, left)
		}
		if len(left) > 0 {
			time.Sleep(interval)
		}
	}
	return p.send(wire.ProbeEvent{ID: req.ID, Kind: "done", Final: true})
}

func ticks(req wire.ProbeRequest) (time.Duration, time.Time) {
	interval := time.Duration(max(req.IntervalMS, 1)) * time.Millisecond
	timeout := time.Duration(max(req.TimeoutMS, 1000)) * time.Millisecond
	return interval, time.Now().Add(timeout)
}

// lines renders netns's matching virtual servers and real servers, one
// line each, sorted.
func (p *probe) lines(netns string, f wire.ProbeFilter) (vs, rs int, out []string, err error) {
	h, svcs, err := p.selected(netns, f)
	if err != nil {
		return 0, 0, nil, err
	}
	for _, s := range svcs {
		head := fmt.Sprintf("%d %s %s flags=%#x timeout=%d netmask=%#x",
			s.Protocol, net.JoinHostPort(s.Address.String(), fmt.Sprint(s.Port)), s.SchedName, s.Flags, s.Timeout, s.Netmask)
		out = append(out, head)
		ds, err := h.GetDestinations(s)
		if err != nil {
			return 0, 0, nil, fmt.Errorf("list real servers of %s in %s: %w", head, netns, err)
		}
		for _, d := range ds {
			out = append(out, fmt.Sprintf("%s -> %s w=%d fwd=%#x", head,
				net.JoinHostPort(d.Address.String(), fmt.Sprint(d.Port)), d.Weight, d.ConnectionFlags&ipvs.ConnectionFlagFwdMask))
		}
		rs += len(ds)
	}
	slices.Sort(out)
	return len(svcs), rs, out, nil
}

func (p *probe) diff(req wire.ProbeRequest) error {
	if len(req.Netns) != 2 {
		return errors.New("diff needs two namespaces")
	}
	vsA, rsA, a, err := p.lines(req.Netns[0], req.Filter)
	if err != nil {
		return err
	}
	vsB, rsB, b, err := p.lines(req.Netns[1], req.Filter)
	if err != nil {
		return err
	}
	onlyA, onlyB := minus(a, b), minus(b, a)
	return p.send(wire.ProbeEvent{ID: req.ID, Kind: "diff", VS: vsA, RS: rsA, VS2: vsB, RS2: rsB,
		Same: len(onlyA) == 0 && len(onlyB) == 0, OnlyA: first(onlyA, 20), OnlyB: first(onlyB, 20), Final: true})
}

// minus returns the lines of sorted a that sorted b lacks.
func minus(a, b []string) []string {
	var out []string
	for _, l := range a {
		if _, ok := slices.BinarySearch(b, l); !ok {
			out = append(out, l)
		}
	}
	return out
}

// firstOf is m[0], or nil.
func firstOf(m [][]string) []string {
	if len(m) == 0 {
		return nil
	}
	return m[0]
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
