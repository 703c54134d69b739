package vm

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// ProbePackage is the guest side of Probe; add it to Options.GoPackages.
const ProbePackage = "./e2e/vm/cmd/ipvsprobe"

// FloorPackage writes a namespace's state again into another, timed, with
// vsplane's kernel layer alone (e2e/vmbench's cold-start floor).
const FloorPackage = "./e2e/vm/cmd/kernelfloor"

// Probe is the host side of ipvsprobe (e2e/vm/cmd/ipvsprobe): one guest
// process in the VM root namespace that reads the IPVS tables of node
// namespaces over netlink, so a measurement can poll every 10 ms without
// starting a process each time. It reaches the host through guestfwd;
// every event is timestamped here on arrival (no guest clock is involved).
// One request at a time: a Probe is not safe for concurrent use.
type Probe struct {
	conn   net.Conn
	enc    *json.Encoder
	events chan TimedEvent
	// readErr is why the reader stopped; set before events is closed.
	readErr error
	nextID  int
	proc    *Proc
}

// TimedEvent is a guest event and when it arrived on the host.
type TimedEvent struct {
	wire.ProbeEvent
	At time.Time
}

// SinceWrite times a change seen by ipvsprobe's ProbeAwaitRS: from written
// (host clock, after the polling event arrived) to the poll that saw it
// (seen). The guest's clock is mapped to the host's through the polling
// event, taken as arriving the instant it was sent: the result is too
// long by that event's one-way delay, never too short, and it does not
// include the delay of the seen event itself (which, through QEMU's
// guestfwd, was measured at 20-30 ms and would dwarf a fast change).
func SinceWrite(polling, seen TimedEvent, written time.Time) time.Duration {
	return time.Duration(seen.GuestUS-polling.GuestUS)*time.Microsecond - written.Sub(polling.At)
}

// StartProbe starts ipvsprobe in the VM, dialing ln (a host listener on
// 127.0.0.1 whose port is in Options.GuestFwdPorts), and returns once it is
// connected. Stop (or the VM's) ends it.
func StartProbe(ctx context.Context, v *VM, ln net.Listener) (*Probe, error) {
	port := ln.Addr().(*net.TCPAddr).Port
	proc, err := v.Start(ctx, "ipvsprobe", "exec ipvsprobe --connect "+net.JoinHostPort(HostLoopIP, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	var a accepted
	select {
	case a = <-ch:
	case <-ctx.Done():
		ln.Close() // ends Accept
		log, _ := proc.Log(context.Background())
		return nil, fmt.Errorf("ipvsprobe did not connect: %w\n%s", ctx.Err(), log)
	}
	if a.err != nil {
		return nil, a.err
	}
	p := &Probe{conn: a.c, enc: json.NewEncoder(a.c), events: make(chan TimedEvent, 1024), proc: proc}
	go p.read()
	return p, nil
}

func (p *Probe) read() {
	sc := bufio.NewScanner(p.conn)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		at := time.Now()
		var ev wire.ProbeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			p.readErr = fmt.Errorf("bad ipvsprobe event %q: %w", sc.Text(), err)
			close(p.events)
			return
		}
		p.events <- TimedEvent{ProbeEvent: ev, At: at}
	}
	err := sc.Err()
	if err == nil {
		err = errors.New("ipvsprobe closed the connection")
	}
	p.readErr = err
	close(p.events)
}

// Send sends req with a fresh ID and returns the ID.
func (p *Probe) Send(req wire.ProbeRequest) (int, error) {
	p.nextID++
	req.ID = p.nextID
	return req.ID, p.enc.Encode(req)
}

// Next returns the next event; an "error" event is returned as an error.
func (p *Probe) Next(ctx context.Context) (TimedEvent, error) {
	select {
	case ev, ok := <-p.events:
		if !ok {
			return ev, fmt.Errorf("ipvsprobe: %w", p.readErr)
		}
		if ev.Kind == "error" {
			return ev, fmt.Errorf("ipvsprobe: %s", ev.Error)
		}
		return ev, nil
	case <-ctx.Done():
		return TimedEvent{}, ctx.Err()
	}
}

// Do sends req and returns its events up to and including the final one.
func (p *Probe) Do(ctx context.Context, req wire.ProbeRequest) ([]TimedEvent, error) {
	id, err := p.Send(req)
	if err != nil {
		return nil, err
	}
	var out []TimedEvent
	for {
		ev, err := p.Next(ctx)
		if err != nil {
			return out, err
		}
		if ev.ID != id {
			continue // a late event of an earlier, abandoned request
		}
		out = append(out, ev)
		if ev.Final {
			return out, nil
		}
	}
}

// Count returns the virtual and real servers matching f in netns.
func (p *Probe) Count(ctx context.Context, netns string, f wire.ProbeFilter) (vs, rs int, err error) {
	return p.count(ctx, wire.ProbeRequest{Op: wire.ProbeCount, Netns: []string{netns}, Filter: f})
}

// count returns the VS and RS of req's "count" event.
func (p *Probe) count(ctx context.Context, req wire.ProbeRequest) (vs, rs int, err error) {
	evs, err := p.Do(ctx, req)
	if err != nil {
		return 0, 0, err
	}
	for _, ev := range evs {
		if ev.Kind == "count" {
			return ev.VS, ev.RS, nil
		}
	}
	return 0, 0, errors.New("ipvsprobe: no count")
}

// NFTCount returns kube-proxy's nftables service-port chains in netns
// whose names contain one of substrings (none: all) and the endpoints in
// their dnat maps (see wire.ProbeNFTCount).
func (p *Probe) NFTCount(ctx context.Context, netns string, substrings ...string) (services, endpoints int, err error) {
	return p.count(ctx, wire.ProbeRequest{Op: wire.ProbeNFTCount, Netns: []string{netns}, Match: [][]string{substrings}})
}

// KubeProxyServiceChain is the chain kube-proxy's nftables mode keeps for
// a Service port (service "namespace/name", protocol as in the Service,
// port name): "service-", a base32 SHA-256 prefix of the rest, and
// "namespace/name/proto/port", as pkg/proxy/nftables names it. The probe
// reads the endpoints of its dnat map (wire.ProbeAwaitRS).
func KubeProxyServiceChain(service, protocol, portName string) string {
	name := fmt.Sprintf("%s/%s/%s", service, strings.ToLower(protocol), portName)
	sum := sha256.Sum256([]byte(name))
	return "service-" + base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + name
}

// AwaitCount waits until netns holds at least vs virtual servers and rs
// real servers matching f, polling every interval, and returns when that
// was seen (host clock).
func (p *Probe) AwaitCount(ctx context.Context, netns string, f wire.ProbeFilter, vs, rs int, interval, timeout time.Duration) (TimedEvent, error) {
	evs, err := p.Do(ctx, wire.ProbeRequest{Op: wire.ProbeAwaitCount, Netns: []string{netns}, Filter: f, VS: vs, RS: rs,
		IntervalMS: int(interval.Milliseconds()), TimeoutMS: int(timeout.Milliseconds())})
	if err != nil {
		return TimedEvent{}, err
	}
	for _, ev := range evs {
		if ev.Kind == "reached" {
			return ev, nil
		}
	}
	return TimedEvent{}, errors.New("ipvsprobe: no reached event")
}

// Diff compares the virtual and real servers matching f in namespaces a
// and b (the event's VS/RS are a's, VS2/RS2 b's).
func (p *Probe) Diff(ctx context.Context, a, b string, f wire.ProbeFilter) (wire.ProbeEvent, error) {
	evs, err := p.Do(ctx, wire.ProbeRequest{Op: wire.ProbeDiff, Netns: []string{a, b}, Filter: f})
	if err != nil {
		return wire.ProbeEvent{}, err
	}
	return evs[len(evs)-1].ProbeEvent, nil
}

// Procs returns the guest processes matching one of match (see wire.ProbeProcs).
func (p *Probe) Procs(ctx context.Context, match ...[]string) ([]wire.ProcStat, error) {
	evs, err := p.Do(ctx, wire.ProbeRequest{Op: wire.ProbeProcs, Match: match})
	if err != nil {
		return nil, err
	}
	return evs[len(evs)-1].Procs, nil
}

// Forks returns the VM's fork counter (threads included).
func (p *Probe) Forks(ctx context.Context) (uint64, error) {
	evs, err := p.Do(ctx, wire.ProbeRequest{Op: wire.ProbeForks})
	if err != nil {
		return 0, err
	}
	return evs[len(evs)-1].Forks, nil
}

// Metrics fetches url (http://IP:PORT/path) inside netns and returns the
// lines starting with one of prefixes.
func (p *Probe) Metrics(ctx context.Context, netns, url string, prefixes ...string) (string, error) {
	evs, err := p.Do(ctx, wire.ProbeRequest{Op: wire.ProbeMetrics, Netns: []string{netns}, URL: url, Match: [][]string{prefixes}})
	if err != nil {
		return "", err
	}
	return evs[len(evs)-1].Text, nil
}

// Stop closes the connection; ipvsprobe exits.
func (p *Probe) Stop() { _ = p.conn.Close() }
