package integration_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/internal/testpki"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

const sysNS = "vsplane-system"

// The agent stream and inspection against a real apiserver that authorizes
// with RBAC: TLS on the listener, agents identified by projected
// ServiceAccount tokens bound to Pods (TokenReview; the node comes from the
// token, never the Hello), inspection gated by TokenReview +
// SubjectAccessReview with deploy/rbac.yaml's vsplane-inspector role.
func TestAuthenticatedAgentsAndAuthorizedInspection(t *testing.T) {
	env, kube, ctx := startKubeWith(t, kubeenv.Options{AuthorizationMode: "RBAC"}, "node-a", "node-b")
	mustCreateService(t, ctx, kube, clusterIPService("default", "web", 80))
	applyManifest(t, ctx, kube, filepath.Join("..", "..", "deploy", "base", "rbac.yaml"))
	pods := map[string]*corev1.Pod{}
	for _, n := range []string{"node-a", "node-b"} {
		p, err := kube.CoreV1().Pods(sysNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "vsplane-agent-" + n},
			Spec: corev1.PodSpec{NodeName: n, ServiceAccountName: "vsplane-agent",
				Containers: []corev1.Container{{Name: "agent", Image: "vsplane/agent"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods[n] = p
	}
	dir := t.TempDir()
	ca, err := testpki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The replica runs as its ServiceAccount with deploy/rbac.yaml's
	// permissions only: if they lacked a read, a review or the rollout
	// leader's Lease, it would never become ready or lead.
	if err := env.InstallCRDs(ctx, filepath.Join("..", "..", "deploy", "crds")); err != nil {
		t.Fatal(err)
	}
	cpToken, err := kube.CoreV1().ServiceAccounts(sysNS).CreateToken(ctx, "vsplane-controlplane", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	asCP := rest.AnonymousClientConfig(env.RESTConfig())
	asCP.BearerToken = cpToken.Status.Token
	ln := listen(t)
	addr := ln.Addr().String()
	// Built as vsplane-controlplane builds it (app.FromCommandLine): New
	// makes the API clients from the rest.Config, and the TLS, the agents'
	// TokenReview authentication and the inspection authorization from
	// Security.
	replica, _ := runReplica(t, ctx, app.Config{REST: asCP, KubeAPIQPS: 50, AuthAPIQPS: 50, GRPCListener: ln,
		Security: &app.Security{CertFile: files.Cert, KeyFile: files.Key, AgentServiceAccounts: []string{sysNS + "/vsplane-agent"},
			CAFile: files.CA, CAConfigMap: sysNS + "/vsplane-controlplane-ca"},
		Rollouts: true, RolloutLease: sysNS + "/vsplane-rollout-leader"})
	awaitReady(t, replica, converge)
	eventually(t, converge, func() string {
		if !replica.Rollouts.Leading() {
			return "the replica does not lead rollouts (Lease permissions?)"
		}
		return ""
	})
	checkCAPublished(t, ctx, env, kube, files.CA)
	cli, err := tlsfiles.NewClient(files.CA, testpki.ServerName)
	if err != nil {
		t.Fatal(err)
	}

	token := func(sa string, audiences []string, pod *corev1.Pod) string {
		t.Helper()
		exp := int64(3600)
		req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &exp}}
		if pod != nil {
			req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
		}
		r, err := kube.CoreV1().ServiceAccounts(sysNS).CreateToken(ctx, sa, req, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Token
	}
	writeToken := func(name, tok string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// An agent with its node's projected token is served over TLS.
	a := startAgentCfg(t, ctx, agent.Config{ControlPlane: []string{addr}, NodeName: "node-a", Kernel: ptr(memory.New().Kernel()),
		TLS: cli.Config(), TokenFile: writeToken("node-a.token", token("vsplane-agent", []string{auth.AgentAudience}, pods["node-a"]))})
	t.Cleanup(func() { a.stop(t) })
	eventually(t, converge, func() string {
		info, ok := replica.Streams.Registry().Agent("node-a")
		if !ok || info.GetLastAck() == nil || info.GetPendingResources() != 0 {
			return "node-a's agent not in sync"
		}
		return ""
	})

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// hello opens a stream with token (none if ""), says Hello for node and
	// returns how the stream ended (nil: a first Delta arrived).
	hello := func(tok, node string) error {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if tok != "" {
			cctx = metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tok)
		}
		st, err := vsplanev1.NewAgentServiceClient(conn).Connect(cctx)
		if err != nil {
			return err
		}
		_ = st.Send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{NodeName: node}}})
		_, err = st.Recv()
		return err
	}
	expired := forgeExpiredToken(t, env, kube, pods["node-a"])
	for _, tc := range []struct {
		name, token, node string
		code              codes.Code
		msg               string
	}{
		{"no token", "", "node-a", codes.Unauthenticated, "no bearer token"},
		{"expired token", expired, "node-a", codes.Unauthenticated, "expired"},
		{"wrong audience", token("vsplane-agent", []string{"something-else"}, pods["node-a"]), "node-a", codes.Unauthenticated, "audience"},
		{"token of a pod on another node", token("vsplane-agent", []string{auth.AgentAudience}, pods["node-b"]), "node-a", codes.PermissionDenied, `credentials belong to node "node-b"`},
		{"token not bound to a pod", token("vsplane-agent", []string{auth.AgentAudience}, nil), "node-a", codes.PermissionDenied, "not bound to a Pod"},
		{"token of another ServiceAccount", token("vsplane-controlplane", []string{auth.AgentAudience}, nil), "node-a", codes.PermissionDenied, "not an agent's"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			err := hello(tc.token, tc.node)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	// None of them disturbed the real agent of node-a, and none registered.
	if info, ok := replica.Streams.Registry().Agent("node-a"); !ok || info.GetPendingResources() != 0 {
		t.Fatalf("node-a's agent after the refused streams: %v", info)
	}
	if n := replica.Streams.Registry().Len(); n != 1 {
		t.Fatalf("%d agents registered, want only node-a's", n)
	}
	metrics := gatherText(t, replica)
	for _, want := range []string{`reason="unauthenticated"} 3`, `reason="permission_denied"} 3`} {
		if !strings.Contains(metrics, "vsplane_controlplane_agent_streams_rejected_total{"+want) {
			t.Errorf("metrics lack vsplane_controlplane_agent_streams_rejected_total{%s:\n%s", want, grepLines(metrics, "rejected"))
		}
	}
	if err := hello("", "node-b"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("plaintext-less check: %v", err)
	}
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("a plaintext client was answered by a TLS listener")
	}

	t.Run("inspection needs a token and get on inspection.vsplane.io", func(t *testing.T) {
		insp := vsplanev1.NewInspectServiceClient(conn)
		call := func(tok string) error {
			cctx := ctx
			if tok != "" {
				cctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
			}
			_, err := insp.GetNodeSnapshot(cctx, &vsplanev1.GetNodeSnapshotRequest{NodeName: "node-a"})
			return err
		}
		if err := call(""); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("no token: %v", err)
		}
		if _, err := kube.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reader"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rt, err := kube.CoreV1().ServiceAccounts("default").CreateToken(ctx, "reader", &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reader := rt.Status.Token
		if err := call(reader); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "vsplane-inspector") {
			t.Fatalf("token without the role: %v", err)
		}
		if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "reader-inspects"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "vsplane-inspector"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "reader", Namespace: "default"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// A denial is cached for auth.NegativeTTL; the grant shows after it.
		eventually(t, 2*auth.NegativeTTL+converge, func() string {
			if err := call(reader); err != nil {
				return err.Error()
			}
			return ""
		})
		// The README's grpcurl: -cacert, -servername and the token.
		out, err := exec.CommandContext(ctx, grpcurlPath(t), "-cacert", files.CA, "-servername", testpki.ServerName,
			"-H", "authorization: Bearer "+reader, "-d", `{"node_name":"node-a"}`, addr, "vsplane.v1.InspectService/GetNodeStatus").CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"nodeName": "node-a"`) {
			t.Fatalf("grpcurl GetNodeStatus: %v\n%s", err, out)
		}
		// Health and reflection need no token (probes; the API's shape only).
		if out, err := exec.CommandContext(ctx, grpcurlPath(t), "-cacert", files.CA, "-servername", testpki.ServerName, addr, "list").CombinedOutput(); err != nil || !strings.Contains(string(out), "vsplane.v1.InspectService") {
			t.Fatalf("grpcurl list without a token: %v\n%s", err, out)
		}
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health without a token: %v", err)
		}
	})
}

// applyManifest creates the ServiceAccounts, ClusterRoles and
// ClusterRoleBindings of a multi-document YAML file (the Namespace too).
func applyManifest(t *testing.T, ctx context.Context, kube kubernetes.Interface, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch meta.Kind {
		case "Namespace":
			var o corev1.Namespace
			mustYAML(t, doc, &o)
			_, err = kube.CoreV1().Namespaces().Create(ctx, &o, metav1.CreateOptions{})
		case "ServiceAccount":
			var o corev1.ServiceAccount
			mustYAML(t, doc, &o)
			_, err = kube.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		case "ClusterRole":
			var o rbacv1.ClusterRole
			mustYAML(t, doc, &o)
			_, err = kube.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			mustYAML(t, doc, &o)
			_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
		case "Role":
			var o rbacv1.Role
			mustYAML(t, doc, &o)
			_, err = kube.RbacV1().Roles(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		case "RoleBinding":
			var o rbacv1.RoleBinding
			mustYAML(t, doc, &o)
			_, err = kube.RbacV1().RoleBindings(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected kind %q", path, meta.Kind)
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", path, meta.Kind, err)
		}
	}
}

func mustYAML(t *testing.T, doc string, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
		t.Fatal(err)
	}
}

// forgeExpiredToken signs, with the apiserver's own ServiceAccount key, a
// token like a projected one for pod that expired an hour ago: the
// apiserver must reject it as expired.
func forgeExpiredToken(t *testing.T, env *kubeenv.Env, kube kubernetes.Interface, pod *corev1.Pod) string {
	t.Helper()
	b, err := os.ReadFile(env.ServiceAccountKey)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no PEM in the ServiceAccount key")
	}
	key, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kube.CoreV1().ServiceAccounts(sysNS).Get(context.Background(), "vsplane-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	claims := map[string]any{
		"iss": "https://kubernetes.default.svc", "aud": []string{auth.AgentAudience},
		"sub": "system:serviceaccount:" + sysNS + ":vsplane-agent",
		"iat": now.Add(-2 * time.Hour).Unix(), "nbf": now.Add(-2 * time.Hour).Unix(), "exp": now.Add(-time.Hour).Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      sysNS,
			"serviceaccount": map[string]any{"name": "vsplane-agent", "uid": string(sa.UID)},
			"pod":            map[string]any{"name": pod.Name, "uid": string(pod.UID)},
			"node":           map[string]any{"name": pod.Spec.NodeName},
		},
	}
	enc := func(v any) string {
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(j)
	}
	signed := enc(map[string]string{"alg": "ES256", "typ": "JWT"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signed))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func gatherText(t *testing.T, r *app.Replica) string {
	t.Helper()
	mfs, err := r.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			fmt.Fprintf(&b, "%s{", mf.GetName())
			for i, l := range m.GetLabel() {
				if i > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, "%s=%q", l.GetName(), l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			fmt.Fprintf(&b, "} %v\n", v)
		}
	}
	return b.String()
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// checkCAPublished: the replica, with deploy/rbac.yaml's permissions only,
// published its CA bundle in ConfigMap vsplane-controlplane-ca, and any
// authenticated user (here a ServiceAccount bound to nothing) may read it
// but not the other ConfigMaps of the namespace.
func checkCAPublished(t *testing.T, ctx context.Context, env *kubeenv.Env, kube kubernetes.Interface, caFile string) {
	t.Helper()
	want, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := kube.CoreV1().ServiceAccounts("default").CreateToken(ctx, "nobody", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	asNobody := rest.AnonymousClientConfig(env.RESTConfig())
	asNobody.BearerToken = tok.Status.Token
	nobody := kubernetes.NewForConfigOrDie(asNobody)
	eventually(t, converge, func() string {
		cm, err := nobody.CoreV1().ConfigMaps(sysNS).Get(ctx, "vsplane-controlplane-ca", metav1.GetOptions{})
		if err != nil {
			return fmt.Sprintf("an authenticated user reads the CA ConfigMap: %v", err)
		}
		if cm.Data[app.CABundleKey] != string(want) {
			return fmt.Sprintf("published bundle %q, want the CA file's", cm.Data[app.CABundleKey])
		}
		return ""
	})
	if _, err := nobody.CoreV1().ConfigMaps(sysNS).List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("an authenticated user may list the namespace's ConfigMaps; want only the CA bundle readable")
	}
}
