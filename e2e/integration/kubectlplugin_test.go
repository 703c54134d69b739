package integration_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/controlplane/cli"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/internal/testpki"
	"github.com/vsplane/vsplane/internal/tlsfiles"
)

// kubectl vsplane against a real apiserver (RBAC) and a real control plane
// serving TLS and authorizing inspection (TokenReview +
// SubjectAccessReview), with two agents on in-memory kernels: every
// command's output and exit code, as an operator bound to
// vsplane-inspector through a kubeconfig; the CA read from the ConfigMap;
// a token without the role, a kubeconfig with a client certificate only, a
// wrong CA and a wrong server name refused. (--address: port-forwarding
// needs a kubelet, which this test bed lacks; choosePod has unit tests.)
func TestKubectlPlugin(t *testing.T) {
	env, kube, ctx := startKubeWith(t, kubeenv.Options{AuthorizationMode: "RBAC"}, "node-a", "node-b")
	applyManifest(t, ctx, kube, filepath.Join("..", "..", "deploy", "base", "rbac.yaml"))
	if err := env.InstallCRDs(ctx, filepath.Join("..", "..", "deploy", "crds")); err != nil {
		t.Fatal(err)
	}
	web := clusterIPService("default", "web", 80)
	web.Labels = map[string]string{"app": "web"}
	mustCreateService(t, ctx, kube, web)
	mustCreateSlice(t, ctx, kube, endpointSlice("default", "web", []int32{80}, endpoint{"10.244.1.5", "node-a"}, endpoint{"10.244.2.5", "node-b"}))

	dir := t.TempDir()
	ca, err := testpki.NewCA("plugin")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := tlsfiles.NewServer(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	addr := ln.Addr().String()
	replica, _ := runReplica(t, ctx, app.Config{Kube: kube, Dynamic: dyn, GRPCListener: ln, Advertise: addr,
		TLS: srv.Config(), InspectAuth: auth.NewInspectors(kube).Authorize,
		Rollouts: true, RolloutLease: sysNS + "/vsplane-rollout-leader",
		RolloutTiming: &app.RolloutTiming{LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 300 * time.Millisecond, Interval: 200 * time.Millisecond}})
	awaitReady(t, replica, converge)
	agentTLS, err := tlsfiles.NewClient(files.CA, testpki.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	// node-b's kernel lacks "mh": a Service asking for it is NACKed there.
	kernels := map[string]*memory.Kernel{"node-a": memory.New(), "node-b": memory.New()}
	kernels["node-b"].SetSchedulers([]string{"rr", "wrr"})
	for _, n := range []string{"node-a", "node-b"} {
		a := startAgentCfg(t, ctx, agent.Config{ControlPlane: []string{addr}, NodeName: n, Kernel: ptr(kernels[n].Kernel()), TLS: agentTLS.Config()})
		t.Cleanup(func() { a.stop(t) })
	}
	inSync := func() string {
		for _, n := range []string{"node-a", "node-b"} {
			if msg := ackedExactly(replica, n); msg != "" {
				return msg
			}
		}
		return ""
	}
	eventually(t, converge, inSync)

	// The operator: a ServiceAccount bound to vsplane-inspector, in a
	// kubeconfig with its token; a stranger without the role.
	token := func(sa string) string {
		t.Helper()
		if _, err := kube.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r, err := kube.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Token
	}
	operator, stranger := token("operator"), token("stranger")
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "operator-inspects"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "vsplane-inspector"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "operator", Namespace: "default"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"test": {Server: env.Host, CertificateAuthorityData: env.CACert()}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"operator": {Token: operator}},
		Contexts:       map[string]*clientcmdapi.Context{"test": {Cluster: "test", AuthInfo: "operator", Namespace: "default"}},
		CurrentContext: "test",
	}, kubeconfig); err != nil {
		t.Fatal(err)
	}
	certOnly := filepath.Join(dir, "kubeconfig-cert")
	kc, err := env.KubeconfigFor(env.Host, "alice", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certOnly, kc, 0o600); err != nil {
		t.Fatal(err)
	}

	type result struct {
		out, err string
		code     int
	}
	plugin := func(args ...string) result {
		t.Helper()
		var out, errOut bytes.Buffer
		args = append(args, "--address", addr)
		if !strings.Contains(strings.Join(args, " "), "--kubeconfig") {
			args = append(args, "--kubeconfig", kubeconfig)
		}
		code := cli.Main(ctx, args, &out, &errOut)
		return result{out.String(), errOut.String(), code}
	}
	expect := func(r result, code int, stdout, stderr []string) {
		t.Helper()
		if r.code != code {
			t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.out, r.err)
		}
		for _, s := range stdout {
			if !strings.Contains(r.out, s) {
				t.Errorf("stdout lacks %q:\n%s", s, r.out)
			}
		}
		for _, s := range stderr {
			if !strings.Contains(r.err, s) {
				t.Errorf("stderr lacks %q:\n%s", s, r.err)
			}
		}
	}

	// The CA ConfigMap is readable by every authenticated user, as the
	// control plane's manifests grant.
	if _, err := kube.RbacV1().Roles(sysNS).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ca-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{cli.CAConfigMap}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().RoleBindings(sysNS).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ca-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ca-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// No ConfigMap yet (the control plane under test does not publish
	// one): the plugin says so rather than skipping verification.
	expect(plugin("status"), cli.ExitError, nil, []string{"vsplane-system/vsplane-controlplane-ca", "--certificate-authority"})
	expect(plugin("status", "--certificate-authority", files.CA), cli.ExitOK, []string{"node-a", "node-b", "IN SYNC"}, nil)
	caPEM, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ConfigMaps(sysNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cli.CAConfigMap}, Data: map[string]string{cli.CAKey: string(caPEM)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("status", func(t *testing.T) {
		r := plugin("status")
		expect(r, cli.ExitOK, []string{"NODE", "REPLICA", "SYNC", "LAST ACK", "CAPABILITIES"}, nil)
		if got := column(r.out, 0, 2); got != "node-a IN SYNC,node-b IN SYNC" {
			t.Errorf("want a header and one line per node, in sync; got %q:\n%s", got, r.out)
		}
		r = plugin("status", "-o", "json")
		expect(r, cli.ExitOK, nil, nil)
		var rep cli.StatusReport
		if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
			t.Fatalf("%v\n%s", err, r.out)
		}
		if len(rep.Nodes) != 2 || !rep.InSync() || rep.Nodes[1].Node != "node-b" || fmt.Sprint(rep.Nodes[1].Capabilities.Schedulers) != "[rr wrr]" || rep.Nodes[0].LastAck == nil {
			t.Errorf("status -o json: %+v", rep)
		}
	})

	t.Run("explain", func(t *testing.T) {
		r := plugin("explain", "default/web", "--node", "node-a")
		expect(r, cli.ExitOK, []string{"Service default/web on node node-a", "ACKNOWLEDGED", "-> 10.244.1.5:8080", "local", "-> 10.244.2.5:8080", "remote"}, nil)
		r = plugin("explain", "default/web", "--node", "node-b", "-o", "yaml")
		expect(r, cli.ExitOK, []string{"acknowledgement: ACKNOWLEDGED", "node: node-b", "service: default/web"}, nil)
		var e map[string]any
		if err := yaml.Unmarshal([]byte(r.out), &e); err != nil || e["version"] != e["acknowledgedVersion"] || e["version"] == "" {
			t.Errorf("explain -o yaml: %v %v", e, err)
		}
		r = plugin("explain", "default/web")
		expect(r, cli.ExitOK, []string{"NODE", "node-a", "node-b"}, nil)
		if got := column(r.out, 0, 1); got != "node-a ACKNOWLEDGED,node-b ACKNOWLEDGED" {
			t.Errorf("want both nodes acknowledged; got %q:\n%s", got, r.out)
		}
		expect(plugin("explain", "default/nope", "--node", "node-a"), cli.ExitNotFound, nil, []string{"nope"})
		expect(plugin("explain", "default/web", "--node", "node-z"), cli.ExitNotFound, nil, []string{"node-z"})
	})

	t.Run("snapshot", func(t *testing.T) {
		r := plugin("snapshot", "node-a")
		expect(r, cli.ExitOK, []string{"Node node-a, system version", "default/web", "service"}, nil)
		r = plugin("snapshot", "node-a", "-o", "json")
		expect(r, cli.ExitOK, nil, nil)
		var snap struct {
			NodeName  string
			Resources []struct {
				Name, Version string
				Service       *struct{ Namespace, Name string }
			}
		}
		if err := json.Unmarshal([]byte(r.out), &snap); err != nil {
			t.Fatalf("%v\n%s", err, r.out)
		}
		desired, _, _ := replica.Store.List("node-a")
		if snap.NodeName != "node-a" || len(snap.Resources) != len(desired) {
			t.Errorf("snapshot -o json has %d resources, the store %d:\n%s", len(snap.Resources), len(desired), r.out)
		}
		expect(plugin("snapshot", "node-z", "-o", "yaml"), cli.ExitNotFound, nil, []string{"node-z"})
	})

	t.Run("rollout", func(t *testing.T) {
		expect(plugin("rollout", "status", "nope"), cli.ExitNotFound, nil, []string{"nope"})
		createRollout(t, ctx, dyn, "to-wrr", "wrr", nil)
		// The control plane answers from its informer, which sees the new
		// rollout a moment after the API server (a CI run of 2026-12-07
		// asked first and got NotFound).
		eventually(t, converge, func() string {
			if r := plugin("rollout", "status", "to-wrr"); r.code == cli.ExitNotFound {
				return fmt.Sprintf("not observed yet: %s", r.err)
			}
			return ""
		})
		// --watch prints every change until the rollout ends.
		r := plugin("rollout", "status", "to-wrr", "--watch", "--interval", "100ms")
		expect(r, cli.ExitOK, []string{"SchedulerRollout to-wrr: scheduler wrr, phase Succeeded", "Services: default/web"}, nil)
		last := r.out[strings.LastIndex(r.out, "SchedulerRollout to-wrr"):]
		for _, n := range []string{"node-a", "node-b"} {
			if !strings.Contains(last, n+"  UPDATED  yes") {
				t.Errorf("%s not UPDATED in the last state:\n%s", n, last)
			}
		}
		r = plugin("rollout", "status", "to-wrr", "-o", "json")
		expect(r, cli.ExitOK, []string{`"phase": "Succeeded"`, `"ROLLOUT_NODE_STATE_UPDATED"`}, nil)
	})

	t.Run("not in sync", func(t *testing.T) {
		pinned := clusterIPService("default", "pinned", 81)
		pinned.Annotations = map[string]string{"scheduler.vsplane.io/name": "mh"}
		mustCreateService(t, ctx, kube, pinned)
		eventually(t, converge, func() string {
			if r := plugin("status"); r.code != cli.ExitNotInSync || !strings.Contains(r.out, "NACKED 1") {
				return fmt.Sprintf("exit %d:\n%s%s", r.code, r.out, r.err)
			}
			return ""
		})
		expect(plugin("explain", "default/pinned", "--node", "node-b"), cli.ExitNotInSync, []string{"NACKED", "NACK:", "not offered by this kernel"}, nil)
		expect(plugin("explain", "default/pinned", "--node", "node-a"), cli.ExitOK, []string{"ACKNOWLEDGED"}, nil)
		r := plugin("status", "-o", "json")
		var rep cli.StatusReport
		if err := json.Unmarshal([]byte(r.out), &rep); err != nil || r.code != cli.ExitNotInSync || rep.InSync() || len(rep.Nodes[1].Nacked) != 1 {
			t.Errorf("status -o json: exit %d %v %+v", r.code, err, rep)
		}
	})

	t.Run("refused", func(t *testing.T) {
		expect(plugin("status", "--token", stranger), cli.ExitDenied, nil, []string{"vsplane-inspector"})
		expect(plugin("status", "--token", "not-a-token"), cli.ExitDenied, nil, []string{"Unauthenticated"})
		expect(plugin("status", "--kubeconfig", certOnly), cli.ExitError, nil, []string{"client certificates cannot be forwarded", "--token"})
		// With --token, a client-certificate kubeconfig works; with --token,
		// --certificate-authority and --address, no kubeconfig is read.
		expect(plugin("status", "--kubeconfig", certOnly, "--token", operator), cli.ExitNotInSync, []string{"node-a"}, nil)
		expect(plugin("status", "--kubeconfig", filepath.Join(dir, "absent"), "--token", operator, "--certificate-authority", files.CA),
			cli.ExitNotInSync, []string{"node-a"}, nil)
		other, err := testpki.NewCA("other")
		if err != nil {
			t.Fatal(err)
		}
		otherFiles, err := other.WriteServer(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		expect(plugin("status", "--certificate-authority", otherFiles.CA), cli.ExitError, nil, []string{"certificate signed by unknown authority"})
		expect(plugin("status", "--tls-server-name", "elsewhere.example"), cli.ExitError, nil, []string{"elsewhere.example"})
	})
}

// column returns, for each line of a table but the header, its node (field
// 0) and the column starting at field from: "node-a IN SYNC,node-b ...".
func column(table string, node, from int) string {
	var rows []string
	for _, l := range strings.Split(strings.TrimSpace(table), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) <= from {
			rows = append(rows, l)
			continue
		}
		v := f[from]
		if v == "IN" && len(f) > from+1 { // "IN SYNC" is two fields
			v += " " + f[from+1]
		}
		rows = append(rows, f[node]+" "+v)
	}
	return strings.Join(rows, ",")
}
