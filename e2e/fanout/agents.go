package fanout

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/dataplane/client"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/internal/bearer"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Fleet is N agents in this process: each a real dataplane/client stream
// client over TLS with its node's projected token, applying into a real
// reconcile.Reconciler on its own in-memory kernel. Between the client and
// the reconciler sits a tap that counts what arrives and timestamps Acks;
// under the gRPC transport sits a counting net.Conn.
type Fleet struct {
	target string
	tls    *tls.Config
	log    *zap.Logger
	clock  *clock
	agents []*Agent
	// slots bound how many agents apply at once (GOMAXPROCS): N agents
	// share this process's cores, and thousands of runnable applies would
	// starve the gRPC transport goroutines (keepalive and handshake
	// timeouts that real nodes, each with its own CPU, would not see).
	// Waiting for a slot counts as the agent's own time (between
	// "received" and its Ack).
	slots chan struct{}

	// Totals since the fleet started; phases take differences.
	deltas, resources, removed, payload, nacks atomic.Int64
	wireIn, wireOut                            atomic.Int64
	watch                                      atomic.Pointer[WatchSet]
}

// Agent is one node's agent. Its reconciler and kernel outlive its stream
// clients: Restart cuts the stream and connects again with the versions held.
type Agent struct {
	Index int
	Node  string
	// TokenFile holds the node's projected ServiceAccount token.
	TokenFile string
	Kernel    *memory.Kernel
	Rec       *reconcile.Reconciler

	f      *Fleet
	client *client.Client
	// streamCtx is the context of the client's current run (its end is
	// not a stream failure).
	streamCtx    atomic.Pointer[context.Context]
	clientCancel context.CancelFunc
	clientDone   chan struct{}
	streamEnds   atomic.Int64
}

// Counters is a snapshot of the fleet's totals.
type Counters struct {
	Deltas, Resources, Removed, PayloadBytes, NACKs int64
	// WireIn is every byte the agents' sockets read (the control plane's
	// Deltas with gRPC, HTTP/2 and TLS framing, handshakes, pings); WireOut
	// what they wrote (Hellos, Acks, handshakes).
	WireIn, WireOut int64
}

// Sub is c - o.
func (c Counters) Sub(o Counters) Counters {
	return Counters{c.Deltas - o.Deltas, c.Resources - o.Resources, c.Removed - o.Removed,
		c.PayloadBytes - o.PayloadBytes, c.NACKs - o.NACKs, c.WireIn - o.WireIn, c.WireOut - o.WireOut}
}

// Counters returns the totals now.
func (f *Fleet) Counters() Counters {
	return Counters{f.deltas.Load(), f.resources.Load(), f.removed.Load(), f.payload.Load(), f.nacks.Load(),
		f.wireIn.Load(), f.wireOut.Load()}
}

// newFleet builds the agents (reconcilers and kernels; nothing connects yet).
func newFleet(ctx context.Context, target string, tlsCfg *tls.Config, nodes, tokenFiles []string, clk *clock, log *zap.Logger) (*Fleet, error) {
	f := &Fleet{target: target, tls: tlsCfg, log: log, clock: clk, slots: make(chan struct{}, runtime.GOMAXPROCS(0))}
	for i, n := range nodes {
		mem := memory.New()
		// No periodic full reconcile during the run (as the integration
		// tests' agents): it would add CPU unrelated to the fan-out.
		rec, err := reconcile.New(mem.Kernel(), reconcile.Config{Period: time.Hour}, log.Named(n))
		if err != nil {
			return nil, err
		}
		go func() { _ = rec.Run(ctx) }()
		f.agents = append(f.agents, &Agent{Index: i, Node: n, TokenFile: tokenFiles[i], Kernel: mem, Rec: rec, f: f})
	}
	return f, nil
}

// Agents returns the agents in node order.
func (f *Fleet) Agents() []*Agent { return f.agents }

// StartAll starts every agent's stream client at once. With fresh, each
// agent gets a new client (as a restarted agent process with its saved
// state); otherwise an agent's client of its last run runs again (as after
// a lost replica). Both Hellos carry the system version held.
func (f *Fleet) StartAll(ctx context.Context, fresh bool) error {
	for _, a := range f.agents {
		if err := a.start(ctx, fresh); err != nil {
			return err
		}
	}
	return nil
}

// StopAll ends every agent's stream client and waits for them (kernels and
// reconcilers keep their state: fail-static).
func (f *Fleet) StopAll() {
	for _, a := range f.agents {
		if a.clientCancel != nil {
			a.clientCancel()
		}
	}
	for _, a := range f.agents {
		if a.clientDone != nil {
			<-a.clientDone
		}
	}
}

// StreamEnds is how many streams ended with an error or a cut, over all
// agents (a stream that ends unexpectedly during a phase is a finding).
func (f *Fleet) StreamEnds() int64 {
	var n int64
	for _, a := range f.agents {
		n += a.streamEnds.Load()
	}
	return n
}

func (a *Agent) start(ctx context.Context, fresh bool) error {
	cctx, cancel := context.WithCancel(ctx)
	a.streamCtx.Store(&cctx)
	if fresh || a.client == nil {
		if err := a.newClient(); err != nil {
			cancel()
			return err
		}
	}
	done := make(chan struct{})
	a.clientCancel, a.clientDone = cancel, done
	go func() {
		defer close(done)
		_ = a.client.Run(cctx)
	}()
	return nil
}

// newClient builds the agent's stream client.
func (a *Agent) newClient() error {
	c, err := client.New(client.Config{
		Targets:      []string{a.f.target},
		NodeName:     a.Node,
		AgentVersion: "fanout-bench",
		Applier:      tap{a: a},
		Logger:       a.f.log.Named(a.Node),
		Credentials:  credentials.NewTLS(a.f.tls),
		Token:        bearer.File{Path: a.TokenFile},
		BackoffBase:  50 * time.Millisecond, BackoffMax: time.Second,
		// The control plane is ready before agents start; at large sizes
		// a first Delta may take long to come because every stream starts
		// at once, and giving up would only restart the stream.
		FirstDeltaTimeout: 10 * time.Minute,
		DialOptions:       []grpc.DialOption{grpc.WithContextDialer(a.f.dial)},
		OnStreamEnd: func(err error) {
			if (*a.streamCtx.Load()).Err() == nil {
				a.streamEnds.Add(1)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.Node, err)
	}
	a.client = c
	return nil
}

// dial is the agents' dialer: a TCP connection whose bytes are counted.
func (f *Fleet) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, in: &f.wireIn, out: &f.wireOut}, nil
}

type countingConn struct {
	net.Conn
	in, out *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

// tap is the Applier the client sees: the reconciler, observed.
type tap struct{ a *Agent }

func (t tap) Versions() map[string]string { return t.a.Rec.Versions() }

func (t tap) Apply(ctx context.Context, d *vsplanev1.Delta) *vsplanev1.Ack {
	// The client calls Apply as soon as it received the Delta.
	recv := t.a.f.clock.now()
	t.a.f.slots <- struct{}{}
	ack := t.a.Rec.Apply(ctx, d)
	<-t.a.f.slots
	// The client sends the Ack right after Apply returns: this is the
	// agent's Ack time.
	now := t.a.f.clock.now()
	f := t.a.f
	f.deltas.Add(1)
	f.resources.Add(int64(len(d.GetResources())))
	f.removed.Add(int64(len(d.GetRemoved())))
	f.payload.Add(int64(proto.Size(d)))
	var failed map[string]bool
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		f.nacks.Add(1)
		failed = map[string]bool{}
		for _, e := range ack.GetErrors() {
			failed[e.GetName()] = true
		}
		f.log.Warn("NACK", zap.String("node", t.a.Node), zap.Any("errors", ack.GetErrors()))
	}
	if ws := f.watch.Load(); ws != nil {
		ws.observe(t.a.Index, d, failed, recv, now)
	}
	return ack
}

// WatchSet waits for acknowledgements: for each target (a resource name and
// a marker address), every agent's first Ack of a Delta carrying that
// resource with the marker among its real servers ("" = any content); with
// AnyDelta also every agent's first Ack of any Delta. Install it (Fleet.Watch)
// before causing the change.
type WatchSet struct {
	targets   map[string]*target
	anyDelta  *target
	agents    int
	remaining atomic.Int64
	done      chan struct{}
}

type target struct {
	name   string
	marker string
	// acks[a] is the clock time of agent a's Ack (0: none yet), recv[a]
	// when that Delta was handed to its Apply.
	acks, recv []atomic.Int64
}

// Watch installs a WatchSet for targets (resource name -> marker address)
// and returns it.
func (f *Fleet) Watch(targets map[string]string, anyDelta bool) *WatchSet {
	n := len(f.agents)
	ws := &WatchSet{targets: make(map[string]*target, len(targets)), agents: n, done: make(chan struct{})}
	for name, m := range targets {
		ws.targets[name] = &target{name: name, marker: m, acks: make([]atomic.Int64, n), recv: make([]atomic.Int64, n)}
	}
	if anyDelta {
		ws.anyDelta = &target{name: "(any Delta)", acks: make([]atomic.Int64, n), recv: make([]atomic.Int64, n)}
	}
	total := int64(len(ws.targets) * n)
	if anyDelta {
		total += int64(n)
	}
	ws.remaining.Store(total)
	if total == 0 {
		close(ws.done)
	}
	f.watch.Store(ws)
	return ws
}

// Unwatch removes ws if it is installed.
func (f *Fleet) Unwatch(ws *WatchSet) { f.watch.CompareAndSwap(ws, nil) }

func (ws *WatchSet) observe(agent int, d *vsplanev1.Delta, failed map[string]bool, recv, now int64) {
	if ws.anyDelta != nil {
		ws.hit(ws.anyDelta, agent, recv, now)
	}
	for _, r := range d.GetResources() {
		tg := ws.targets[r.GetName()]
		if tg == nil || failed[r.GetName()] || (tg.marker != "" && !hasRealServer(r, tg.marker)) {
			continue
		}
		ws.hit(tg, agent, recv, now)
	}
}

func (ws *WatchSet) hit(tg *target, agent int, recv, now int64) {
	if now == 0 {
		now = 1 // 0 means "no Ack"
	}
	if !tg.acks[agent].CompareAndSwap(0, now) {
		return
	}
	tg.recv[agent].Store(recv)
	if ws.remaining.Add(-1) == 0 {
		close(ws.done)
	}
}

func hasRealServer(r *vsplanev1.Resource, addr string) bool {
	for _, vs := range r.GetService().GetVirtualServers() {
		for _, rs := range vs.GetRealServers() {
			if rs.GetAddress() == addr {
				return true
			}
		}
	}
	return false
}

// Wait blocks until every target is acknowledged by every agent, ctx ends
// or timeout passes; the error says what is missing.
func (ws *WatchSet) Wait(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ws.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w; %s", ctx.Err(), ws.missing())
	case <-t.C:
		return fmt.Errorf("not acknowledged within %v: %s", timeout, ws.missing())
	}
}

// missing describes the outstanding acknowledgements (a few of them).
func (ws *WatchSet) missing() string {
	var out []string
	all := make([]*target, 0, len(ws.targets)+1)
	for _, tg := range ws.targets {
		all = append(all, tg)
	}
	if ws.anyDelta != nil {
		all = append(all, ws.anyDelta)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	for _, tg := range all {
		n := 0
		for a := range tg.acks {
			if tg.acks[a].Load() == 0 {
				n++
			}
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("%s (marker %q) by %d of %d agents", tg.name, tg.marker, n, ws.agents))
		}
	}
	total := len(out)
	if len(out) > 5 {
		out = out[:5]
	}
	return fmt.Sprintf("%d acknowledgements outstanding over %d targets: %s", ws.remaining.Load(), total, strings.Join(out, "; "))
}

// Ack returns agent a's Ack time of the target called name (0: none).
func (ws *WatchSet) Ack(name string, a int) int64 {
	if tg := ws.targets[name]; tg != nil {
		return tg.acks[a].Load()
	}
	return 0
}

// Received returns when the Delta agent a acknowledged for the target
// called name was handed to its Apply (0: none).
func (ws *WatchSet) Received(name string, a int) int64 {
	if tg := ws.targets[name]; tg != nil {
		return tg.recv[a].Load()
	}
	return 0
}

// FirstDelta returns agent a's first Ack time of any Delta (AnyDelta),
// and when that Delta was handed to its Apply.
func (ws *WatchSet) FirstDelta(a int) (acked, received int64) {
	return ws.anyDelta.acks[a].Load(), ws.anyDelta.recv[a].Load()
}

// LastAck returns, per agent, the latest Ack time over every target (the
// moment that agent held all of them).
func (ws *WatchSet) LastAck() []int64 {
	out := make([]int64, ws.agents)
	for _, tg := range ws.targets {
		for a := range tg.acks {
			out[a] = max(out[a], tg.acks[a].Load())
		}
	}
	return out
}

// clock is a monotonic clock in nanoseconds since the run began, shared by
// the writers and the agents' taps (one process).
type clock struct{ base time.Time }

func newClock() *clock { return &clock{base: time.Now()} }

func (c *clock) now() int64 { return int64(time.Since(c.base)) }
