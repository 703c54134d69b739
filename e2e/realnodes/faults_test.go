package realnodes

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
)

// udpFromPod sends count datagrams from one fixed source port of the Pod
// (OpenBSD nc: each run binds the same port, so every datagram is the same
// flow to conntrack and IPVS) and returns the answers in order ("" = none
// within a second).
func udpFromPod(t *testing.T, ctx context.Context, ns, pod, addr string, port, srcPort, count int) []string {
	t.Helper()
	out, err := execIn(ctx, ns, pod, fmt.Sprintf(
		`for i in $(seq %d); do a=$(echo hostname | nc -u -w 1 -p %d %s %d); echo "answer:$a"; done`, count, srcPort, addr, port))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var answers []string
	for _, l := range strings.Split(out, "\n") {
		if a, ok := strings.CutPrefix(l, "answer:"); ok {
			answers = append(answers, strings.TrimSpace(a))
		}
	}
	if len(answers) != count {
		t.Fatalf("%d answers of %d:\n%s", len(answers), count, out)
	}
	return answers
}

// recovered checks that answers switch to want after at most maxLost
// unanswered datagrams and never name another backend.
func recovered(answers []string, want string, maxLost int) error {
	lost := 0
	for i, a := range answers {
		switch {
		case a == want:
			for _, b := range answers[i:] {
				if b != want {
					return fmt.Errorf("answers after recovering: %q", answers)
				}
			}
			if lost > maxLost {
				return fmt.Errorf("%d datagrams lost before %s answered (at most %d): %q", lost, want, maxLost, answers)
			}
			return nil
		case a == "":
			lost++
		default:
			return fmt.Errorf("answer from %s after the endpoint change (want %s): %q", a, want, answers)
		}
	}
	return fmt.Errorf("%s never answered: %q", want, answers)
}

// testUDPAcrossEndpointChange: a UDP flow (one fixed source port, in the
// cluster to the ClusterIP and from outside to a NodePort) answered by
// backend A moves to B once A's Pod is replaced, losing at most one
// datagram: no flow stays stuck on the gone endpoint.
func testUDPAcrossEndpointChange(t *testing.T) {
	ctx := stepContext(t, 8*time.Minute)
	ns := namespace(t, "udp")
	serveHostname(t, ctx, ns, "udp", 1)
	svc := service(t, ctx, ns, "udp", corev1.ServiceTypeNodePort, corev1.ProtocolUDP)
	before := podsOf(t, ctx, ns, "udp")
	readyEndpoints(t, ctx, ns, "udp", keys(before)...)
	awaitProgrammed(t, ctx, ns, "udp")
	a := keys(before)[0]
	clientPod(t, ctx, ns, "client", rc.Nodes[0].Name)
	np := int(nodePort(t, svc, corev1.ProtocolUDP))
	outside := func(count int) string {
		// The NodePort of the node that does not run A, so the flow crosses nodes.
		via := rc.Nodes[0].IP()
		if before[a] == rc.Nodes[0].Name && len(rc.Nodes) > 1 {
			via = rc.Nodes[1].IP()
		}
		// request exits 1 when a datagram went unanswered: the summary
		// says which.
		r, err := rc.Client.Run(ctx, fmt.Sprintf("e2ehelper request --proto udp --source-port 40002 --addr %s:%d --count %d --timeout 1s", via, np, count))
		if err != nil {
			t.Fatal(err)
		}
		return r.Stdout
	}
	if ans := udpFromPod(t, ctx, ns, "client", svc.Spec.ClusterIP, servePort, 40001, 3); !allAre(ans, a) {
		t.Fatalf("before the change, in the cluster: %q, want %s", ans, a)
	}
	if sum, err := vm.ParseSummary(outside(3)); err != nil || sum.Backends[a] != 3 {
		t.Fatalf("before the change, from outside: %+v %v", sum, err)
	}

	if err := rc.Kube.CoreV1().Pods(ns).Delete(ctx, a, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var b string
	for deadline := time.Now().Add(3 * time.Minute); b == "" && time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		for p := range podsOf(t, ctx, ns, "udp") {
			if p != a {
				b = p
			}
		}
	}
	if b == "" {
		t.Fatal("no replacement Pod")
	}
	readyEndpoints(t, ctx, ns, "udp", b)
	awaitProgrammed(t, ctx, ns, "udp")
	inside := udpFromPod(t, ctx, ns, "client", svc.Spec.ClusterIP, servePort, 40001, 6)
	t.Logf("in the cluster, from port 40001 to %s:%d after %s replaced %s: %q", svc.Spec.ClusterIP, servePort, b, a, inside)
	if err := recovered(inside, b, 1); err != nil {
		t.Errorf("in the cluster, ClusterIP: %v", err)
	}
	out := outside(6)
	var answers []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[1] == "ok":
			answers = append(answers, f[2])
		case len(f) >= 2 && strings.HasPrefix(f[1], "fail"):
			answers = append(answers, "")
		}
	}
	t.Logf("from outside, from port 40002 to the NodePort: %q", answers)
	if err := recovered(answers, b, 1); err != nil {
		t.Errorf("from outside, NodePort: %v\n%s", err, out)
	}
}

func allAre(ans []string, want string) bool {
	for _, a := range ans {
		if a != want {
			return false
		}
	}
	return len(ans) > 0
}

// loop is a client loop that runs until stopped and counts answers.
type loop struct {
	name string
	stop func() (ok, fail int, detail string)
}

// outsideLoop runs e2ehelper request against addr from the outside client
// until stopped.
func outsideLoop(t *testing.T, ctx context.Context, name, addr string) loop {
	t.Helper()
	stopFile := "/tmp/stop-" + name
	p, err := rc.Client.Start(ctx, name, fmt.Sprintf("e2ehelper request --proto tcp --addr %s --count 100000 --interval 20ms --timeout 3s --stop-file %s", addr, stopFile))
	if err != nil {
		t.Fatal(err)
	}
	return loop{name: name, stop: func() (int, int, string) {
		if _, err := rc.VM.RunOK(ctx, "touch "+stopFile); err != nil {
			t.Fatal(err)
		}
		st, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := vm.ParseSummary(st.Log)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, st.Log)
		}
		var fails []string
		for _, l := range strings.Split(st.Log, "\n") {
			if strings.Contains(l, " fail") {
				fails = append(fails, l)
			}
		}
		return sum.OK, sum.Fail, strings.Join(fails, "\n")
	}}
}

// podLoop connects from the Pod to addr (a name CoreDNS resolves) until
// stopped.
func podLoop(t *testing.T, ctx context.Context, ns, pod, host string) loop {
	t.Helper()
	var (
		mu   sync.Mutex
		out  string
		err  error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		o, e := execIn(ctx, ns, pod, fmt.Sprintf(`rm -f /tmp/stop; ok=0; fail=0
while [ ! -e /tmp/stop ]; do
  a=$(nc -w 3 %s %d)
  if [ -n "$a" ]; then ok=$((ok+1)); else fail=$((fail+1)); echo "fail at $(date +%%T)"; fi
  sleep 0.05
done
echo "ok=$ok fail=$fail"`, host, servePort))
		mu.Lock()
		out, err = o, e
		mu.Unlock()
	}()
	return loop{name: "pod " + pod, stop: func() (int, int, string) {
		if o, e := execIn(ctx, ns, pod, "touch /tmp/stop"); e != nil {
			t.Fatalf("%v\n%s", e, o)
		}
		<-done
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Fatalf("the Pod's loop: %v\n%s", err, out)
		}
		var ok, fail int
		for _, l := range strings.Split(out, "\n") {
			if _, e := fmt.Sscanf(l, "ok=%d fail=%d", &ok, &fail); e == nil {
				return ok, fail, out
			}
		}
		t.Fatalf("the Pod's loop printed no count:\n%s", out)
		return 0, 0, ""
	}}
}

// testFailoverUnderLoad: while clients inside (a Pod, by Service name) and
// outside (each node's NodePort) connect without pause, a control-plane
// Pod is deleted (the Deployment replaces it) and the agent DaemonSet is
// rolled; no request fails, and every agent is back and in sync.
func testFailoverUnderLoad(t *testing.T) {
	// 18 min: on a 2-core TCG host the agent roll alone took over 6 min
	// once (containerd needed minutes to kill the old agent's container).
	ctx := stepContext(t, 18*time.Minute)
	ns := namespace(t, "failover")
	serveHostname(t, ctx, ns, "web", 2)
	svc := service(t, ctx, ns, "web", corev1.ServiceTypeNodePort, corev1.ProtocolTCP)
	readyEndpoints(t, ctx, ns, "web", keys(podsOf(t, ctx, ns, "web"))...)
	awaitProgrammed(t, ctx, ns, "web")
	clientPod(t, ctx, ns, "client", rc.Nodes[0].Name)
	np := nodePort(t, svc, corev1.ProtocolTCP)
	loops := []loop{podLoop(t, ctx, ns, "client", "web")}
	for _, n := range rc.Nodes {
		loops = append(loops, outsideLoop(t, ctx, "loop-"+n.Name, fmt.Sprintf("%s:%d", n.IP(), np)))
	}

	// One control-plane replica gone: its Pod deleted, a new one started by
	// the Deployment; its agents move to the other replica meanwhile.
	cps, err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=vsplane-controlplane"})
	if err != nil || len(cps.Items) == 0 {
		t.Fatalf("control-plane Pods: %v", err)
	}
	victim := cps.Items[0].Name
	t.Logf("deleting control-plane Pod %s on %s", victim, cps.Items[0].Spec.NodeName)
	if err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitReplaced(t, ctx, victim)
	kubectl(t, ctx, "-n", cluster.SystemNamespace, "rollout", "status", "deployment/vsplane-controlplane", "--timeout=5m")

	t.Log("rolling the agent DaemonSet")
	kubectl(t, ctx, "-n", cluster.SystemNamespace, "rollout", "restart", "daemonset/vsplane-agent")
	kubectl(t, ctx, "-n", cluster.SystemNamespace, "rollout", "status", "daemonset/vsplane-agent", "--timeout=10m")
	listAgents(t, ctx, rc.Nodes[len(rc.Nodes)-1].IP())

	for _, l := range loops {
		ok, fail, detail := l.stop()
		t.Logf("%s: %d answered, %d failed", l.name, ok, fail)
		if fail != 0 || ok == 0 {
			t.Errorf("%s: %d answered, %d failed:\n%s", l.name, ok, fail, detail)
		}
	}
}

// awaitReplaced waits until Pod victim is gone and two other control-plane
// Pods are ready.
func awaitReplaced(t *testing.T, ctx context.Context, victim string) {
	t.Helper()
	for deadline := time.Now().Add(4 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		pods, err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=vsplane-controlplane"})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, p := range pods.Items {
			if p.Name == victim {
				ready = -100
				break
			}
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				ready++
			}
		}
		if ready == 2 {
			return
		}
	}
	t.Fatalf("control-plane Pod %s not replaced:\n%s", victim, rc.PodsSummary(ctx))
}

// testRuntimeDown: with the last node's containerd stopped, its Node goes
// NotReady (the kubelet reports the runtime down) and the Service keeps
// answering through every node: the node's running containers and its
// agent are untouched, and its kernel keeps what the agent programmed.
// With containerd back the node is Ready again and serves.
func testRuntimeDown(t *testing.T) {
	ctx := stepContext(t, 12*time.Minute)
	ns := namespace(t, "runtime-down")
	serveHostname(t, ctx, ns, "web", 2)
	svc := service(t, ctx, ns, "web", corev1.ServiceTypeNodePort, corev1.ProtocolTCP)
	readyEndpoints(t, ctx, ns, "web", keys(podsOf(t, ctx, ns, "web"))...)
	awaitProgrammed(t, ctx, ns, "web")
	np := nodePort(t, svc, corev1.ProtocolTCP)
	down := rc.Nodes[len(rc.Nodes)-1]
	through := func(when string) {
		for _, n := range rc.Nodes {
			out, err := rc.Client.RunOK(ctx, fmt.Sprintf("e2ehelper request --proto tcp --addr %s:%d --count 10 --timeout 3s", n.IP(), np))
			sum, perr := vm.ParseSummary(out)
			if err != nil || perr != nil || sum.OK != 10 {
				t.Errorf("via %s %s: %+v %v %v", n.Name, when, sum, err, perr)
			}
		}
	}

	if err := down.StopRuntime(ctx); err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = down.StartRuntime(context.Background())
		}
	})
	if err := rc.AwaitNodeReady(ctx, down.Name, false); err != nil {
		t.Fatal(err)
	}
	node, err := rc.Kube.CoreV1().Nodes().Get(ctx, down.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && !strings.Contains(c.Message, "runtime") {
			t.Errorf("%s NotReady for another reason: %s", down.Name, c.Message)
		}
	}
	through("with " + down.Name + "'s runtime down")

	if err := down.StartRuntime(ctx); err != nil {
		t.Fatal(err)
	}
	restored = true
	if err := rc.AwaitNodeReady(ctx, down.Name, true); err != nil {
		t.Fatal(err)
	}
	through("after " + down.Name + "'s runtime is back")
}

// testImageImportFailure: importing a broken archive fails with an error
// naming the image and the file; an archive whose content is not the
// digest the builder reported fails naming both digests.
func testImageImportFailure(t *testing.T) {
	ctx := stepContext(t, 3*time.Minute)
	n := rc.Nodes[0]
	if err := n.WriteFile(ctx, "/tmp/broken.tar", []byte("not an image archive")); err != nil {
		t.Fatal(err)
	}
	err := n.ImportImage(ctx, "registry.example/broken:1", "sha256:00", "/tmp/broken.tar")
	if err == nil || !strings.Contains(err.Error(), "registry.example/broken:1") || !strings.Contains(err.Error(), "/tmp/broken.tar") {
		t.Errorf("broken archive: %v", err)
	}
	pause := imageOf(t, "registry.k8s.io/pause:3.10.2").Digest
	err = n.ImportImage(ctx, "registry.k8s.io/pause:3.10.2", "sha256:0000", "/opt/vsnode/images/pause.tar")
	if err == nil || !strings.Contains(err.Error(), pause) || !strings.Contains(err.Error(), "sha256:0000") {
		t.Errorf("digest mismatch: %v", err)
	}
}
