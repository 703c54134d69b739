package realnodes

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vsplane/vsplane/controlplane/cli"
	"github.com/vsplane/vsplane/e2e/cluster"
)

// testKubectlPlugin: an operator runs `kubectl vsplane` with a kubeconfig
// holding nothing but the apiserver and their own token (a ServiceAccount
// bound to vsplane-inspector, allowed to port-forward in vsplane's
// namespace). The plugin finds a Ready replica behind the Service,
// port-forwards to it through the apiserver and the kubelet, verifies TLS
// against the CA the replicas published in their ConfigMap, and reports
// every node in sync; explain and snapshot answer through the same path.
func testKubectlPlugin(t *testing.T) {
	ctx := stepContext(t, 3*time.Minute)
	tokenFile, err := rc.InspectorTokenFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := allowPortForward(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(rc.Env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for name := range cfg.AuthInfos { // the operator's kubeconfig: no admin certificate
		cfg.AuthInfos[name].ClientCertificateData, cfg.AuthInfos[name].ClientKeyData = nil, nil
		cfg.AuthInfos[name].ClientCertificate, cfg.AuthInfos[name].ClientKey = "", ""
		cfg.AuthInfos[name].TokenFile = tokenFile
	}
	kubeconfig := filepath.Join(t.TempDir(), "operator.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	plugin := func(args ...string) (string, int) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Main(ctx, append(args, "--kubeconfig", kubeconfig), &out, &errOut)
		t.Logf("kubectl vsplane %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		return out.String(), code
	}

	// In sync is awaited: CoreDNS's or an earlier step's change may be in
	// flight (exit 3 until it is acknowledged).
	var report cli.StatusReport
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		out, code := plugin("status", "-o", "json")
		if code == cli.ExitOK {
			if err := json.Unmarshal([]byte(out), &report); err != nil {
				t.Fatalf("status -o json: %v", err)
			}
			break
		}
		if code != cli.ExitNotInSync || time.Now().After(deadline) {
			t.Fatalf("status: exit %d, want %d (every node in sync)", code, cli.ExitOK)
		}
	}
	var nodes []string
	for _, n := range report.Nodes {
		nodes = append(nodes, n.Node)
		if !n.InSync {
			t.Errorf("exit 0 with node %s not in sync", n.Node)
		}
	}
	slices.Sort(nodes)
	var want []string
	for _, n := range rc.Nodes {
		want = append(want, n.Name)
	}
	slices.Sort(want)
	if !slices.Equal(nodes, want) {
		t.Errorf("status lists %v, want every node %v", nodes, want)
	}

	node := rc.Nodes[0].Name
	if out, code := plugin("explain", "default/kubernetes", "--node", node); code != cli.ExitOK || !strings.Contains(out, "443") {
		t.Errorf("explain default/kubernetes --node %s: exit %d, want 0 and its port 443", node, code)
	}
	if out, code := plugin("snapshot", node, "-o", "json"); code != cli.ExitOK || !strings.Contains(out, "kube-dns") {
		t.Errorf("snapshot %s: exit %d, want 0 and the kube-dns Service", node, code)
	}
	if _, code := plugin("snapshot", "no-such-node"); code != cli.ExitNotFound {
		t.Errorf("snapshot of an unknown node: exit %d, want %d", code, cli.ExitNotFound)
	}
}

// allowPortForward grants cluster.InspectorAccount what `kubectl
// port-forward svc/...` needs in vsplane's namespace (the README's
// "get" and "create" on pods/portforward), as an operator's admin would.
func allowPortForward(ctx context.Context) error {
	const name = "vsplane-inspector-portforward"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster.SystemNamespace},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods"}, Verbs: []string{"get", "list"}},
			// get: the WebSocket upgrade kubectl and the plugin try first is a GET.
			{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"get", "create"}},
		}}
	if _, err := rc.Kube.RbacV1().Roles(cluster.SystemNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster.SystemNamespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: cluster.InspectorAccount, Namespace: "default"}}}
	if _, err := rc.Kube.RbacV1().RoleBindings(cluster.SystemNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}
