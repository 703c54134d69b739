package images

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/testpki"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestControlPlaneImage runs the control-plane image's own root filesystem
// as a runtime would: chrooted into it, as the image's user (65532), with
// the image's environment, the deployment's flags and its mounted files
// (TLS, kubeconfig, token) placed where deploy/base mounts them, against
// the real kube-apiserver. It must become ready (/readyz 200) and serve a
// node's snapshot over TLS with token authentication.
func TestControlPlaneImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test chroots into the image and drops to uid 65532: it needs root (CI and make test run as root)")
	}
	dir, imgs := built(t)
	rootfs, l := unpack(t, dir, imgs["vsplane-controlplane"])
	cfg := l.Config.Config
	if cfg.User != "65532:65532" || !slices.Equal(cfg.Entrypoint, []string{"/vsplane-controlplane"}) {
		t.Fatalf("image config: user %q, entrypoint %q", cfg.User, cfg.Entrypoint)
	}
	// Nothing but the binary and the user database: no shell, no libc.
	for _, absent := range []string{"bin/sh", "usr/bin", "lib", "usr/lib"} {
		if _, err := os.Lstat(filepath.Join(rootfs, absent)); err == nil {
			t.Errorf("the control-plane image has /%s", absent)
		}
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "etc", "passwd")); err != nil || !strings.Contains(string(b), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd lacks nonroot 65532: %q %v", b, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := kubeenv.StartForTest(t)
	kube, err := kubernetes.NewForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := env.InstallCRDs(ctx, filepath.Join(repoRoot(t), "deploy", "crds")); err != nil {
		t.Fatal(err)
	}
	const ns, sa = "vsplane-system", "vsplane-controlplane"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The files the Deployment mounts, at its paths, readable by 65532 only.
	ca, err := testpki.NewCA("vsplane image test CA")
	if err != nil {
		t.Fatal(err)
	}
	pki, err := ca.WriteServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := os.ReadFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	mounted := map[string][]byte{
		"etc/vsplane/tls/ca.crt":                             mustRead(t, pki.CA),
		"etc/vsplane/tls/tls.crt":                            mustRead(t, pki.Cert),
		"etc/vsplane/tls/tls.key":                            mustRead(t, pki.Key),
		"etc/vsplane/kubeconfig":                             kubeconfig,
		"var/run/secrets/kubernetes.io/serviceaccount/token": []byte(tok.Status.Token),
	}
	for p, data := range mounted {
		f := filepath.Join(rootfs, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, data, 0o400); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f, 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}

	grpcPort, metricsPort := freePort(t), freePort(t)
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", grpcPort)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", metricsPort)
	// deploy/base/controlplane.yaml's flags, on loopback ports, with a kubeconfig
	// instead of the in-cluster config.
	args := []string{
		"--kubeconfig=/etc/vsplane/kubeconfig",
		"--listen=" + grpcAddr,
		"--metrics-address=" + metricsAddr,
		"--min-sync-interval=100ms",
		"--max-sync-interval=1h",
		"--agent-service-account=vsplane-system/vsplane-agent",
		"--tls-cert-file=/etc/vsplane/tls/tls.crt",
		"--tls-key-file=/etc/vsplane/tls/tls.key",
		"--tls-ca-file=/etc/vsplane/tls/ca.crt",
	}
	logFile := filepath.Join(t.TempDir(), "controlplane.log")
	lf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	// exec.Cmd resolves nothing on the host for an absolute path: the
	// kernel finds the entrypoint after the chroot, inside the image.
	cmd := exec.Command(cfg.Entrypoint[0], args...)
	cmd.Dir = "/"
	cmd.Env = cfg.Env
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     rootfs,
		Credential: &syscall.Credential{Uid: 65532, Gid: 65532, Groups: []uint32{}},
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the image's /vsplane-controlplane chrooted as 65532: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("control-plane log tail:\n%s", tail(string(b), 40))
		}
	})

	// Where the process runs: inside the image, as 65532.
	if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", cmd.Process.Pid)); err != nil || root != rootfs {
		t.Errorf("process root %q (%v), want %s", root, err, rootfs)
	}
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)); err != nil || !strings.Contains(string(status), "\nUid:\t65532\t65532\t65532\t65532\n") {
		t.Errorf("process does not run as 65532: %v\n%s", err, status)
	}

	start := time.Now()
	await(t, ctx, done, 2*time.Minute, func() error {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	t.Logf("/readyz 200 after %v", time.Since(start).Round(time.Millisecond))

	// A node and a Service with one endpoint: the node's snapshot carries it.
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.19.0.11"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"198.19.1.11"}, NodeName: ptr.To("node1"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cli, err := tlsfiles.NewClient(pki.CA, wire.DefaultServerName)
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(tok.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())),
		grpc.WithPerRPCCredentials(bearer.File{Path: tokFile}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	insp := vsplanev1.NewInspectServiceClient(conn)
	name := wire.ServiceResource("default", "web")
	var snapshot string
	await(t, ctx, done, time.Minute, func() error {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		resp, err := insp.GetNodeSnapshot(cctx, &vsplanev1.GetNodeSnapshotRequest{NodeName: "node1"})
		if err != nil {
			return err
		}
		for _, r := range resp.GetResources() {
			if r.GetName() == name {
				body := protojson.Format(r)
				if !strings.Contains(body, svc.Spec.ClusterIP) || !strings.Contains(body, "198.19.1.11") {
					return fmt.Errorf("%s lacks the ClusterIP %s or the endpoint:\n%s", name, svc.Spec.ClusterIP, body)
				}
				snapshot = body
				return nil
			}
		}
		return fmt.Errorf("node1's snapshot has no %s yet (%d resources)", name, len(resp.GetResources()))
	})
	t.Logf("node1's snapshot serves %s:\n%s", name, tail(snapshot, 12))
}

func mustRead(t *testing.T, f string) []byte {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// await polls cond every 200ms until it succeeds, the process exits (done
// closed) or timeout passes; the last error fails the test.
func await(t *testing.T, ctx context.Context, done <-chan struct{}, timeout time.Duration, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("the control plane exited: last check: %v", err)
		case <-ctx.Done():
			t.Fatalf("not within %v: %v", timeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
