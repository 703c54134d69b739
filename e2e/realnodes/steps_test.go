package realnodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/nodes"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/e2e/vm/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// imageOf is the image the builder made as ref.
func imageOf(t *testing.T, ref string) nodes.DiskImage {
	t.Helper()
	for _, img := range rc.Images {
		if img.Ref == ref {
			return img
		}
	}
	t.Fatalf("the builder made no image %s", ref)
	return nodes.DiskImage{}
}

// testVsplaneFromManifests: both control-plane replicas (a Deployment) and
// one agent per node (a DaemonSet) run as Pods of the kubelets, from the
// images `make images` built (the kubelet reports their config digests; the
// import checked the manifest digests); each agent proves its
// node with the projected token its kubelet issued, and every node's agent
// is connected and in sync (ListAgents, asked through a replica).
func testVsplaneFromManifests(t *testing.T) {
	ctx := stepContext(t, 5*time.Minute)
	t.Logf("kubectl get pods -A -o wide:\n%s", kubectl(t, ctx, "get", "pods", "-A", "-o", "wide"))
	for _, c := range []struct {
		selector, image string
		want            int
	}{
		{"app=vsplane-controlplane", "ghcr.io/vsplane/vsplane-controlplane:dev", 2},
		{"app=vsplane-agent", "ghcr.io/vsplane/vsplane-agent:dev", len(rc.Nodes)},
	} {
		pods, err := rc.Kube.CoreV1().Pods(cluster.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: c.selector})
		if err != nil {
			t.Fatal(err)
		}
		want, err := imageOf(t, c.image).ImageID()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, p := range pods.Items {
			if len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
				t.Errorf("Pod %s is not ready: %+v", p.Name, p.Status.ContainerStatuses)
				continue
			}
			cs := p.Status.ContainerStatuses[0]
			if cs.Image != c.image || (cs.ImageID != want && !strings.HasSuffix(cs.ImageID, "@"+want)) {
				t.Errorf("Pod %s runs %s (%s), want %s@%s", p.Name, cs.Image, cs.ImageID, c.image, want)
			}
			if seen[p.Spec.NodeName] {
				t.Errorf("two %s Pods on %s", c.selector, p.Spec.NodeName)
			}
			seen[p.Spec.NodeName] = true
		}
		if len(seen) != c.want {
			t.Errorf("%s: ready Pods on %d nodes, want %d", c.selector, len(seen), c.want)
		}
	}
	// The agent's token is the kubelet's projected ServiceAccount token.
	ds, err := rc.Kube.AppsV1().DaemonSets(cluster.SystemNamespace).Get(ctx, "vsplane-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ds.Labels["app.kubernetes.io/managed-by"]; got != "Helm" {
		t.Errorf("the agent DaemonSet is managed by %q, want Helm (installed from the chart)", got)
	}
	projected := false
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken != nil && s.ServiceAccountToken.Audience == "vsplane" {
					projected = true
				}
			}
		}
	}
	if !projected {
		t.Error("the agent DaemonSet mounts no projected token of audience vsplane")
	}
	// Every agent connected and in sync: nothing pending (a change may be
	// in flight when the check starts, CoreDNS's endpoints for one, so it
	// is awaited, within two minutes) and no NACK.
	var problems []string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		problems = agentProblems(t, ctx)
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// agentProblems lists what keeps the fleet from being in sync: a node
// without a connected agent, an agent with pending resources or NACKs.
func agentProblems(t *testing.T, ctx context.Context) []string {
	t.Helper()
	var problems, names []string
	for _, a := range listAgents(t, ctx, rc.Nodes[0].IP()) {
		names = append(names, a.GetNodeName())
		if a.GetPendingResources() != 0 || a.GetNacks() != 0 {
			problems = append(problems, fmt.Sprintf("agent of %s: %d pending, %d NACKs (%s)",
				a.GetNodeName(), a.GetPendingResources(), a.GetNacks(), a.GetLastNackError()))
		}
	}
	for _, n := range rc.Nodes {
		if !slices.Contains(names, n.Name) {
			problems = append(problems, fmt.Sprintf("no agent of %s connected (ListAgents: %v)", n.Name, names))
		}
	}
	return problems
}

// listAgents is rc.ListAgents through the replica on the node at ip.
func listAgents(t *testing.T, ctx context.Context, ip string) []*vsplanev1.AgentInfo {
	t.Helper()
	agents, err := rc.ListAgents(ctx, ip)
	if err != nil {
		t.Fatal(err)
	}
	return agents
}

// awaitProgrammed waits until every node's agent holds Service ns/name
// with the current Pods of app=name as real servers.
func awaitProgrammed(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	pods, err := rc.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			ips = append(ips, p.Status.PodIP)
		}
	}
	if err := rc.AwaitProgrammed(ctx, ns, name, ips); err != nil {
		t.Fatal(err)
	}
}

// testServiceByName: a Pod resolves a ClusterIP Service by its short and
// its full name through CoreDNS (itself behind the kube-dns ClusterIP that
// vsplane serves) and reaches both of its backends, one per node.
func testServiceByName(t *testing.T) {
	ctx := stepContext(t, 8*time.Minute)
	ns := namespace(t, "by-name")
	serveHostname(t, ctx, ns, "web", 2)
	service(t, ctx, ns, "web", corev1.ServiceTypeClusterIP, corev1.ProtocolTCP)
	backends := podsOf(t, ctx, ns, "web")
	readyEndpoints(t, ctx, ns, "web", keys(backends)...)
	awaitProgrammed(t, ctx, ns, "web")
	clientPod(t, ctx, ns, "client", rc.Nodes[0].Name)
	for _, name := range []string{"web", "web." + ns + ".svc.cluster.local"} {
		// OpenBSD nc (agnhost's): connect, print what the server writes
		// before it closes.
		out, err := execIn(ctx, ns, "client", fmt.Sprintf(`for i in $(seq 12); do nc -w 3 %s %d; echo; done`, name, servePort))
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		seen := map[string]int{}
		for _, l := range strings.Fields(out) {
			seen[l]++
		}
		for b := range backends {
			if seen[b] == 0 {
				t.Errorf("%s: backend %s never answered (answers: %v)", name, b, seen)
			}
		}
		if n := seen[keys(backends)[0]] + seen[keys(backends)[1]]; n != 12 {
			t.Errorf("%s: %d of 12 connections answered (answers: %v)", name, n, seen)
		}
	}
	svc, err := rc.Kube.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := execIn(ctx, ns, "client", "dig +search +short web"); err != nil || strings.TrimSpace(out) != svc.Spec.ClusterIP {
		t.Errorf("dig +search web: %v %q, want %s", err, out, svc.Spec.ClusterIP)
	}
}

// testSessionAffinity: with sessionAffinity ClientIP, every connection of
// one client goes to one backend (IPVS persistence): a Pod's by the
// Service's name, and an outside client's through each node's NodePort.
// The Service has two backends, one per node, so a spread would show.
func testSessionAffinity(t *testing.T) {
	ctx := stepContext(t, 8*time.Minute)
	ns := namespace(t, "affinity")
	serveHostname(t, ctx, ns, "web", 2)
	obj := serviceObject(ns, "web", corev1.ServiceTypeNodePort, corev1.ProtocolTCP)
	obj.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc := createService(t, ctx, obj)
	backends := podsOf(t, ctx, ns, "web")
	readyEndpoints(t, ctx, ns, "web", keys(backends)...)
	awaitProgrammed(t, ctx, ns, "web")
	clientPod(t, ctx, ns, "client", rc.Nodes[0].Name)
	out, err := execIn(ctx, ns, "client", fmt.Sprintf(`for i in $(seq 12); do nc -w 3 web %d; echo; done`, servePort))
	if err != nil {
		t.Fatalf("from the Pod: %v\n%s", err, out)
	}
	seen := map[string]int{}
	for _, l := range strings.Fields(out) {
		seen[l]++
	}
	if len(seen) != 1 || seen[keys(seen)[0]] != 12 {
		t.Errorf("from the Pod by name: answers %v, want all 12 from one backend", seen)
	}
	port := nodePort(t, svc, corev1.ProtocolTCP)
	for _, n := range rc.Nodes {
		sum := requestsFromOutside(t, ctx, n.IP(), port, 10)
		if sum.OK != 10 || len(sum.Backends) != 1 {
			t.Errorf("from outside via %s's NodePort: %d of 10 ok, answers %v, want all from one backend", n.Name, sum.OK, sum.Backends)
		}
	}
}

// requestsFromOutside sends count TCP requests from the client outside the
// cluster to ip:port and returns what answered.
func requestsFromOutside(t *testing.T, ctx context.Context, ip string, port int32, count int) wire.Summary {
	t.Helper()
	out, err := rc.Client.RunOK(ctx, fmt.Sprintf("e2ehelper request --proto tcp --addr %s:%d --count %d --timeout 3s", ip, port, count))
	if err != nil {
		t.Fatalf("via %s: %v", ip, err)
	}
	sum, err := vm.ParseSummary(out)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// testNodePortFromOutside: a client outside the cluster (on the node
// network) reaches a NodePort Service through each node's address and gets
// both backends.
func testNodePortFromOutside(t *testing.T) {
	ctx := stepContext(t, 6*time.Minute)
	ns := namespace(t, "nodeport")
	serveHostname(t, ctx, ns, "web", 2)
	svc := service(t, ctx, ns, "web", corev1.ServiceTypeNodePort, corev1.ProtocolTCP)
	backends := podsOf(t, ctx, ns, "web")
	readyEndpoints(t, ctx, ns, "web", keys(backends)...)
	awaitProgrammed(t, ctx, ns, "web")
	port := nodePort(t, svc, corev1.ProtocolTCP)
	seen := map[string]int{}
	for _, n := range rc.Nodes {
		sum := requestsFromOutside(t, ctx, n.IP(), port, 10)
		if sum.OK != 10 || sum.Fail != 0 {
			t.Errorf("via %s: %d ok, %d failed", n.Name, sum.OK, sum.Fail)
		}
		for b, c := range sum.Backends {
			seen[b] += c
		}
	}
	for b := range backends {
		if seen[b] == 0 {
			t.Errorf("backend %s never answered (answers: %v)", b, seen)
		}
	}
}
