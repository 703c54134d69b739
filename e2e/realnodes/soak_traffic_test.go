//go:build realsoak

package realnodes

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/nodes"
	"github.com/vsplane/vsplane/e2e/soak"
	"github.com/vsplane/vsplane/e2e/vm"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// soakLoop is one outside request loop, from a client namespace of its own
// (see e2e/soak's startLoops for why not one shared address).
type soakLoop struct {
	name, proto, addr, node string
	proc                    *vm.Proc
	// want, if set, is the only backend that may answer (Local).
	want string
	// affinity: every answer from the first one's backend.
	affinity bool
	pinned   string

	seen, sent, failed, drift, wrong int
}

var (
	soakReqLine = regexp.MustCompile(`(?m)^(\d+) (ok|fail)(.*)$`)
	// localPortRE takes the local port and the time of a failed TCP
	// request from e2ehelper's failure line.
	localPortRE = regexp.MustCompile(`local port (\d+).*\[at (\S+),`)
)

func (r *realSoak) startLoops(t *testing.T) []*soakLoop {
	n1, n2 := rc.Nodes[0], rc.Nodes[len(rc.Nodes)-1]
	loops := []*soakLoop{
		{name: "clusterip-tcp", proto: "tcp", addr: fmt.Sprintf("%s:%d", r.vip, servePort), node: n1.Name},
		{name: "clusterip-udp", proto: "udp", addr: fmt.Sprintf("%s:%d", r.vip, servePort), node: n1.Name},
		{name: "nodeport-tcp", proto: "tcp", addr: fmt.Sprintf("%s:%d", n2.IP(), r.nodePort), node: n2.Name},
		{name: "affinity-tcp", proto: "tcp", addr: fmt.Sprintf("%s:%d", r.affinityVIP, servePort), node: n1.Name, affinity: true},
		{name: "local-nodeport-tcp", proto: "tcp", addr: fmt.Sprintf("%s:%d", n2.IP(), r.local), node: n2.Name, want: r.podOn[n2.Name]},
	}
	if _, err := rc.VM.RunOK(r.ctx, "rm -f "+soakStopFile); err != nil {
		t.Fatal(err)
	}
	dl, _ := r.ctx.Deadline()
	count := min(200000, int(time.Until(dl)/soakReqInterval)+1)
	for _, l := range loops {
		c, err := rc.Topo.AddClient(r.ctx, "soak-"+l.name, n1.Netns)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Start(r.ctx, "soak-"+l.name, fmt.Sprintf(
			"e2ehelper request --proto %s --addr %s --count %d --timeout 2s --interval %v --stop-file %s",
			l.proto, l.addr, count, soakReqInterval, soakStopFile))
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

// count takes l's request lines past l.seen; a failure outside a drift
// window of l's node, or an answer its check refuses, is a violation.
func (r *realSoak) count(l *soakLoop, out string) {
	now := time.Now()
	for _, m := range soakReqLine.FindAllStringSubmatch(out, -1) {
		i, _ := strconv.Atoi(m[1])
		if i <= l.seen {
			continue
		}
		l.seen = i
		l.sent++
		drift := r.inDriftAt(l.node, now)
		if m[2] == "fail" {
			l.failed++
			if drift {
				l.drift++
			} else {
				r.violate("failed request", "%s to %s (via %s): request %d%s", l.name, l.addr, l.node, i, m[3])
				if pm := localPortRE.FindStringSubmatch(m[3]); pm != nil {
					r.mu.Lock()
					r.failedPorts = append(r.failedPorts, [3]string{l.name, pm[1], pm[2]})
					r.mu.Unlock()
				}
			}
			continue
		}
		backend, _, _ := strings.Cut(strings.TrimSpace(m[3]), " ")
		switch {
		case drift:
			l.pinned = backend // ipvsadm -C drops persistence templates
		case l.want != "" && backend != l.want:
			l.wrong++
			r.violate("wrong answer", "%s: request %d answered by %s, want %s (externalTrafficPolicy Local)", l.name, i, backend, l.want)
		case l.affinity && l.pinned != "" && backend != l.pinned:
			// One violation per move: the client is pinned anew.
			l.wrong++
			r.violate("wrong answer", "%s: request %d answered by %s, the client's affinity was to %s", l.name, i, backend, l.pinned)
			l.pinned = backend
		case l.affinity:
			l.pinned = backend
		}
	}
}

func (r *realSoak) pollLoops(ctx context.Context, loops []*soakLoop) {
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

func (r *realSoak) finishLoops(t *testing.T, loops []*soakLoop) []soak.TrafficResult {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := rc.VM.RunOK(ctx, "touch "+soakStopFile); err != nil {
		t.Error(err)
	}
	var out []soak.TrafficResult
	for _, l := range loops {
		_, log, err := cluster.LoopResult(ctx, l.proc)
		if err != nil && log == "" {
			t.Errorf("loop %s: %v", l.name, err)
		}
		r.count(l, log)
		out = append(out, soak.TrafficResult{Name: l.name, Target: l.addr, Sent: l.sent, Failed: l.failed, DuringDrift: l.drift, Wrong: l.wrong})
		t.Logf("%s to %s: %d sent, %d failed (%d during drift of %s), %d wrong answers", l.name, l.addr, l.sent, l.failed, l.drift, l.node, l.wrong)
		if l.sent == 0 {
			t.Errorf("%s sent nothing", l.name)
		}
	}
	return out
}

// serverSide logs, for each failed TCP request outside drift, what the
// servers saw of it: agnhost serve-hostname logs "TCP request from
// ADDR:PORT" when it has accepted a connection, before it answers, and the
// kubelet's log timestamps say when. A request a server logged on time
// lost its answer on the way back; one logged late found the server slow;
// one logged by neither never reached a server's accept (the source port
// may have been rewritten by SNAT: then it is not found either).
func (r *realSoak) serverSide(t *testing.T) {
	r.mu.Lock()
	failed := slices.Clone(r.failedPorts)
	r.mu.Unlock()
	if len(failed) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := map[string]string{}
	for _, p := range mustPods(t, ctx, r.ns, "stable") {
		out, err := rc.Kubectl(ctx, nil, "-n", r.ns, "logs", "--timestamps", p.Name)
		if err != nil {
			t.Logf("server log of %s: %v", p.Name, err)
			continue
		}
		logs[p.Name] = out
	}
	day := time.Now().UTC().Format(time.DateOnly)
	for _, f := range failed[:min(len(failed), 30)] {
		var seen []string
		start, terr := time.Parse(time.DateOnly+" 15:04:05.999", day+" "+f[2])
		for pod, out := range logs {
			served := 0 // requests the pod logged while this one waited
			for _, l := range strings.Split(out, "\n") {
				stamp, _, _ := strings.Cut(l, " ")
				if strings.HasSuffix(strings.TrimSpace(l), ":"+f[1]) {
					seen = append(seen, pod+" at "+stamp)
				}
				if when, err := time.Parse(time.RFC3339Nano, stamp); terr == nil && err == nil &&
					!when.Before(start) && when.Before(start.Add(2*time.Second)) {
					served++
				}
			}
			seen = append(seen, fmt.Sprintf("%s logged %d requests in those 2 s", pod, served))
		}
		t.Logf("failed %s request from local port %s (the client's start %s): %s", f[0], f[1], f[2], strings.Join(seen, "; "))
	}
	r.planesAround(ctx, t, failed[0][2])
}

// planesAround logs what the agents and replicas logged from 10 s before
// to 5 s after the guest's time of day at (the first failed request's
// start): what they changed in the kernel then, if anything.
func (r *realSoak) planesAround(ctx context.Context, t *testing.T, at string) {
	day := time.Now().UTC().Format(time.DateOnly)
	ts, err := time.Parse(time.DateOnly+" 15:04:05.999", day+" "+at)
	if err != nil {
		t.Logf("time of the failure %q: %v", at, err)
		return
	}
	from, to := ts.Add(-10*time.Second), ts.Add(5*time.Second)
	for _, app := range []string{"vsplane-agent", "vsplane-controlplane"} {
		for _, n := range rc.Nodes {
			pod, err := podOnNode(ctx, app, n.Name)
			if err != nil {
				t.Logf("%s on %s: %v", app, n.Name, err)
				continue
			}
			out, err := rc.Kubectl(ctx, nil, "-n", cluster.SystemNamespace, "logs", "--timestamps", "--since-time="+from.Format(time.RFC3339), pod.Name)
			if err != nil {
				t.Logf("%s log: %v", pod.Name, err)
				continue
			}
			var keep []string
			for _, l := range strings.Split(out, "\n") {
				stamp, _, _ := strings.Cut(l, " ")
				when, err := time.Parse(time.RFC3339Nano, stamp)
				if err != nil || when.After(to) || strings.Contains(l, `"inspect.grpc"`) || strings.Contains(l, "/vsplane.v1.InspectService/") {
					continue
				}
				keep = append(keep, l)
			}
			t.Logf("%s (%s) from %s to %s, %d lines:\n%s", pod.Name, n.Name, from.Format(time.TimeOnly), to.Format(time.TimeOnly),
				len(keep), strings.Join(keep[:min(len(keep), 40)], "\n"))
		}
	}
}

// podSoakLoop is the in-cluster client: a Pod on node1 whose own command
// connects to the stable Service by name (CoreDNS through its ClusterIP,
// then the Service) every 200 ms and prints each failure's time (the
// guest's clock) until /tmp/stop exists. Its own command, not kubectl exec:
// an exec stream dies with the apiserver (apiserver-stop); the container's
// log is the kubelet's and is read once at the end.
type podSoakLoop struct {
	// offset is the guest's clock minus the host's.
	offset time.Duration
}

const podLoopName = "client-loop"

func (r *realSoak) startPodLoop(t *testing.T) *podSoakLoop {
	script := fmt.Sprintf(`ok=0; fail=0
while [ ! -e /tmp/stop ]; do
  a=$(nc -w 2 stable %d)
  if [ -n "$a" ]; then ok=$((ok+1)); else fail=$((fail+1)); echo "fail at $(date +%%s)"; fi
  sleep 0.2
done
echo "ok=$ok fail=$fail"`, servePort)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podLoopName, Namespace: r.ns},
		Spec: corev1.PodSpec{
			NodeName: rc.Nodes[0].Name, RestartPolicy: corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers:                    []corev1.Container{{Name: "loop", Image: agnhostImage, Command: []string{"sh", "-c", script}}},
		},
	}
	withCPURequest(&pod.Spec)
	if _, err := rc.Kube.CoreV1().Pods(r.ns).Create(r.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubectl(t, r.ctx, "-n", r.ns, "wait", "--for=condition=Ready", "pod/"+podLoopName, "--timeout=3m")
	before := time.Now()
	g, err := rc.VM.RunOK(r.ctx, "date +%s") // busybox: whole seconds
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	gs, err := strconv.ParseInt(strings.TrimSpace(g), 10, 64)
	if err != nil {
		t.Fatalf("the guest's date: %q", g)
	}
	// Within a second (the guest prints whole seconds): the failures are
	// judged with a window that much wider.
	mid := before.Add(after.Sub(before) / 2)
	return &podSoakLoop{offset: time.Unix(gs, 5e8).Sub(mid)}
}

func (r *realSoak) finishPodLoop(t *testing.T, p *podSoakLoop) soak.TrafficResult {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := soak.TrafficResult{Name: "pod-by-name-tcp", Target: fmt.Sprintf("stable:%d from a Pod on %s", servePort, rc.Nodes[0].Name)}
	if out, err := execIn(ctx, r.ns, podLoopName, "touch /tmp/stop"); err != nil {
		t.Errorf("stopping the Pod's loop: %v\n%s", err, out)
		return res
	}
	if _, err := rc.Kubectl(ctx, nil, "-n", r.ns, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/"+podLoopName, "--timeout=90s"); err != nil {
		t.Errorf("the Pod's loop did not end: %v", err)
		return res
	}
	out, err := rc.Kubectl(ctx, nil, "-n", r.ns, "logs", podLoopName)
	if err != nil {
		t.Errorf("the Pod's loop's log: %v", err)
		return res
	}
	ok, counted := 0, false
	for _, l := range strings.Split(out, "\n") {
		var sec int64
		if _, err := fmt.Sscanf(l, "fail at %d", &sec); err == nil {
			// The failure happened within the second after sec, its
			// attempt began up to 2 s (nc's timeout) before; the clock
			// offset is known to a second.
			at := time.Unix(sec, 0).Add(-p.offset)
			if r.driftOverlaps(rc.Nodes[0].Name, at.Add(-3*time.Second), at.Add(2*time.Second)) {
				res.DuringDrift++
			} else {
				r.violate("failed request", "pod-by-name-tcp: a connection to stable failed at %v (guest clock, host offset %v)",
					time.Unix(sec, 0).UTC().Format(time.TimeOnly), p.offset.Round(time.Millisecond))
			}
			continue
		}
		if _, err := fmt.Sscanf(l, "ok=%d fail=%d", &ok, &res.Failed); err == nil {
			counted = true
		}
	}
	res.Sent = ok + res.Failed
	t.Logf("%s: %d sent, %d failed (%d during drift of %s)", res.Name, res.Sent, res.Failed, res.DuringDrift, rc.Nodes[0].Name)
	if !counted || res.Sent == 0 {
		t.Errorf("the Pod's loop counted nothing:\n%s", out)
	}
	return res
}

// monitor checks every 5 s that each node not under drift holds the
// stable virtual servers with every Pod serving: no mass removal, no node
// programmed from a partial state.
func (r *realSoak) monitor(ctx context.Context) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, n := range rc.Nodes {
			at := time.Now()
			if r.inDriftAt(n.Name, at) {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, soakCallTimeout)
			res, err := rc.VM.RunIn(cctx, n.Name, "ipvsadm -Ln")
			cancel()
			if err != nil || res.Err() != nil || r.inDriftAt(n.Name, time.Now()) {
				continue
			}
			tab, err := cluster.ParseIPVSADM(res.Stdout)
			if err != nil {
				continue
			}
			if msg := r.stableMissing(tab, n); msg != "" && !r.inDriftAt(n.Name, time.Now()) {
				r.violate("stable virtual server missing", "%s: %s\n%s\nthe API's EndpointSlices now: %s\nthe replicas' desired state for %s: %s",
					n.Name, msg, tab, r.slicesNow(ctx), n.Name, r.desiredNow(ctx, n.Name))
			}
		}
	}
}

// slicesNow says what the API's EndpointSlices of the stable Services hold
// (each endpoint's address and conditions): whether a real server missing
// from a node was not ready in Kubernetes too, or the data plane's alone.
func (r *realSoak) slicesNow(ctx context.Context) string {
	var b strings.Builder
	for _, svc := range []string{"stable", "stable-affinity", "stable-local"} {
		list, err := rc.Kube.DiscoveryV1().EndpointSlices(r.ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			fmt.Fprintf(&b, "%s: %v; ", svc, err)
			continue
		}
		for _, sl := range list.Items {
			fmt.Fprintf(&b, "%s (rv %s):", sl.Name, sl.ResourceVersion)
			for _, e := range sl.Endpoints {
				fmt.Fprintf(&b, " %v ready=%v serving=%v terminating=%v", e.Addresses, ptr.Deref(e.Conditions.Ready, false),
					ptr.Deref(e.Conditions.Serving, false), ptr.Deref(e.Conditions.Terminating, false))
			}
			b.WriteString("; ")
		}
	}
	return b.String()
}

// desiredNow says what each replica's desired state for node holds of the
// stable Services (ExplainService: every virtual server's real servers
// with their weights, and the agent's acknowledgement): with slicesNow,
// where a missing real server was lost, the API or vsplane.
func (r *realSoak) desiredNow(ctx context.Context, node string) string {
	var b strings.Builder
	for _, replica := range rc.Nodes {
		fmt.Fprintf(&b, "\n  replica on %s:", replica.Name)
		cli, err := rc.Inspect(ctx, replica.IP())
		if err != nil {
			fmt.Fprintf(&b, " %v", err)
			continue
		}
		for _, svc := range []string{"stable", "stable-affinity", "stable-local"} {
			cctx, cancel := context.WithTimeout(ctx, soakCallTimeout)
			resp, err := cli.ExplainService(cctx, &vsplanev1.ExplainServiceRequest{NodeName: node, Namespace: r.ns, Name: svc})
			cancel()
			if err != nil {
				fmt.Fprintf(&b, " %s: %v;", svc, err)
				continue
			}
			fmt.Fprintf(&b, " %s (%s):", svc, resp.GetAcknowledgement())
			for _, vs := range resp.GetService().GetVirtualServers() {
				fmt.Fprintf(&b, " %s:%d", vs.GetAddress(), vs.GetPort())
				for _, rs := range vs.GetRealServers() {
					fmt.Fprintf(&b, " %s w%d", rs.GetAddress(), rs.GetWeight())
				}
				b.WriteString(",")
			}
		}
	}
	return b.String()
}

func (r *realSoak) stableMissing(tab cluster.IPVSTable, n *nodes.Node) string {
	var missing []string
	check := func(addr string, port int32, serving int) {
		found := tab.Find(addr, port)
		if len(found) == 0 {
			missing = append(missing, fmt.Sprintf("no virtual server on %s:%d", addr, port))
		}
		for k := range found {
			if s := tab.Serving(k); len(s) != serving {
				missing = append(missing, fmt.Sprintf("%s serves %v", k, s))
			}
		}
	}
	all := len(rc.Nodes)
	check(r.vip, servePort, all)
	check(n.IP(), r.nodePort, all)
	check(r.affinityVIP, servePort, all)
	check(n.IP(), r.local, 1) // every node runs one stable Pod
	return strings.Join(missing, "; ")
}
