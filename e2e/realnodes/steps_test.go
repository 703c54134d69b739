package realnodes

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/nodes"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	"github.com/vsplane/vsplane/internal/wire"
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
	agents := listAgents(t, ctx, rc.Nodes[0].IP())
	var names []string
	for _, a := range agents {
		names = append(names, a.GetNodeName())
		if a.GetPendingResources() != 0 || a.GetNacks() != 0 {
			t.Errorf("agent of %s: %d pending, %d NACKs (%s)", a.GetNodeName(), a.GetPendingResources(), a.GetNacks(), a.GetLastNackError())
		}
	}
	for _, n := range rc.Nodes {
		if !slices.Contains(names, n.Name) {
			t.Errorf("no agent of %s connected (ListAgents: %v)", n.Name, names)
		}
	}
}

// inspect is an InspectService client of the replica on the node at ip
// (fleet-wide answers), over TLS verified against the cluster's Secret's
// CA, as an operator bound to vsplane-inspector, through the VM's CONNECT
// proxy. Connections are kept per address (gRPC reconnects).
func inspect(t *testing.T, ctx context.Context, ip string) vsplanev1.InspectServiceClient {
	t.Helper()
	inspectorOnce.Lock()
	conn := inspectorOnce.conns[ip]
	inspectorOnce.Unlock()
	if conn == nil {
		tokenFile := inspectorToken(t, ctx)
		cli, err := tlsfiles.NewClient(rc.TLS.CA, wire.DefaultServerName)
		if err != nil {
			t.Fatal(err)
		}
		proxy := rc.VM.HostFwdAddr(nodes.ProxyPort)
		conn, err = grpc.NewClient("passthrough:///"+net.JoinHostPort(ip, "18000"),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return nodes.DialThroughProxy(ctx, proxy, addr)
			}),
			grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())),
			grpc.WithPerRPCCredentials(bearer.File{Path: tokenFile}))
		if err != nil {
			t.Fatal(err)
		}
		inspectorOnce.Lock()
		if inspectorOnce.conns == nil {
			inspectorOnce.conns = map[string]*grpc.ClientConn{}
		}
		inspectorOnce.conns[ip] = conn
		inspectorOnce.Unlock()
	}
	return vsplanev1.NewInspectServiceClient(conn)
}

// listAgents waits (a minute at most) until the replica on the node at ip
// lists an agent for every node, and returns them.
func listAgents(t *testing.T, ctx context.Context, ip string) []*vsplanev1.AgentInfo {
	t.Helper()
	var last error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		resp, err := inspect(t, ctx, ip).ListAgents(cctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
		cancel()
		if err == nil && len(resp.GetAgents()) == len(rc.Nodes) {
			return resp.GetAgents()
		}
		last = err
		if err == nil {
			last = fmt.Errorf("%d agents listed", len(resp.GetAgents()))
		}
	}
	t.Fatalf("ListAgents through %s: %v", ip, last)
	return nil
}

// awaitProgrammed waits until every node's agent acknowledged a desired
// state of Service ns/name whose real servers are exactly the Pods' IPs of
// app=name (ExplainService): what a user checks before sending traffic,
// since an EndpointSlice's change reaches the kernels a moment later.
func awaitProgrammed(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	pods, err := rc.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			want = append(want, p.Status.PodIP)
		}
	}
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		done := 0
		for _, n := range rc.Nodes {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			resp, err := inspect(t, ctx, rc.Nodes[0].IP()).ExplainService(cctx, &vsplanev1.ExplainServiceRequest{NodeName: n.Name, Namespace: ns, Name: name})
			cancel()
			if err != nil {
				last = err.Error()
				break
			}
			ok := resp.GetAcknowledgement() == vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED && len(resp.GetService().GetVirtualServers()) > 0
			for _, vs := range resp.GetService().GetVirtualServers() {
				var got []string
				for _, r := range vs.GetRealServers() {
					if r.GetWeight() > 0 {
						got = append(got, r.GetAddress())
					}
				}
				if !sameSet(got, want) {
					ok = false
				}
			}
			if !ok {
				last = fmt.Sprintf("%s: %s, %v", n.Name, resp.GetAcknowledgement(), resp.GetService().GetVirtualServers())
				break
			}
			done++
		}
		if done == len(rc.Nodes) {
			return
		}
	}
	t.Fatalf("Service %s/%s with real servers %v not programmed on every node: %s", ns, name, want, last)
}

var inspectorOnce struct {
	sync.Mutex
	file  string
	conns map[string]*grpc.ClientConn
}

// inspectorToken is a token of ServiceAccount default/vsplane-test-inspector,
// bound to the vsplane-inspector ClusterRole (deploy/base/rbac.yaml).
func inspectorToken(t *testing.T, ctx context.Context) string {
	t.Helper()
	inspectorOnce.Lock()
	defer inspectorOnce.Unlock()
	if inspectorOnce.file != "" {
		return inspectorOnce.file
	}
	const sa = "vsplane-test-inspector"
	if _, err := rc.Kube.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "vsplane-inspector"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: "default"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tok, err := rc.Kube.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(os.TempDir(), fmt.Sprintf("vsplane-inspector-%d.token", os.Getpid()))
	if err := os.WriteFile(f, []byte(tok.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	inspectorOnce.file = f
	return f
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
		out, err := rc.Client.RunOK(ctx, fmt.Sprintf("e2ehelper request --proto tcp --addr %s:%d --count 10 --timeout 3s", n.IP(), port))
		if err != nil {
			t.Fatalf("via %s: %v", n.Name, err)
		}
		sum, err := vm.ParseSummary(out)
		if err != nil {
			t.Fatal(err)
		}
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
