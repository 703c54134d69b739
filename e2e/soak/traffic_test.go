package soak

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
)

// loop is one bounded request loop from the client to a stable Service.
type loop struct {
	name, proto, addr string
	// node is the node whose kernel serves the path (its drift may fail
	// requests until repaired).
	node string
	proc *vm.Proc
	// seen is the last request number counted; sent, failed and drift the
	// totals so far; evidence how often the path was logged after a failure.
	seen, sent, failed, drift, evidence int
}

var reqLine = regexp.MustCompile(`(?m)^(\d+) (ok|fail)(.*)$`)

// startLoops starts one loop per stable path: enough requests for the
// whole soak (its context's deadline), stopped early by stopFile.
func (r *run) startLoops(t *testing.T) []*loop {
	dl, _ := r.ctx.Deadline()
	count := min(100000, int(time.Until(dl)/reqInterval)+1)
	np := fmt.Sprintf("%s:%d", r.nodeIP["node2"], r.nodePort)
	loops := []*loop{
		{name: "clusterip-tcp", proto: "tcp", addr: r.vip + ":80", node: "node1"},
		{name: "clusterip-udp", proto: "udp", addr: r.vip + ":80", node: "node1"},
		{name: "nodeport-tcp", proto: "tcp", addr: np, node: "node2"},
	}
	if _, err := r.c.VM.RunOK(r.ctx, "rm -f "+stopFile); err != nil {
		t.Fatal(err)
	}
	for _, l := range loops {
		p, err := r.c.Client.Start(r.ctx, "soak-"+l.name, fmt.Sprintf(
			"e2ehelper request --proto %s --addr %s --count %d --timeout %s --interval %v --stop-file %s",
			l.proto, l.addr, count, reqTimeout, reqInterval, stopFile))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.AwaitLog(r.ctx, "1 ok"); err != nil {
			t.Fatalf("loop %s: %v", l.name, err)
		}
		l.proc = p
	}
	return loops
}

// count takes the request lines of out past l.seen; failures outside a
// drift window of l's node are violations.
func (r *run) count(l *loop, out string) {
	for _, m := range reqLine.FindAllStringSubmatch(out, -1) {
		i, _ := strconv.Atoi(m[1])
		if i <= l.seen {
			continue
		}
		l.seen = i
		l.sent++
		if m[2] != "fail" {
			continue
		}
		l.failed++
		if r.inDrift(l.node) {
			l.drift++
			continue
		}
		r.violate("failed request", "%s to %s (via %s): request %d%s", l.name, l.addr, l.node, i, m[3])
		if l.evidence < 2 {
			l.evidence++
			r.logPath(l)
		}
	}
}

// logPath logs what the path's node holds for it right after a failed
// request: the nat rules that steer it, its IPVS virtual server and
// connections, its conntrack entries.
func (r *run) logPath(l *loop) {
	_, port, _ := strings.Cut(l.addr, ":")
	ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
	defer cancel()
	out, err := r.c.RunInNode(ctx, l.node, fmt.Sprintf(
		"iptables -t nat -S KUBE-SERVICES; iptables -t nat -S KUBE-NODE-PORT 2>&1; iptables -t nat -S KUBE-POSTROUTING; "+
			"ipvsadm -Ln -t %[1]s 2>&1; ipvsadm -Lnc 2>&1 | grep ':%[2]s ' | tail -20; "+
			"conntrack -L -p %[3]s --dport %[2]s 2>/dev/null | tail -20", l.addr, port, l.proto))
	r.t.Logf("%s after a failed request to %s:\n%s%v", l.node, l.addr, out, err)
}

// pollLoops counts the loops' new lines every 2 s until ctx ends.
func (r *run) pollLoops(ctx context.Context, loops []*loop) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, l := range loops {
			out, err := l.proc.LogTail(ctx, 32<<10)
			if err != nil {
				continue // the next poll reads it
			}
			r.count(l, out)
			if strings.Contains(out, "summary ") {
				r.violate("loop ended", "%s ended before the soak did", l.name)
			}
		}
	}
}

// finishLoops stops the loops and counts what is left.
func (r *run) finishLoops(t *testing.T, loops []*loop) []TrafficResult {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := r.c.VM.RunOK(ctx, "touch "+stopFile); err != nil {
		t.Error(err)
	}
	var out []TrafficResult
	for _, l := range loops {
		_, log, err := cluster.LoopResult(ctx, l.proc)
		if err != nil && log == "" {
			t.Errorf("loop %s: %v", l.name, err)
		}
		r.count(l, log)
		out = append(out, TrafficResult{Name: l.name, Target: l.addr, Sent: l.sent, Failed: l.failed, DuringDrift: l.drift})
		t.Logf("%s to %s: %d sent, %d failed (%d during drift of %s)", l.name, l.addr, l.sent, l.failed, l.drift, l.node)
	}
	return out
}

// monitor checks every 3 s that each node not under drift holds the stable
// virtual servers with both real servers: no mass removal, no node
// programmed from partial state.
func (r *run) monitor(ctx context.Context) {
	tick := time.NewTicker(3 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, n := range r.c.Nodes {
			if r.inDrift(n.Name) {
				continue
			}
			out, err := r.c.IPVS(ctx, n.Name)
			if err != nil || r.inDrift(n.Name) {
				continue
			}
			tab, err := cluster.ParseIPVSADM(out)
			if err != nil {
				continue
			}
			if msg := stableMissing(tab, r.vip, n.IP, r.nodePort); msg != "" && !r.inDrift(n.Name) {
				r.violate("stable virtual server missing", "%s: %s\n%s", n.Name, msg, tab)
			}
		}
	}
}

// stableMissing says what of the stable Services' virtual servers tab lacks
// ("" when all are there, each with two serving real servers).
func stableMissing(tab cluster.IPVSTable, vip, nodeIP string, nodePort int32) string {
	var missing []string
	check := func(addr string, port int32, want int) {
		found := tab.Find(addr, port)
		if len(found) != want {
			missing = append(missing, fmt.Sprintf("%d of %d virtual servers on %s:%d", len(found), want, addr, port))
			return
		}
		for k := range found {
			if s := tab.Serving(k); len(s) != 2 {
				missing = append(missing, fmt.Sprintf("%s serves %v", k, s))
			}
		}
	}
	check(vip, 80, 2)
	check(nodeIP, nodePort, 1)
	return strings.Join(missing, "; ")
}
