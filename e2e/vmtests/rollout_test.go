package vmtests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestVMSchedulerRollout: a SchedulerRollout to mh on two nodes in the
// kernel. After its first step (paused) only the reached node's ipvsadm
// shows mh; a long-lived TCP connection through node1 keeps flowing while
// node1's virtual server changes scheduler in place; when the rollout is
// done, 200 client addresses (each with one fixed source port) reach the
// same backend through either node's NodePort: one central computation
// gives both nodes the same real servers in the same order, so Maglev
// hashing agrees.
func TestVMSchedulerRollout(t *testing.T) {
	r := newVMRun(t, 12*time.Minute)
	ctx := r.ctx
	c := r.startCluster(cluster.Options{
		Nodes: 2,
		Pods:  [][]string{{"pod-a", "pod-b"}, {"pod-c"}},
		Log:   zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	r.phase("cluster up")

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{
			Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(cluster.ServePort)}}},
	}
	created, err := c.Kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip, nodePort := created.Spec.ClusterIP, created.Spec.Ports[0].NodePort
	var eps []cluster.Endpoint
	var want []string
	for _, p := range []string{"pod-a", "pod-b", "pod-c"} {
		ep, err := c.PodEndpoint(p, false)
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
		want = append(want, ep.IP+":8080")
	}
	if err := c.ApplySlice(ctx, "default", "web", "web-1", discoveryv1.AddressTypeIPv4,
		[]cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}, eps); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node1", "node2"} {
		if err := c.AwaitServing(ctx, n, vip, 80, 1, want, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	r.phase("Service programmed")

	// A long-lived connection through node1 (the client routes the Service
	// range via node1), echoing every 200 ms for the whole test.
	hold, err := c.Client.Start(ctx, "hold-web", fmt.Sprintf("e2ehelper hold --addr %s:80 --interval 200ms --duration 10m --timeout 3s", vip))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.AwaitLog(ctx, "2 ok"); err != nil {
		t.Fatalf("hold: %v", err)
	}

	dyn, err := dynamic.NewForConfig(c.Env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ro := &v1alpha1.SchedulerRollout{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "SchedulerRollout"},
		ObjectMeta: metav1.ObjectMeta{Name: "to-mh"},
		Spec: v1alpha1.SchedulerRolloutSpec{Scheduler: "mh", Paused: true,
			ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Strategy:        v1alpha1.RolloutStrategy{Steps: []intstr.IntOrString{intstr.FromInt32(1), intstr.FromString("100%")}}},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ro)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(v1alpha1.Resource).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	progress := func(phase string) *vsplanev1.GetRolloutResponse {
		t.Helper()
		var p *vsplanev1.GetRolloutResponse
		if err := cluster.Await(ctx, 2*time.Minute, 300*time.Millisecond, func(ctx context.Context) error {
			var err error
			p, err = c.Replica.Inspect.GetRollout(ctx, &vsplanev1.GetRolloutRequest{Name: "to-mh"})
			if err != nil {
				return err
			}
			if p.GetPhase() != phase {
				return fmt.Errorf("phase %q, want %q", p.GetPhase(), phase)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// schedulerOn is the scheduler ipvsadm shows for the Service's virtual
	// servers on node (they must agree).
	schedulerOn := func(node string) string {
		t.Helper()
		tab := ipvsTable(t, ctx, c, node)
		sched := ""
		for key := range tab {
			f := strings.Fields(key)
			if !strings.Contains(f[1], fmt.Sprintf(":%d", 80)) && !strings.Contains(f[1], fmt.Sprintf(":%d", nodePort)) {
				continue
			}
			if sched != "" && f[2] != sched {
				t.Fatalf("%s: the Service's virtual servers disagree: %s", node, tab)
			}
			sched = f[2]
		}
		return sched
	}

	p := progress("Paused")
	var rolled, other string
	for _, n := range p.GetNodes() {
		if n.GetState() == vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_UPDATED {
			rolled = n.GetNodeName()
		} else {
			other = n.GetNodeName()
		}
	}
	if rolled == "" || other == "" {
		t.Fatalf("after the first step: %v", p.GetNodes())
	}
	if got := schedulerOn(rolled); got != "mh" {
		t.Errorf("%s (rolled out) runs %q, want mh", rolled, got)
	}
	if got := schedulerOn(other); got != "rr" {
		t.Errorf("%s (not yet) runs %q, want rr", other, got)
	}
	r.phase("first step: one node on mh")

	if _, err := dyn.Resource(v1alpha1.Resource).Patch(ctx, "to-mh", "application/merge-patch+json", []byte(`{"spec":{"paused":false}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	progress("Succeeded")
	for _, n := range []string{"node1", "node2"} {
		if err := cluster.Await(ctx, time.Minute, 300*time.Millisecond, func(context.Context) error {
			if got := schedulerOn(n); got != "mh" {
				return fmt.Errorf("%s runs %q", n, got)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	r.phase("rollout done")

	// The connection through node1 survived node1's switch to mh.
	if l, _ := hold.Log(ctx); strings.Contains(l, " fail: ") || strings.Contains(l, "summary ") {
		t.Fatalf("the long-lived connection broke or ended during the rollout:\n%s", tail(l, 20))
	}

	// Maglev agrees across nodes: 200 sources, one request each through
	// node1's and node2's NodePort.
	const sources, first = 200, "198.19.254.1"
	if _, err := c.Client.RunOK(ctx, "set -e; for i in $(seq 1 200); do ip addr add 198.19.254.$i/32 dev eth0; done"); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if _, err := c.RunInNode(ctx, n.Name, "ip route add 198.19.254.0/24 via "+c.Client.IP); err != nil {
			t.Fatal(err)
		}
	}
	backends := map[string]map[string]string{} // node -> source -> backend
	for _, n := range c.Nodes {
		res, err := c.Client.Run(ctx, fmt.Sprintf("e2ehelper request --addr %s:%d --count %d --source-from %s --source-port 40123 --timeout 3s",
			n.IP, nodePort, sources, first))
		if err != nil {
			t.Fatal(err)
		}
		backends[n.Name] = map[string]string{}
		for _, l := range strings.Split(res.Stdout, "\n") {
			f := strings.Fields(l) // "i ok SOURCE BACKEND from ..."
			if len(f) >= 4 && f[1] == "ok" {
				backends[n.Name][f[2]] = f[3]
			}
		}
		if len(backends[n.Name]) != sources {
			t.Fatalf("through %s: %d of %d sources answered\n%s", n.Name, len(backends[n.Name]), sources, tail(res.Stdout+res.Stderr, 20))
		}
	}
	agree, spread := 0, map[string]int{}
	for src, b := range backends["node1"] {
		if backends["node2"][src] == b {
			agree++
		}
		spread[b]++
	}
	t.Logf("mh through node1 and node2: %d of %d sources reached the same backend; node1's spread %v", agree, sources, spread)
	if agree != sources || len(spread) < 3 {
		t.Errorf("Maglev disagreed for %d of %d sources (or used only %v)", sources-agree, sources, spread)
	}
	st, err := hold.Kill(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum, err := vm.ParseSummary(st.Log); err != nil || sum.Fail != 0 || sum.OK < 10 || len(sum.Backends) != 1 {
		t.Errorf("the long-lived connection: %+v %v (want no failure, one backend throughout)\n%s", sum, err, tail(st.Log, 20))
	}
	r.phase("Maglev consistency")
}
