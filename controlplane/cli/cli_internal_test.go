package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{errors.New("dial tcp: refused"), ExitError},
		{usagef("want one NODE"), ExitUsage},
		{errNotInSync, ExitNotInSync},
		{status.Error(codes.NotFound, "no SchedulerRollout"), ExitNotFound},
		{fmt.Errorf("explain a/b on node n: %w", status.Error(codes.NotFound, "no Service")), ExitNotFound},
		{status.Error(codes.Unauthenticated, "no bearer token"), ExitDenied},
		{fmt.Errorf("status of node n: %w", status.Error(codes.PermissionDenied, "vsplane-inspector")), ExitDenied},
		{status.Error(codes.Unavailable, "connection refused"), ExitError},
		{errNoToken, ExitError},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// Usage mistakes exit 2 before any connection is made (no kubeconfig is
// read: --kubeconfig names a file that does not exist).
func TestUsageExitCodes(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"status", "extra"},
		{"status", "--no-such-flag"},
		{"explain"},
		{"explain", "a/b/c"},
		{"explain", "/web"},
		{"snapshot"},
		{"rollout"},
		{"rollout", "status"},
		{"status", "-o", "xml"},
		{"snapshot", "node-a", "-o", "wide"},
	} {
		var out, errOut bytes.Buffer
		got := Main(context.Background(), append(args, "--kubeconfig", "/nonexistent/kubeconfig"), &out, &errOut)
		if got != ExitUsage {
			t.Errorf("%q: exit %d, want %d; stderr: %s", args, got, ExitUsage, errOut.String())
		}
		if errOut.Len() == 0 {
			t.Errorf("%q: nothing on stderr", args)
		}
	}
}

func TestBearerToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  rest.Config
		want string
	}{
		{"static token", rest.Config{BearerToken: "static"}, "static"},
		{"token file", rest.Config{BearerTokenFile: tokenFile}, "from-file"},
		{"exec plugin", rest.Config{ExecProvider: &clientcmdapi.ExecConfig{
			APIVersion: "client.authentication.k8s.io/v1", Command: "sh", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
			Args: []string{"-c", `echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}'`},
		}}, "from-exec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Host = "https://127.0.0.1:6443"
			got, err := BearerToken(&tc.cfg)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		cfg  rest.Config
	}{
		{"client certificate only", rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: []byte("x"), KeyData: []byte("y")}}},
		{"basic auth", rest.Config{Username: "u", Password: "p"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Host = "https://127.0.0.1:6443"
			_, err := BearerToken(&tc.cfg)
			if !errors.Is(err, errNoToken) || !strings.Contains(err.Error(), "--token") {
				t.Fatalf("got %v, want the no-token advice", err)
			}
		})
	}
}

func TestChoosePod(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "vsplane-system", Name: ServiceName},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "vsplane-controlplane"},
			Ports: []corev1.ServicePort{{Name: "metrics", Port: 18001}, {Name: PortName, Port: 18000, TargetPort: intstr.FromString("grpc")}}},
	}
	pod := func(name string, phase corev1.PodPhase, ready bool, mod ...func(*corev1.Pod)) corev1.Pod {
		cond := corev1.ConditionFalse
		if ready {
			cond = corev1.ConditionTrue
		}
		p := corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "vsplane-system", Name: name, Labels: map[string]string{"app": "vsplane-controlplane"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "cp", Ports: []corev1.ContainerPort{
				{Name: "metrics", ContainerPort: 18001}, {Name: "grpc", ContainerPort: 18100}}}}},
			Status: corev1.PodStatus{Phase: phase, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}},
		}
		for _, m := range mod {
			m(&p)
		}
		return p
	}
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }
	otherLabels := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} }
	noGRPCPort := func(p *corev1.Pod) { p.Spec.Containers[0].Ports = p.Spec.Containers[0].Ports[:1] }
	for _, tc := range []struct {
		name    string
		pods    []corev1.Pod
		want    string
		port    int32
		wantErr string
	}{
		{"the first Ready one by name", []corev1.Pod{pod("cp-b", corev1.PodRunning, true), pod("cp-a", corev1.PodRunning, true)}, "cp-a", 18100, ""},
		{"not Ready, pending, terminating and unselected skipped", []corev1.Pod{
			pod("cp-a", corev1.PodRunning, false), pod("cp-b", corev1.PodPending, false), pod("cp-c", corev1.PodRunning, true, deleting),
			pod("cp-d", corev1.PodRunning, true, otherLabels), pod("cp-e", corev1.PodRunning, true)}, "cp-e", 18100, ""},
		{"none Ready", []corev1.Pod{pod("cp-a", corev1.PodRunning, false), pod("cp-c", corev1.PodRunning, true, deleting)}, "", 0,
			"no Ready Pod behind Service vsplane-system/vsplane-controlplane: cp-a (not Ready), cp-c (terminating)"},
		{"no container port of that name", []corev1.Pod{pod("cp-a", corev1.PodRunning, true, noGRPCPort)}, "", 0, `no container port named "grpc"`},
		{"none at all", nil, "", 0, "no Pod behind Service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, port, err := choosePod(svc, tc.pods)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %s:%d, %v; want error %q", name, port, err, tc.wantErr)
				}
				return
			}
			if err != nil || name != tc.want || port != tc.port {
				t.Fatalf("got %s:%d, %v; want %s:%d", name, port, err, tc.want, tc.port)
			}
		})
	}
	// A numeric targetPort, and none (the Service port itself).
	numeric := svc.DeepCopy()
	numeric.Spec.Ports[1].TargetPort = intstr.FromInt32(18200)
	if _, port, err := choosePod(numeric, []corev1.Pod{pod("cp-a", corev1.PodRunning, true)}); err != nil || port != 18200 {
		t.Errorf("numeric targetPort: %d, %v", port, err)
	}
	numeric.Spec.Ports[1].TargetPort = intstr.IntOrString{}
	if _, port, err := choosePod(numeric, []corev1.Pod{pod("cp-a", corev1.PodRunning, true)}); err != nil || port != 18000 {
		t.Errorf("no targetPort: %d, %v", port, err)
	}
	noPort := svc.DeepCopy()
	noPort.Spec.Ports[1].Name = "other"
	if _, _, err := choosePod(noPort, nil); err == nil || !strings.Contains(err.Error(), `no port named "grpc"`) {
		t.Errorf("no grpc port: %v", err)
	}
}

// portForward reads the Service and its Pods through the API before it
// dials anything: a missing Service or no Ready Pod fails with advice.
func TestPortForwardFindsNoPod(t *testing.T) {
	ctx := context.Background()
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	kube := fake.NewClientset()
	if _, _, err := portForward(ctx, cfg, kube, DefaultNamespace, io.Discard); err == nil || !strings.Contains(err.Error(), "--address") {
		t.Fatalf("no Service: %v", err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: ServiceName},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "vsplane-controlplane"}, Ports: []corev1.ServicePort{{Name: PortName, Port: 18000}}}}
	notReady := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultNamespace, Name: "cp-0", Labels: map[string]string{"app": "vsplane-controlplane"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	kube = fake.NewClientset(svc, notReady)
	if _, _, err := portForward(ctx, cfg, kube, DefaultNamespace, io.Discard); err == nil || !strings.Contains(err.Error(), "cp-0 (not Ready)") {
		t.Fatalf("no Ready Pod: %v", err)
	}
}
