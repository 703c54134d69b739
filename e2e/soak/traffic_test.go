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

// loop is one bounded request loop from a client of its own to a stable
// Service.
type loop struct {
	name, proto, addr string
	// client is the loop's own namespace (see startLoops).
	client *vm.Netns
	// node is the node whose kernel serves the path (its drift may fail
	// requests until repaired).
	node string
	proc *vm.Proc
	// seen is the last request number counted; sent, failed and drift the
	// totals so far; evidence how often the path was logged after a failure.
	seen, sent, failed, drift, evidence int
	// check, if set, judges an answer ("pod-a from 198.19.0.1:4242"): what is
	// wrong with it ("" when right). pinned is the backend ClientIP
	// affinity holds the client to (checkAffinity).
	check  func(l *loop, answer string) string
	pinned string
	wrong  int
}

var reqLine = regexp.MustCompile(`(?m)^(\d+) (ok|fail)(.*)$`)

// startLoops starts one loop per stable path, each from a client address
// of its own (routed through node1 like the cluster's client): enough
// requests for the whole soak (its context's deadline), stopped early by
// stopFile.
//
// Own addresses, because the stable Services share their Pods: two TCP
// loops on one address sometimes hold connections from the same local port
// to two Services at once (Linux reuses a local port towards another
// destination), IPVS sends both to the same Pod, and its reply lookup
// (client address and port, Pod address and port; not the Service) then
// translates the older connection's replies as if from the newer one's
// Service: that request times out. That is IPVS's (and kube-proxy's IPVS
// mode's) behaviour, not a fault the soak looks for; TestVMFlowsAcrossChanges
// shows it (checkPortReuseAcrossServices).
func (r *run) startLoops(t *testing.T) []*loop {
	dl, _ := r.ctx.Deadline()
	count := min(100000, int(time.Until(dl)/reqInterval)+1)
	np := fmt.Sprintf("%s:%d", r.nodeIP["node2"], r.nodePort)
	loops := []*loop{
		{name: "clusterip-tcp", proto: "tcp", addr: r.vip + ":80", node: "node1"},
		{name: "clusterip-udp", proto: "udp", addr: r.vip + ":80", node: "node1"},
		{name: "nodeport-tcp", proto: "tcp", addr: np, node: "node2"},
		{name: "affinity-tcp", proto: "tcp", addr: r.affinityVIP + ":80", node: "node1", check: checkAffinity},
		{name: "local-nodeport-tcp", proto: "tcp", addr: fmt.Sprintf("%s:%d", r.nodeIP["node2"], r.localNodePort), node: "node2"},
	}
	if _, err := r.c.VM.RunOK(r.ctx, "rm -f "+stopFile); err != nil {
		t.Fatal(err)
	}
	for _, l := range loops {
		c, err := r.c.Topo.AddClient(r.ctx, "client-"+l.name, r.c.Nodes[0])
		if err != nil {
			t.Fatal(err)
		}
		l.client = c
		if l.name == "local-nodeport-tcp" {
			l.check = checkLocal("pod-b", c.IP)
		}
		p, err := c.Start(r.ctx, "soak-"+l.name, fmt.Sprintf(
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
			r.judge(l, i, strings.TrimSpace(m[3]))
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

// judge applies l's check to request i's answer. Under drift of l's node
// an answer is not judged, and affinity may move (ipvsadm -C drops the
// persistence templates): the first answer then pins it again.
func (r *run) judge(l *loop, i int, answer string) {
	if l.check == nil {
		return
	}
	if r.inDrift(l.node) {
		l.pinned = backendOf(answer)
		return
	}
	if msg := l.check(l, answer); msg != "" {
		l.wrong++
		r.violate("wrong answer", "%s to %s (via %s): request %d: %s", l.name, l.addr, l.node, i, msg)
	}
}

func backendOf(answer string) string {
	b, _, _ := strings.Cut(answer, " ")
	return b
}

// checkAffinity: every answer from the backend of the first one (ClientIP
// session affinity, timeout 3 hours).
func checkAffinity(l *loop, answer string) string {
	b := backendOf(answer)
	if l.pinned == "" {
		l.pinned = b
	}
	if b != l.pinned {
		return fmt.Sprintf("answered by %s, the client's affinity is to %s", b, l.pinned)
	}
	return ""
}

// checkLocal: externalTrafficPolicy Local through a node's NodePort is
// answered by that node's pod, which sees the client's own address.
func checkLocal(pod, client string) func(*loop, string) string {
	want := pod + " from " + client + ":"
	return func(_ *loop, answer string) string {
		if !strings.HasPrefix(answer, want) {
			return fmt.Sprintf("answer %q, want %q...", answer, want)
		}
		return ""
	}
}

// logPath logs what the path's node holds for it right after a failed
// request: the nat rules that steer it, its IPVS virtual server, and on
// every node the client's flows of the path's protocol that did not end
// normally: IPVS entries and conntrack entries neither established nor in
// TIME_WAIT. A failed attempt's entries live 10-120 s, so they are still
// there when the failure is seen: SYN_SENT/SYN_RECV or UNREPLIED means a
// packet was lost (the reply tuple says whether the node masqueraded the
// flow and which real server IPVS picked); CLOSE means the answer came
// after the client gave up (its kernel reset the late SYN-ACK): slow, not
// lost.
func (r *run) logPath(l *loop) {
	_, port, _ := strings.Cut(l.addr, ":")
	ctx, cancel := context.WithTimeout(r.ctx, 20*time.Second)
	defer cancel()
	out, err := r.c.RunInNode(ctx, l.node, fmt.Sprintf(
		"iptables -t nat -S KUBE-SERVICES; iptables -t nat -S KUBE-NODE-PORT 2>&1; iptables -t nat -S KUBE-POSTROUTING; "+
			"ipvsadm -Ln -t %[1]s 2>&1", l.addr))
	r.t.Logf("%s after a failed request to %s:\n%s%v", l.node, l.addr, out, err)
	for _, n := range r.c.Nodes {
		out, err := r.c.RunInNode(ctx, n.Name, fmt.Sprintf(
			"echo '# ipvsadm -Lnc (not ended normally)'; ipvsadm -Lnc 2>&1 | grep -i '^%[3]s ' | grep ':%[2]s ' | grep -v -e TIME_WAIT -e FIN_WAIT -e ESTABLISHED | head -30; "+
				"echo '# conntrack from %[1]s (not ended normally)'; conntrack -L -p %[3]s -s %[1]s 2>/dev/null | grep -v -e TIME_WAIT -e ESTABLISHED | head -30",
			l.client.IP, port, l.proto))
		r.t.Logf("%s, the client's flows not ended normally after a failed request to %s:\n%s%v", n.Name, l.addr, out, err)
	}
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
		out = append(out, TrafficResult{Name: l.name, Target: l.addr, Sent: l.sent, Failed: l.failed, DuringDrift: l.drift, Wrong: l.wrong})
		t.Logf("%s to %s: %d sent, %d failed (%d during drift of %s), %d wrong answers", l.name, l.addr, l.sent, l.failed, l.drift, l.node, l.wrong)
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
			if msg := r.stableMissing(tab, n.Name); msg != "" && !r.inDrift(n.Name) {
				r.violate("stable virtual server missing", "%s: %s\n%s", n.Name, msg, tab)
			}
		}
	}
}

// stableMissing says what of the stable Services' virtual servers node's
// IPVS table tab lacks ("" when all are there, each with both pods serving;
// the Local NodePort on node2 with node2's pod alone).
func (r *run) stableMissing(tab cluster.IPVSTable, node string) string {
	var missing []string
	check := func(addr string, port int32, want, serving int) {
		found := tab.Find(addr, port)
		if len(found) != want {
			missing = append(missing, fmt.Sprintf("%d of %d virtual servers on %s:%d", len(found), want, addr, port))
			return
		}
		for k := range found {
			if s := tab.Serving(k); len(s) != serving {
				missing = append(missing, fmt.Sprintf("%s serves %v", k, s))
			}
		}
	}
	check(r.vip, 80, 2, 2)
	check(r.nodeIP[node], r.nodePort, 1, 2)
	check(r.affinityVIP, 80, 1, 2)
	if node == "node2" {
		check(r.nodeIP[node], r.localNodePort, 1, 1)
	}
	return strings.Join(missing, "; ")
}
