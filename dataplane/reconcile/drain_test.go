package reconcile

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// clock is an injectable Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var (
	vsA   = kernel.AddrKey(netip.MustParseAddr("198.18.0.10"), kernel.ProtocolTCP, 80)
	vsB   = kernel.AddrKey(netip.MustParseAddr("198.18.0.11"), kernel.ProtocolUDP, 53)
	rsA2  = kernel.DestinationKey{Address: netip.MustParseAddr("198.19.2.3"), Port: 8080}
	rsB1  = kernel.DestinationKey{Address: netip.MustParseAddr("198.19.1.5"), Port: 5353}
	svcA1 = tcp("a", "198.18.0.10", 80, be("198.19.1.2", 8080)) // svcA without rsA2
)

const drainEvery = 5 * time.Second

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// drainSetup applies settings + svcA + svcB with a fake clock.
func drainSetup(t *testing.T, cfg Config) (*memory.Kernel, *Reconciler, *clock) {
	t.Helper()
	mk := memory.New()
	c := newClock()
	cfg.Now = c.Now
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = -1 // these tests read nextWake for drains alone
	}
	r := newReconciler(t, mk, cfg)
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	return mk, r, c
}

func setConns(t *testing.T, mk *memory.Kernel, key kernel.VirtualServerKey, dk kernel.DestinationKey, active, inactive uint32) {
	t.Helper()
	if err := mk.SetConnections(key, dk, active, inactive); err != nil {
		t.Fatal(err)
	}
}

func delta(nonce string, res ...*vsplanev1.Resource) *vsplanev1.Delta {
	return &vsplanev1.Delta{Nonce: nonce, Resources: res}
}

// startDrain removes rsA2 (with connections) from svcA.
func startDrain(t *testing.T, mk *memory.Kernel, r *Reconciler) {
	t.Helper()
	setConns(t, mk, vsA, rsA2, 1, 2)
	mk.ResetCalls()
	ack := apply(t, r, delta("drain", svcA1.resource()))
	mustAck(t, ack)
	if d := cmp.Diff(map[string]uint32{wire.OpUpdateDestination: 1}, ops(ack.GetKernelOperations())); d != "" {
		t.Fatalf("kernel_operations (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{"ipvs.UpdateDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("kernel writes (-want +got):\n%s", d)
	}
	mk.ResetCalls()
}

func destsOf(t *testing.T, mk *memory.Kernel, key kernel.VirtualServerKey) []string {
	t.Helper()
	return readState(t, mk).Services[key.String()+" rr"]
}

func TestDrainKeepsTCPRealServerWhileConnected(t *testing.T) {
	mk, r, c := drainSetup(t, Config{DrainCheckInterval: drainEvery})
	start := c.Now()
	startDrain(t, mk, r)
	if d := cmp.Diff([]string{"198.19.1.2:8080 w1", "198.19.2.3:8080 w0"}, destsOf(t, mk, vsA)); d != "" {
		t.Fatalf("destinations (-want +got):\n%s", d)
	}
	want := []Drain{{VirtualServer: vsA, RealServer: rsA2, Since: start, ActiveConn: 1, InactiveConn: 2}}
	if d := cmp.Diff(want, r.Draining(), addrCmp); d != "" {
		t.Fatalf("Draining (-want +got):\n%s", d)
	}
	st := r.Status().GetDraining()
	if len(st) != 1 || st[0].GetVirtualServer() != "tcp/198.18.0.10:80" || st[0].GetAddress() != "198.19.2.3" ||
		st[0].GetPort() != 8080 || !st[0].GetSince().AsTime().Equal(start) ||
		st[0].GetActiveConnections() != 1 || st[0].GetInactiveConnections() != 2 {
		t.Fatalf("AgentStatus.draining = %v", st)
	}
	if s := r.Stats(); s.Draining != 1 {
		t.Fatalf("Stats.Draining = %d, want 1", s.Draining)
	}

	// The check is armed for one interval after the drain started.
	if w := r.nextWake(); w != drainEvery {
		t.Fatalf("nextWake = %v, want %v", w, drainEvery)
	}
	if r.drainDue() {
		t.Fatal("drain check due before its interval")
	}
	c.advance(drainEvery)
	if !r.drainDue() {
		t.Fatal("drain check not due after its interval")
	}

	// Still connected: kept, nothing written, counters refreshed.
	setConns(t, mk, vsA, rsA2, 0, 1)
	r.CheckDrains(context.Background())
	if d := cmp.Diff(map[string]int{}, writes(mk)); d != "" {
		t.Fatalf("writes of a check with connections (-want +got):\n%s", d)
	}
	want[0].ActiveConn, want[0].InactiveConn = 0, 1
	if d := cmp.Diff(want, r.Draining(), addrCmp); d != "" {
		t.Fatalf("Draining (-want +got):\n%s", d)
	}
	if r.drainDue() {
		t.Fatal("check not re-armed for the next interval")
	}

	// Connections gone: deleted at the next check.
	setConns(t, mk, vsA, rsA2, 0, 0)
	c.advance(drainEvery)
	r.CheckDrains(context.Background())
	if d := cmp.Diff(map[string]int{"ipvs.DeleteDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.19.1.2:8080 w1"}, destsOf(t, mk, vsA)); d != "" {
		t.Fatalf("destinations (-want +got):\n%s", d)
	}
	s := r.Stats()
	if len(r.Draining()) != 0 || s.Draining != 0 || s.DrainsCompleted != 1 || s.DrainsTimedOut != 0 {
		t.Fatalf("after the drain: draining %v, stats %+v", r.Draining(), s)
	}
	if d := cmp.Diff(map[string]uint64{wire.OpDeleteDestination: 1}, s.DrainOps); d != "" {
		t.Fatalf("DrainOps (-want +got):\n%s", d)
	}
	if !r.drains.next.IsZero() || r.drainDue() {
		t.Fatal("drain check still armed with nothing draining")
	}
	if w := r.nextWake(); w <= drainEvery {
		t.Fatalf("nextWake = %v: still waking for drains", w)
	}
	mustAck(t, apply(t, r, delta("again", svcA1.resource()))) // nothing to do now
}

func TestDrainBoundedByMaxDrain(t *testing.T) {
	mk, r, c := drainSetup(t, Config{Period: time.Hour, DrainCheckInterval: drainEvery, MaxDrain: time.Minute})
	startDrain(t, mk, r)
	c.advance(time.Minute - time.Second)
	r.CheckDrains(context.Background())
	if n := len(r.Draining()); n != 1 || len(writes(mk)) != 0 {
		t.Fatalf("before MaxDrain: draining %d, writes %v", n, writes(mk))
	}
	// The next check comes at the bound, not a whole interval later.
	if w := r.nextWake(); w != time.Second {
		t.Fatalf("nextWake = %v, want 1s (MaxDrain reached)", w)
	}
	c.advance(time.Second)
	if !r.drainDue() {
		t.Fatal("drain check not due at MaxDrain")
	}
	r.CheckDrains(context.Background())
	if d := cmp.Diff(map[string]int{"ipvs.DeleteDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes at MaxDrain (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.19.1.2:8080 w1"}, destsOf(t, mk, vsA)); d != "" {
		t.Fatalf("destinations (-want +got):\n%s", d)
	}
	if s := r.Stats(); s.DrainsTimedOut != 1 || s.DrainsCompleted != 0 || s.Draining != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestDrainDefaults(t *testing.T) {
	r := newReconciler(t, memory.New(), Config{})
	if r.cfg.DrainCheckInterval != 5*time.Second || r.cfg.MaxDrain != 10*time.Minute {
		t.Fatalf("defaults: check %v, max %v", r.cfg.DrainCheckInterval, r.cfg.MaxDrain)
	}
	for _, cfg := range []Config{{DrainCheckInterval: -time.Second}, {MaxDrain: -time.Second}} {
		if _, err := New(memory.New().Kernel(), cfg, zaptest.NewLogger(t)); err == nil {
			t.Errorf("New(%+v) accepted a negative duration", cfg)
		}
	}
}

func TestUDPRealServerDeletedAtOnce(t *testing.T) {
	mk, r, _ := drainSetup(t, Config{})
	setConns(t, mk, vsB, rsB1, 3, 4)
	mk.ResetCalls()
	gone := svcB
	gone.backends = []backend{be("198.19.1.6", 5353)}
	ack := apply(t, r, delta("udp", gone.resource()))
	mustAck(t, ack)
	if d := cmp.Diff(map[string]uint32{wire.OpAddDestination: 1, wire.OpDeleteDestination: 1}, ops(ack.GetKernelOperations())); d != "" {
		t.Fatalf("kernel_operations (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.19.1.6:5353 w1"}, destsOf(t, mk, vsB)); d != "" {
		t.Fatalf("destinations (-want +got):\n%s", d)
	}
	if n := len(r.Draining()); n != 0 || !r.drains.next.IsZero() {
		t.Fatalf("UDP real server drains (%d) or check armed", n)
	}
}

func TestSCTPRealServerDeletedAtOnce(t *testing.T) {
	mk, r, _ := drainSetup(t, Config{})
	sctp := svcSpec{name: "s", vip: "198.18.0.12", port: 9, proto: vsplanev1.Protocol_PROTOCOL_SCTP,
		backends: []backend{be("198.19.1.7", 9), be("198.19.1.8", 9)}}
	mustAck(t, apply(t, r, delta("s1", sctp.resource())))
	key := kernel.AddrKey(netip.MustParseAddr("198.18.0.12"), kernel.ProtocolSCTP, 9)
	setConns(t, mk, key, kernel.DestinationKey{Address: netip.MustParseAddr("198.19.1.8"), Port: 9}, 1, 0)
	mk.ResetCalls()
	sctp.backends = sctp.backends[:1]
	mustAck(t, apply(t, r, delta("s2", sctp.resource())))
	if d := cmp.Diff(map[string]int{"ipvs.DeleteDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}
	if n := len(r.Draining()); n != 0 {
		t.Fatalf("SCTP real server drains (%d)", n)
	}
}

func TestEndpointReturnsWhileDraining(t *testing.T) {
	mk, r, _ := drainSetup(t, Config{})
	startDrain(t, mk, r)
	ack := apply(t, r, delta("back", svcA.resource()))
	mustAck(t, ack)
	if d := cmp.Diff(map[string]uint32{wire.OpUpdateDestination: 1}, ops(ack.GetKernelOperations())); d != "" {
		t.Fatalf("kernel_operations (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{"ipvs.UpdateDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("kernel writes: want one update, no delete/add (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.19.1.2:8080 w1", "198.19.2.3:8080 w1"}, destsOf(t, mk, vsA)); d != "" {
		t.Fatalf("destinations (-want +got):\n%s", d)
	}
	ds, err := mk.Kernel().IPVS.ListDestinations(vsA)
	if err != nil {
		t.Fatal(err)
	}
	if ds[1].ActiveConn != 1 || ds[1].InactiveConn != 2 {
		t.Fatalf("connections of the returned real server lost: %+v", ds[1])
	}
	if n := len(r.Draining()); n != 0 || !r.drains.next.IsZero() {
		t.Fatalf("returned real server still draining (%d) or check armed", n)
	}
	// A later check must not touch it.
	mk.ResetCalls()
	r.CheckDrains(context.Background())
	if len(writes(mk)) != 0 {
		t.Fatalf("check wrote %v", writes(mk))
	}
}

func TestRestartMidDrainKeepsDraining(t *testing.T) {
	mk, r, c := drainSetup(t, Config{})
	// A wanted real server the control plane gives weight 0 must stay so,
	// and the others keep their weights: the restart touches no weight.
	withZero := svcB
	withZero.backends = []backend{{ip: "198.19.1.5", port: 5353, weight: 0}}
	mustAck(t, apply(t, r, delta("z", withZero.resource())))
	startDrain(t, mk, r)
	before := readState(t, mk)

	// New process over the same kernel; its first Apply is the full state.
	c.advance(time.Minute)
	r2 := newReconciler(t, mk, Config{Now: c.Now, DrainCheckInterval: drainEvery})
	mk.ResetCalls()
	ack := apply(t, r2, full(settingsRes(defaultNodeSettings()), svcA1.resource(), withZero.resource()))
	mustAck(t, ack)
	if d := cmp.Diff(map[string]uint32{}, ops(ack.GetKernelOperations())); d != "" {
		t.Fatalf("restart wrote (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{}, writes(mk)); d != "" {
		t.Fatalf("restart kernel writes (-want +got):\n%s", d)
	}
	if d := cmp.Diff(before, readState(t, mk)); d != "" {
		t.Fatalf("kernel changed by the restart (-before +after):\n%s", d)
	}
	want := []Drain{{VirtualServer: vsA, RealServer: rsA2, Since: c.Now(), ActiveConn: 1, InactiveConn: 2}}
	if d := cmp.Diff(want, r2.Draining(), addrCmp); d != "" {
		t.Fatalf("Draining after restart (-want +got):\n%s", d)
	}

	// The drain continues in the new process.
	setConns(t, mk, vsA, rsA2, 0, 0)
	c.advance(drainEvery)
	if !r2.drainDue() {
		t.Fatal("drain check not armed after restart")
	}
	r2.CheckDrains(context.Background())
	if d := cmp.Diff(map[string]int{"ipvs.DeleteDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.19.1.5:5353 w0"}, destsOf(t, mk, vsB)); d != "" {
		t.Fatalf("wanted weight-0 real server touched (-want +got):\n%s", d)
	}
	if s := r2.Stats(); s.DrainsCompleted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A real server removed while the agent was down, still connected, starts
// draining on the first Apply instead of being deleted.
func TestRestartDrainsRemovedWhileDown(t *testing.T) {
	mk, _, c := drainSetup(t, Config{})
	setConns(t, mk, vsA, rsA2, 1, 0)
	r2 := newReconciler(t, mk, Config{Now: c.Now})
	mk.ResetCalls()
	mustAck(t, apply(t, r2, full(settingsRes(defaultNodeSettings()), svcA1.resource(), svcB.resource())))
	if d := cmp.Diff(map[string]int{"ipvs.UpdateDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}
	if n := len(r2.Draining()); n != 1 {
		t.Fatalf("draining %d, want 1", n)
	}
}

func TestFullReconcileLeavesDrainsAlone(t *testing.T) {
	mk, r, c := drainSetup(t, Config{MaxDrain: time.Hour})
	startDrain(t, mk, r)
	c.advance(time.Minute)
	r.Reconcile(context.Background())
	if d := cmp.Diff(map[string]int{}, writes(mk)); d != "" {
		t.Fatalf("full reconcile wrote (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.19.1.2:8080 w1", "198.19.2.3:8080 w0"}, destsOf(t, mk, vsA)); d != "" {
		t.Fatalf("destinations (-want +got):\n%s", d)
	}
	if n := len(r.Draining()); n != 1 || r.Stats().DriftRepaired != 0 {
		t.Fatalf("draining %d, stats %+v", n, r.Stats())
	}

	// Someone raises the draining weight: the repair is weight 0 again,
	// the drain (and its start) kept.
	if err := updateDest(mk.Kernel(), vsA, kernel.Destination{Address: rsA2.Address, Port: rsA2.Port, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	mk.ResetCalls()
	r.Reconcile(context.Background())
	if d := cmp.Diff(map[string]int{"ipvs.UpdateDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}
	if ds := r.Draining(); len(ds) != 1 || !ds[0].Since.Equal(c.Now().Add(-time.Minute)) {
		t.Fatalf("drain restarted: %+v", ds)
	}

	// Drained when a full reconcile runs: deleted then, counted as a drain,
	// not as drift.
	setConns(t, mk, vsA, rsA2, 0, 0)
	mk.ResetCalls()
	r.Reconcile(context.Background())
	if d := cmp.Diff(map[string]int{"ipvs.DeleteDestination": 1}, writes(mk)); d != "" {
		t.Fatalf("writes (-want +got):\n%s", d)
	}
	s := r.Stats()
	if s.DrainsCompleted != 1 || s.DriftRepaired != 1 || s.RepairsByKind[wire.OpDeleteDestination] != 0 ||
		s.DrainOps[wire.OpDeleteDestination] != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Removing the whole Service deletes its virtual server with the draining
// real server, like kube-proxy.
func TestServiceRemovalEndsDrain(t *testing.T) {
	mk, r, _ := drainSetup(t, Config{})
	startDrain(t, mk, r)
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "rm", Removed: []string{"service/default/a"}})
	mustAck(t, ack)
	if got := ops(ack.GetKernelOperations())[wire.OpDeleteService]; got != 1 {
		t.Fatalf("kernel_operations %v, want one virtual server deleted", ack.GetKernelOperations())
	}
	if n := len(r.Draining()); n != 0 || !r.drains.next.IsZero() {
		t.Fatalf("draining %d after the virtual server went", n)
	}
}

// A drain check lists only the destinations of virtual servers with a
// draining real server, and nothing at all when nothing drains.
func TestDrainCheckCost(t *testing.T) {
	mk := memory.New()
	k, cnt := countingKernel(mk)
	c := newClock()
	r, err := New(k, Config{Now: c.Now}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res := []*vsplanev1.Resource{settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource()}
	mustAck(t, r.Apply(ctx, full(res...)))
	cnt.reset()
	r.CheckDrains(ctx)
	if n := cnt.counts(); len(n) != 0 {
		t.Fatalf("check with nothing draining read %v", n)
	}
	startDrain(t, mk, r)
	cnt.reset()
	r.CheckDrains(ctx)
	if d := cmp.Diff(map[string]int{"ipvs.ListDestinations": 1}, cnt.counts()); d != "" {
		t.Fatalf("reads of a drain check (-want +got):\n%s", d)
	}
}

// Kernel errors in a check are recorded (Stats.KernelErrors), the drain
// kept and retried.
func TestDrainCheckErrorRecorded(t *testing.T) {
	mk, r, _ := drainSetup(t, Config{})
	startDrain(t, mk, r)
	setConns(t, mk, vsA, rsA2, 0, 0)
	mk.SetFault(func(op string) error {
		if op == "ipvs.DeleteDestination" {
			return kernel.ErrUnsupported
		}
		return nil
	})
	r.CheckDrains(context.Background())
	if s := r.Stats(); len(s.KernelErrors) != 1 || s.Draining != 1 || s.DrainsCompleted != 0 {
		t.Fatalf("stats after a failed delete %+v", s)
	}
	mk.SetFault(nil)
	r.CheckDrains(context.Background())
	if s := r.Stats(); len(s.KernelErrors) != 0 || s.Draining != 0 || s.DrainsCompleted != 1 {
		t.Fatalf("stats after the retry %+v", s)
	}
}
