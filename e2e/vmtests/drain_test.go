package vmtests

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

const (
	drainSvc = "drain"
	// drainCheck is the agents' --drain-check-interval.
	drainCheck = time.Second
	// shortMaxDrain is --max-drain of the agent restarted in the second drain.
	shortMaxDrain = 8 * time.Second
	// ipvsCloseTimeout is the kernel's IPVS timeout of a TCP connection in
	// CLOSE state (after an RST), not settable: the connection entry and its
	// InActConn count live this long after the client aborts.
	ipvsCloseTimeout = 10 * time.Second
	// slack covers polling (each ipvsadm call is a guest round trip) and a
	// busy TCG guest.
	slack = 3 * time.Second
)

var drainPorts = []cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}

// TestVMDrain drives graceful drain with real traffic: a long-lived TCP
// connection through a ClusterIP keeps working after its backend leaves
// the EndpointSlice (weight 0, reported as draining to the control plane,
// no new connections); the real server goes one check interval after its
// last IPVS connection entry; a drain that outlives --max-drain ends at the
// bound; an agent restarted mid-drain keeps draining and leaves the other
// real server's weight alone.
func TestVMDrain(t *testing.T) {
	run := newVMRun(t, 8*time.Minute)
	ctx, phase := run.ctx, run.phase

	// The first drain must not reach the bound: 5m is far beyond it.
	c := run.startCluster(cluster.Options{
		Nodes:           2,
		Pods:            [][]string{{"pod-a"}, {"pod-b"}},
		ReconcilePeriod: reconcilePeriod,
		AgentArgs:       fmt.Sprintf("--drain-check-interval %s --max-drain 5m", drainCheck),
		Log:             zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	t.Logf("VM build %v, boot %v", c.VM.BuildTime.Round(time.Millisecond), c.VM.BootTime.Round(time.Millisecond))
	phase("apiserver+control plane+VM+agents")

	conn, err := c.DialControlPlane(c.CPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	d := &drainEnv{t: t, c: c, insp: vsplanev1.NewInspectServiceClient(conn)}

	all, err := c.Backends("pod-a", "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	d.vip, err = c.CreateService(ctx, ns, drainSvc, drainPorts, all)
	if err != nil {
		t.Fatal(err)
	}
	d.awaitBoth(ctx)
	phase("service programmed")

	ok := t.Run("a: drain until the held connection closes", func(t *testing.T) {
		d.t = t
		hold, held, other := d.holdAndRemove(ctx, "hold-1", all)
		d.awaitDrainReported(ctx, held.IP)
		d.awaitEcho(ctx, hold, "after the endpoint left")
		// node2 has no connection to it: deleted there at once, not drained.
		mustAwait(t, ctx, func(ctx context.Context) error {
			tab := ipvsTable(t, ctx, c, "node2")
			want := []string{d.c.Pods[other].IP + ":8080 w=1"}
			for _, rs := range tab.Find(d.vip, 80) {
				if slices.Equal(rs, want) {
					return nil
				}
			}
			return fmt.Errorf("node2: want only %v on %s:80, have:\n%s", want, d.vip, tab)
		})

		sum := requests(t, ctx, c, "tcp", d.vip+":80", 10)
		if sum.Backends[other] != 10 {
			t.Fatalf("new connections must go to %s only, got %v", other, sum.Backends)
		}

		// ss -K aborts the client's socket with an RST: IPVS moves the
		// connection to CLOSE (10s) rather than TIME_WAIT (2 min).
		closed := time.Now()
		if _, err := c.Client.RunOK(ctx, fmt.Sprintf("ss -K -t dst %s dport = :80", d.vip)); err != nil {
			t.Fatalf("abort the held connection: %v", err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
		st, err := hold.Wait(wctx)
		wcancel()
		if err != nil || st.Running {
			t.Fatalf("hold did not end after ss -K (err %v, running %v):\n%s", err, st.Running, tail(st.Log, 10))
		}
		lastConn, deleted := d.awaitDeleted(ctx, held.IP, ipvsCloseTimeout+drainCheck+slack+5*time.Second)
		t.Logf("connection aborted; last IPVS connection entry seen %v later, real server deleted %v after the abort",
			lastConn.Sub(closed).Round(time.Millisecond), deleted.Sub(closed).Round(time.Millisecond))
		if gap := deleted.Sub(lastConn); gap > drainCheck+slack {
			t.Errorf("real server deleted %v after its last connection entry went, want within the check interval %v (+%v polling slack)",
				gap.Round(time.Millisecond), drainCheck, slack)
		}
		d.awaitDrainReported(ctx, "") // the report empties too
	})
	phase("a: drain, close, delete")
	if !ok {
		t.FailNow()
	}

	t.Run("b: agent restarted mid-drain keeps draining, other weights untouched, deleted at --max-drain", func(t *testing.T) {
		d.t = t
		if err := c.SetEndpoints(ctx, ns, drainSvc, drainPorts, all); err != nil {
			t.Fatal(err)
		}
		d.awaitBoth(ctx)
		hold, held, _ := d.holdAndRemove(ctx, "hold-2", all)
		defer func() { _, _ = hold.Kill(context.Background()) }()
		d.awaitDrainReported(ctx, held.IP)
		before := d.table(ctx)

		c.SetAgentArgs(fmt.Sprintf("--drain-check-interval %s --max-drain %s", drainCheck, shortMaxDrain))
		if _, err := c.StopAgent(ctx, "node1", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		restarted := time.Now()
		if err := c.StartAgent(ctx, "node1"); err != nil {
			t.Fatal(err)
		}
		// The new process starts its drain clock once connected; on a busy
		// TCG guest getting there takes seconds, which the bound allows for.
		startup := time.Since(restarted)
		if err := c.AwaitAcked(ctx, converge); err != nil {
			t.Fatal(err)
		}
		if after := d.table(ctx); !slices.Equal(before, after) {
			t.Errorf("real servers changed across the restart:\nbefore %v\nafter  %v", before, after)
		}
		d.awaitEcho(ctx, hold, "after the agent restart")
		d.awaitDrainReported(ctx, held.IP)
		l, err := c.AgentLog(ctx, "node1")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(l, "draining real server") {
			t.Errorf("restarted agent did not pick up the drain:\n%s", tail(l, 20))
		}

		lastConn, deleted := d.awaitDeleted(ctx, held.IP, shortMaxDrain+drainCheck+slack+10*time.Second)
		took := deleted.Sub(restarted)
		t.Logf("real server deleted %v after the restart (agent start-up %v, --max-drain %v); connection entry still seen %v before",
			took.Round(time.Millisecond), startup.Round(time.Millisecond), shortMaxDrain, deleted.Sub(lastConn).Round(time.Millisecond))
		// The restarted agent's drain starts no earlier than the restart.
		if took < shortMaxDrain {
			t.Errorf("deleted %v after the restart, before the bound %v", took, shortMaxDrain)
		}
		if took > startup+shortMaxDrain+drainCheck+slack {
			t.Errorf("deleted %v after the restart, want by the bound %v (+%v start-up, +%v check, +%v slack)",
				took, shortMaxDrain, startup, drainCheck, slack)
		}
		if l, err := c.AgentLog(ctx, "node1"); err != nil {
			t.Fatal(err)
		} else if !strings.Contains(l, "after the maximum drain time") {
			t.Errorf("agent did not log a drain ended by the bound:\n%s", tail(l, 20))
		}
		// The held connection had its IPVS entry until the bound: it was
		// the bound, not a drained connection, that ended the drain.
		if deleted.Sub(lastConn) > drainCheck+slack {
			t.Errorf("held connection's IPVS entry was gone %v before the delete; the drain did not run into the bound", deleted.Sub(lastConn))
		}
	})
	phase("b: restart mid-drain, max drain")
}

type drainEnv struct {
	t    *testing.T
	c    *cluster.Cluster
	insp vsplanev1.InspectServiceClient
	vip  string
}

// awaitBoth waits until node1 serves both pods at weight 1.
func (d *drainEnv) awaitBoth(ctx context.Context) {
	d.t.Helper()
	want := []string{d.c.Pods["pod-a"].IP + ":8080", d.c.Pods["pod-b"].IP + ":8080"}
	if err := d.c.AwaitServing(ctx, "node1", d.vip, 80, 1, want, converge); err != nil {
		d.t.Fatal(err)
	}
}

var connectedRE = regexp.MustCompile(`connected (\S+) from`)

// holdAndRemove opens a long-lived connection through the VIP from the
// client, removes its backend from the EndpointSlice and waits until node1
// holds that real server at weight 0 (the other one at weight 1). It
// returns the hold process, the held backend and the other pod's name.
func (d *drainEnv) holdAndRemove(ctx context.Context, name string, all []cluster.Backend) (*vm.Proc, cluster.Backend, string) {
	t := d.t
	t.Helper()
	hold, err := d.c.Client.Start(ctx, name, fmt.Sprintf("e2ehelper hold --addr %s:80 --interval 300ms --duration 10m --timeout 2s", d.vip))
	if err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := context.WithTimeout(ctx, 20*time.Second)
	l, err := hold.AwaitLog(hctx, " ok ")
	hcancel()
	if err != nil {
		t.Fatalf("hold: %v", err)
	}
	m := connectedRE.FindStringSubmatch(l)
	if m == nil {
		t.Fatalf("hold did not report its backend:\n%s", tail(l, 5))
	}
	var held cluster.Backend
	var keep []cluster.Backend
	other := ""
	for _, b := range all {
		pod := podName(d.c, b.IP)
		if pod == m[1] {
			held = b
		} else {
			keep, other = append(keep, b), pod
		}
	}
	if held.IP == "" {
		t.Fatalf("hold connected to unknown backend %q", m[1])
	}
	t.Logf("%s holds a connection to %s (%s); removing it from the EndpointSlice", name, m[1], held.IP)
	if err := d.c.SetEndpoints(ctx, ns, drainSvc, drainPorts, keep); err != nil {
		t.Fatal(err)
	}
	heldRS, otherRS := held.IP+":8080 w=0", keep[0].IP+":8080 w=1"
	mustAwait(t, ctx, func(ctx context.Context) error {
		got := d.tableCtx(ctx)
		if !slices.Equal(got, sortedPair(heldRS, otherRS)) {
			return fmt.Errorf("node1 real servers of %s:80 are %v, want %s and %s", d.vip, got, heldRS, otherRS)
		}
		return nil
	})
	return hold, held, other
}

func sortedPair(a, b string) []string {
	out := []string{a, b}
	slices.Sort(out)
	return out
}

func podName(c *cluster.Cluster, ip string) string {
	for name, p := range c.Pods {
		if p.IP == ip {
			return name
		}
	}
	return ""
}

// table returns node1's real servers of the VIP's TCP virtual server.
func (d *drainEnv) table(ctx context.Context) []string {
	d.t.Helper()
	return d.tableCtx(ctx)
}

func (d *drainEnv) tableCtx(ctx context.Context) []string {
	tab := ipvsTable(d.t, ctx, d.c, "node1")
	for _, rs := range tab.Find(d.vip, 80) {
		return rs
	}
	return nil
}

var okLine = regexp.MustCompile(`(?m)^\d+ ok `)

// awaitEcho waits until the held connection echoes another line after now.
func (d *drainEnv) awaitEcho(ctx context.Context, hold *vm.Proc, when string) {
	t := d.t
	t.Helper()
	l, err := hold.Log(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := len(okLine.FindAllString(l, -1))
	mustAwait(t, ctx, func(ctx context.Context) error {
		l, err := hold.Log(ctx)
		if err != nil {
			return err
		}
		if strings.Contains(l, " fail: ") {
			return fmt.Errorf("held connection broke %s:\n%s", when, tail(l, 5))
		}
		if len(okLine.FindAllString(l, -1)) <= n {
			return fmt.Errorf("no echo on the held connection %s yet", when)
		}
		return nil
	})
	if l, _ := hold.Log(ctx); strings.Contains(l, " fail: ") {
		t.Fatalf("held connection broke %s:\n%s", when, tail(l, 5))
	}
}

// awaitDrainReported waits until the control plane's GetNodeStatus for
// node1 lists exactly ip:8080 of the VIP as draining (ip "" = nothing).
func (d *drainEnv) awaitDrainReported(ctx context.Context, ip string) {
	t := d.t
	t.Helper()
	// The agent reports a changed status within a second; 30s is its refresh.
	err := cluster.Await(ctx, 40*time.Second, poll, func(ctx context.Context) error {
		resp, err := d.insp.GetNodeStatus(ctx, &vsplanev1.GetNodeStatusRequest{NodeName: "node1"})
		if err != nil {
			return err
		}
		dr := resp.GetStatus().GetDraining()
		if ip == "" {
			if len(dr) != 0 {
				return fmt.Errorf("draining list not empty: %v", dr)
			}
			return nil
		}
		if len(dr) != 1 || dr[0].GetAddress() != ip || dr[0].GetPort() != 8080 || !strings.Contains(dr[0].GetVirtualServer(), d.vip+":80") {
			return fmt.Errorf("want %s:8080 of %s:80 draining, status has %v", ip, d.vip, dr)
		}
		if dr[0].GetActiveConnections()+dr[0].GetInactiveConnections() == 0 || dr[0].GetSince() == nil {
			return fmt.Errorf("draining %s:8080 reported without connections or start: %v", ip, dr[0])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// awaitDeleted polls node1 until ip:8080 is no longer a real server of the
// VIP (bounded by timeout). It returns when an IPVS connection entry to it
// was last seen and when it was first seen deleted (each the end of the
// poll that saw it).
func (d *drainEnv) awaitDeleted(ctx context.Context, ip string, timeout time.Duration) (lastConn, deleted time.Time) {
	t := d.t
	t.Helper()
	rs := ip + ":8080"
	vs := d.vip + ":80"
	err := cluster.Await(ctx, timeout, 200*time.Millisecond, func(ctx context.Context) error {
		out, err := d.c.RunInNode(ctx, "node1", "ipvsadm -Lnc; echo ---; ipvsadm -Ln")
		now := time.Now()
		if err != nil {
			return err
		}
		conns, list, _ := strings.Cut(out, "---")
		for _, line := range strings.Split(conns, "\n") {
			f := strings.Fields(line)
			// pro expire state source virtual destination
			if len(f) >= 6 && f[4] == vs && f[5] == rs {
				lastConn = now
			}
		}
		tab, err := cluster.ParseIPVSADM(list)
		if err != nil {
			return err
		}
		for _, rss := range tab.Find(d.vip, 80) {
			for _, r := range rss {
				if strings.HasPrefix(r, rs+" ") {
					return fmt.Errorf("%s still a real server of %s: %v", rs, vs, rss)
				}
			}
		}
		deleted = now
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if lastConn.IsZero() {
		t.Fatalf("never saw an IPVS connection entry to %s: the drain was not observed", rs)
	}
	return lastConn, deleted
}
