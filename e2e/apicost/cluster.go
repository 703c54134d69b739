package apicost

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// Names and labels of the objects the benchmark writes.
const (
	Namespace = "apicost"
	// labelRev is the Service label each Service update changes (the
	// control plane's model keeps Service labels, so it sees the change).
	labelRev   = "apicost.vsplane.io/rev"
	targetPort = 8080
	zone       = "zone-a"
)

// world is the cluster: S ClusterIP Services with one EndpointSlice of E
// ready endpoints each, shaped like the EndpointSlice controller writes
// them (Pod targetRef, node, zone, trigger-time annotation), and N Nodes.
type world struct {
	size  Size
	kube  kubernetes.Interface
	nodes []string

	mu     sync.Mutex
	svcs   []*service
	nextIP int
	round  int
}

type service struct {
	name string
	// svc and slice are the objects as the API server last returned them;
	// ips are the slice's endpoint addresses.
	svc   *corev1.Service
	slice *discoveryv1.EndpointSlice
	ips   []string
}

func newWorld(size Size, kube kubernetes.Interface) *world {
	w := &world{size: size, kube: kube}
	for i := range size.Watchers {
		w.nodes = append(w.nodes, fmt.Sprintf("node-%04d", i))
	}
	for i := range size.Services {
		w.svcs = append(w.svcs, &service{name: fmt.Sprintf("svc-%05d", i)})
	}
	return w
}

// Addresses: endpoints 198.19.0-249.1-254 (63,500, reused after a wrap but
// never twice within one slice), nodes 198.19.250-255.x.
const endpointPool = 250 * 254

func endpointIP(c int) string {
	c %= endpointPool
	return fmt.Sprintf("198.19.%d.%d", c/254, c%254+1)
}

func nodeIP(i int) string { return fmt.Sprintf("198.19.%d.%d", 250+i/254, i%254+1) }

// create writes the namespace, Nodes, Services and slices with `writers`
// concurrent writers and returns the number of objects.
func (w *world) create(ctx context.Context, writers int) (int, error) {
	if _, err := w.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("apicost: namespace: %w", err)
	}
	for i, s := range w.svcs {
		for j := range w.size.Endpoints {
			s.ips = append(s.ips, endpointIP(i*w.size.Endpoints+j))
		}
	}
	w.nextIP = w.size.Services * w.size.Endpoints
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(writers)
	for i, n := range w.nodes {
		g.Go(func() error {
			if _, err := w.kube.CoreV1().Nodes().Create(gctx, nodeObject(n, nodeIP(i)), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("apicost: node %s: %w", n, err)
			}
			return nil
		})
	}
	for i, s := range w.svcs {
		g.Go(func() error {
			svc, err := w.kube.CoreV1().Services(Namespace).Create(gctx, serviceObject(s.name), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("apicost: service %s: %w", s.name, err)
			}
			es, err := w.kube.DiscoveryV1().EndpointSlices(Namespace).Create(gctx, w.sliceObject(i), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("apicost: EndpointSlice of %s: %w", s.name, err)
			}
			w.mu.Lock()
			s.svc, s.slice = svc, es
			w.mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return 1 + len(w.nodes) + 2*len(w.svcs), nil
}

// want is the state after a churn: for every object it changed, its final
// resourceVersion and content. Every scenario must converge to it.
type want struct {
	// sliceRV and serviceRV: namespace/name -> resourceVersion.
	sliceRV, serviceRV map[string]string
	// sliceIPs: slice name -> endpoint addresses (in order).
	sliceIPs map[string][]string
	// serviceRev: service name -> the labelRev value.
	serviceRev map[string]string
	// sliceUpdates and serviceUpdates: the number of writes of each.
	sliceUpdates, serviceUpdates int
}

// churn writes k EndpointSlice updates (update u replaces endpoint u mod E
// of slice u mod S with a fresh address) and m Service updates (a new
// labelRev on Service u*S/m), with `writers` concurrent writers; each
// object is written by one writer, in order.
func (w *world) churn(ctx context.Context, k, m, writers int) (*want, error) {
	w.mu.Lock()
	w.round++
	round := w.round
	w.mu.Unlock()
	wt := &want{sliceRV: map[string]string{}, serviceRV: map[string]string{}, sliceIPs: map[string][]string{},
		serviceRev: map[string]string{}, sliceUpdates: k, serviceUpdates: m}
	var wmu sync.Mutex
	S := len(w.svcs)
	g, gctx := errgroup.WithContext(ctx)
	for wr := range writers {
		g.Go(func() error {
			for u := range k {
				i, j := u%S, u%w.size.Endpoints
				if i%writers != wr {
					continue // another writer's slice
				}
				es, err := w.replace(gctx, i, j, round)
				if err != nil {
					return err
				}
				wmu.Lock()
				wt.sliceRV[Namespace+"/"+es.Name] = es.ResourceVersion
				wt.sliceIPs[es.Name] = sliceIPs(es)
				wmu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for u := range m {
		i := u * S / m
		svc, err := w.relabel(ctx, i, strconv.Itoa(round))
		if err != nil {
			return nil, err
		}
		wt.serviceRV[Namespace+"/"+svc.Name] = svc.ResourceVersion
		wt.serviceRev[svc.Name] = svc.Labels[labelRev]
	}
	return wt, nil
}

// replace writes slice i with endpoint j replaced by a fresh address.
func (w *world) replace(ctx context.Context, i, j, round int) (*discoveryv1.EndpointSlice, error) {
	w.mu.Lock()
	s := w.svcs[i]
	ip := w.freshIP(s)
	es := s.slice.DeepCopy()
	w.mu.Unlock()
	es.Endpoints[j].Addresses = []string{ip}
	es.Endpoints[j].TargetRef.Name = fmt.Sprintf("%s-r%d-%d", s.name, round, j)
	es.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().UTC().Format(time.RFC3339Nano)
	out, err := w.kube.DiscoveryV1().EndpointSlices(Namespace).Update(ctx, es, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("apicost: update EndpointSlice of %s: %w", s.name, err)
	}
	w.mu.Lock()
	s.slice, s.ips[j] = out, ip
	w.mu.Unlock()
	return out, nil
}

// freshIP returns an endpoint address s does not use now (w.mu held).
func (w *world) freshIP(s *service) string {
	for {
		ip := endpointIP(w.nextIP)
		w.nextIP++
		if !slices.Contains(s.ips, ip) {
			return ip
		}
	}
}

// relabel sets Service i's labelRev to rev.
func (w *world) relabel(ctx context.Context, i int, rev string) (*corev1.Service, error) {
	w.mu.Lock()
	s := w.svcs[i]
	svc := s.svc.DeepCopy()
	w.mu.Unlock()
	if svc.Labels == nil {
		svc.Labels = map[string]string{}
	}
	svc.Labels[labelRev] = rev
	out, err := w.kube.CoreV1().Services(Namespace).Update(ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("apicost: update Service %s: %w", s.name, err)
	}
	w.mu.Lock()
	s.svc = out
	w.mu.Unlock()
	return out, nil
}

func sliceIPs(es *discoveryv1.EndpointSlice) []string {
	out := make([]string, 0, len(es.Endpoints))
	for _, ep := range es.Endpoints {
		if len(ep.Addresses) > 0 {
			out = append(out, ep.Addresses[0])
		}
	}
	return out
}

func nodeObject(name, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelTopologyZone: zone, corev1.LabelHostname: name, corev1.LabelOSStable: "linux"}},
		Spec: corev1.NodeSpec{ProviderID: "apicost://" + name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}},
	}
}

func serviceObject(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(targetPort)}}},
	}
}

// sliceObject is slice i as the EndpointSlice controller would write it.
func (w *world) sliceObject(i int) *discoveryv1.EndpointSlice {
	s := w.svcs[i]
	name, port, proto := "http", int32(targetPort), corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.name + "-abcde",
			Labels:      map[string]string{discoveryv1.LabelServiceName: s.name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for j, ip := range s.ips {
		node, z := w.nodes[(i*w.size.Endpoints+j)%len(w.nodes)], zone
		t := true
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t, Terminating: new(bool)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: Namespace, Name: fmt.Sprintf("%s-%d", s.name, j),
				UID: types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i*w.size.Endpoints+j))},
			NodeName: &node,
			Zone:     &z,
		})
	}
	return es
}
