package realnodes

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Images of the test bed (scripts/images -testbed), under upstream's names.
const (
	agnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	servePort    = 9376 // agnhost serve-hostname's
)

// namespace creates a namespace for one test, deleted at its end.
func namespace(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := rc.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rc.Kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// serveHostname deploys replicas of agnhost serve-hostname (raw TCP and UDP
// on 9376: each answer is the Pod's name) labelled app=name, spread one per
// node, and waits until all are ready.
func serveHostname(t *testing.T, ctx context.Context, ns, name string, replicas int32, change ...func(*corev1.PodSpec)) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To(int64(1)),
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
						WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}},
					Containers: []corev1.Container{{
						Name: "serve", Image: agnhostImage,
						Args:  []string{"serve-hostname", "--tcp", "--udp", "--http=false", fmt.Sprintf("--port=%d", servePort)},
						Ports: []corev1.ContainerPort{{ContainerPort: servePort, Protocol: corev1.ProtocolTCP}, {ContainerPort: servePort, Protocol: corev1.ProtocolUDP}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(servePort)}},
							PeriodSeconds: 1},
					}},
				},
			},
		},
	}
	for _, c := range change {
		c(&d.Spec.Template.Spec)
	}
	d, err := rc.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, ctx, "-n", ns, "rollout", "status", "deployment/"+name, "--timeout=4m")
	return d
}

// service creates Service name selecting app=name (serveHostname's Pods)
// with one port 9376 per protocol given.
func service(t *testing.T, ctx context.Context, ns, name string, typ corev1.ServiceType, protos ...corev1.Protocol) *corev1.Service {
	t.Helper()
	return createService(t, ctx, serviceObject(ns, name, typ, protos...))
}

// serviceObject is the Service service creates, for a caller to change
// before createService.
func serviceObject(ns, name string, typ corev1.ServiceType, protos ...corev1.Protocol) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": name}},
	}
	for _, p := range protos {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: strings.ToLower(string(p)), Protocol: p,
			Port: servePort, TargetPort: intstr.FromInt32(servePort)})
	}
	return svc
}

func createService(t *testing.T, ctx context.Context, svc *corev1.Service) *corev1.Service {
	t.Helper()
	svc, err := rc.Kube.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// readyEndpoints waits until the Service's EndpointSlices (written by the
// EndpointSlice controller) list exactly the ready Pods wantPods, and
// returns when they do.
func readyEndpoints(t *testing.T, ctx context.Context, ns, svc string, wantPods ...string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var got []string
	for time.Now().Before(deadline) {
		slices, err := rc.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready && e.TargetRef != nil {
					got = append(got, e.TargetRef.Name)
				}
			}
		}
		if sameSet(got, wantPods) {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("EndpointSlices of %s/%s list %v, want %v", ns, svc, got, wantPods)
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		if m[x] == 0 {
			return false
		}
		m[x]--
	}
	return true
}

// podsOf lists the running Pods labelled app=app, by name, with their nodes.
func podsOf(t *testing.T, ctx context.Context, ns, app string) map[string]string {
	t.Helper()
	pods, err := rc.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out[p.Name] = p.Spec.NodeName
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// clientPod runs agnhost (pause) on node and waits until it is ready: the
// in-cluster client whose commands kubectl exec runs.
func clientPod(t *testing.T, ctx context.Context, ns, name, node string) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers:                    []corev1.Container{{Name: "client", Image: agnhostImage, Args: []string{"pause"}}},
		},
	}
	if _, err := rc.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubectl(t, ctx, "-n", ns, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=3m")
}

// kubectl runs the cluster's kubectl and fails the test on error.
func kubectl(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := rc.Kubectl(ctx, nil, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, rc.PodsSummary(ctx))
	}
	return out
}

// execIn runs a shell command in the Pod (kubectl exec, through the
// apiserver's egress proxy and the kubelet) and returns its output.
func execIn(ctx context.Context, ns, pod, script string) (string, error) {
	return rc.Kubectl(ctx, nil, "-n", ns, "exec", pod, "--", "sh", "-c", script)
}

// nodePort returns the Service's NodePort for protocol p.
func nodePort(t *testing.T, svc *corev1.Service, p corev1.Protocol) int32 {
	t.Helper()
	for _, sp := range svc.Spec.Ports {
		if sp.Protocol == p {
			return sp.NodePort
		}
	}
	t.Fatalf("Service %s has no %s port", svc.Name, p)
	return 0
}
