package kubeenv_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/vsplane/vsplane/e2e/kubeenv"
)

const waitFor = 30 * time.Second

// recorder collects informer events as "<verb> <kind> <name>" strings.
type recorder struct {
	mu     sync.Mutex
	events []string
	notify chan struct{}
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

func (r *recorder) add(ev string) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *recorder) handler(kind string) cache.ResourceEventHandler {
	name := func(obj any) string {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return "?"
		}
		return m.GetName()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.add("add " + kind + " " + name(obj)) },
		UpdateFunc: func(_, obj any) { r.add("update " + kind + " " + name(obj)) },
		DeleteFunc: func(obj any) { r.add("delete " + kind + " " + name(obj)) },
	}
}

// await blocks until want was recorded, failing the test after waitFor.
func (r *recorder) await(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		r.mu.Lock()
		got := append([]string(nil), r.events...)
		r.mu.Unlock()
		for _, ev := range got {
			if ev == want {
				return
			}
		}
		select {
		case <-r.notify:
		case <-deadline:
			t.Fatalf("event %q not seen within %v; got %q", want, waitFor, got)
		}
	}
}

func inServiceCIDR(t *testing.T, ip string) {
	t.Helper()
	_, cidr, _ := net.ParseCIDR(kubeenv.DefaultServiceCIDR)
	if p := net.ParseIP(ip); p == nil || !cidr.Contains(p) {
		t.Fatalf("ClusterIP %q not in %s", ip, cidr)
	}
}

// TestServiceAndEndpointSliceEvents drives the objects vsplane consumes
// through a real apiserver and checks an informer sees every change.
func TestServiceAndEndpointSliceEvents(t *testing.T) {
	env := kubeenv.StartForTest(t)
	t.Logf("startup time: %v", env.StartupDuration)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}

	const ns = "kubeenv-test"
	if _, err := cs.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}

	rec := newRecorder()
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	if _, err := f.Core().V1().Services().Informer().AddEventHandler(rec.handler("service")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Discovery().V1().EndpointSlices().Informer().AddEventHandler(rec.handler("slice")); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer func() { close(stop); f.Shutdown() }()
	f.Start(stop)
	syncCtx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	for typ, ok := range f.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			t.Fatalf("informer cache for %v did not sync", typ)
		}
	}

	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service: %v", err)
	}
	inServiceCIDR(t, svc.Spec.ClusterIP)
	t.Logf("service web got ClusterIP %s", svc.Spec.ClusterIP)

	ep := func(ip string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}
	}
	slice, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "web-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{ep("198.19.1.10")},
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080),
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create endpointslice: %v", err)
	}
	rec.await(t, "add service web")
	rec.await(t, "add slice web-1")

	slice.Endpoints = append(slice.Endpoints, ep("198.19.2.10"))
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update endpointslice: %v", err)
	}
	rec.await(t, "update slice web-1")
	// The informer's cache must reflect the update, not just fire an event.
	got, err := f.Discovery().V1().EndpointSlices().Lister().EndpointSlices(ns).Get("web-1")
	if err != nil || len(got.Endpoints) != 2 {
		t.Fatalf("lister after update: %v, %+v", err, got)
	}

	if err := cs.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete endpointslice: %v", err)
	}
	if err := cs.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete service: %v", err)
	}
	rec.await(t, "delete slice web-1")
	rec.await(t, "delete service web")

	// The apiserver's own "kubernetes" Service takes the first address of the range.
	deadline := time.Now().Add(waitFor)
	for {
		k, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err == nil {
			if k.Spec.ClusterIP != "198.18.0.1" {
				t.Fatalf("kubernetes Service ClusterIP = %s, want 198.18.0.1", k.Spec.ClusterIP)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("default/kubernetes Service not created within %v: %v", waitFor, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKubeconfigAndStop checks the written kubeconfig works on its own and
// that Stop releases the port and the directory, idempotently.
func TestKubeconfigAndStop(t *testing.T) {
	env, err := kubeenv.Start(t.Context(), kubeenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	t.Logf("startup time: %v", env.StartupDuration)

	cfg, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version via kubeconfig: %v", err)
	}
	if !strings.HasPrefix(v.GitVersion, "v1.37.") {
		t.Fatalf("server version %q, want v1.37.x (build.sh stamps it)", v.GitVersion)
	}

	u, err := url.Parse(env.Host)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := env.Stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if _, err := os.Stat(env.Dir); !os.IsNotExist(err) {
		t.Fatalf("env dir %s still present after Stop (stat err %v)", env.Dir, err)
	}
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		c.Close()
		t.Fatalf("apiserver port %s still accepting after Stop", u.Host)
	}
}

// TestMissingBinaries: no binaries must be a loud error naming build.sh,
// never a skip.
func TestMissingBinaries(t *testing.T) {
	empty := t.TempDir()
	_, err := kubeenv.Start(t.Context(), kubeenv.Options{BinDir: empty})
	if err == nil || !strings.Contains(err.Error(), "scripts/kube/build.sh") {
		t.Fatalf("Start with empty BinDir: err = %v, want one mentioning scripts/kube/build.sh", err)
	}
	t.Setenv(kubeenv.EnvBinDir, empty)
	if _, err := kubeenv.FindBinDir(""); err == nil || !strings.Contains(err.Error(), kubeenv.EnvBinDir) {
		t.Fatalf("FindBinDir with empty %s: err = %v", kubeenv.EnvBinDir, err)
	}
}

func TestBadServiceCIDR(t *testing.T) {
	dir, err := kubeenv.FindBinDir("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubeenv.Start(t.Context(), kubeenv.Options{BinDir: dir, ServiceCIDR: "nope"}); err == nil {
		t.Fatal("Start accepted ServiceCIDR \"nope\"")
	}
}
