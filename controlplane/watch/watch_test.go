package watch_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/vsplane/vsplane/controlplane/engine"
	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/watch"
)

func service(name, ip string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
}

func slice(name, svc string, trigger string, addrs ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	if trigger != "" {
		es.Annotations = map[string]string{model.AnnotationTriggerTime: trigger}
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: ptr.To("n1")})
	}
	return es
}

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.19.0.11"}}}}
}

// eventually polls cond until it holds (bounded), without fixed sleeps in the
// assertion path.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestWatchEndToEnd(t *testing.T) {
	client := fake.NewClientset(
		node("n1"),
		service("web", "198.18.0.10", nil),
		service("other-proxy", "198.18.0.11", map[string]string{model.LabelServiceProxyName: "x"}),
		slice("web-1", "web", "2026-01-02T03:04:05Z", "198.19.1.5"),
	)
	st := snapshot.NewStore()
	eng, err := engine.New(engine.Config{}, st, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := watch.New(client, eng, watch.Options{MinInterval: time.Millisecond}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	eventually(t, "web on n1", func() bool { _, ok := st.Get("n1", "service/ns/web"); return ok })
	if !w.Synced() {
		t.Error("not synced after first batch")
	}
	r, _ := st.Get("n1", "service/ns/web")
	if rs := r.GetService().VirtualServers[0].RealServers; len(rs) != 1 || !rs[0].Local {
		t.Errorf("real servers %v", rs)
	}
	// Trigger time from the slice annotation... but n1 is new in this batch,
	// so the node's time counts; check the annotation on a later change.
	if _, ok := st.Get("n1", "service/ns/other-proxy"); ok {
		t.Error("service of another proxy programmed")
	}

	// Endpoint change with a trigger-time annotation.
	es := slice("web-1", "web", "2026-01-02T03:04:06Z", "198.19.1.5", "198.19.1.6")
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "two real servers", func() bool {
		r, _ := st.Get("n1", "service/ns/web")
		return len(r.GetService().GetVirtualServers()[0].GetRealServers()) == 2
	})
	if found, _, _ := st.Lookup("n1", []string{"service/ns/web"}); len(found) != 1 || !found[0].Trigger.Equal(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)) {
		t.Errorf("trigger of %v, want %v", found, time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC))
	}

	// A headless Service is not proxied; a new node gets everything; deleting a Service removes it.
	headless := service("hl", "None", nil)
	if _, err := client.CoreV1().Services("ns").Create(ctx, headless, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, node("n2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n2 has web", func() bool { _, ok := st.Get("n2", "service/ns/web"); return ok })
	if err := client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web gone", func() bool {
		_, ok1 := st.Get("n1", "service/ns/web")
		_, ok2 := st.Get("n2", "service/ns/web")
		return !ok1 && !ok2
	})
	if _, ok := st.Get("n1", "service/ns/hl"); ok {
		t.Error("headless service programmed")
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n2 forgotten", func() bool { _, _, ok := st.List("n2"); return !ok })
}
