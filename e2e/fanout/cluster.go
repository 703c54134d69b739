package fanout

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sync/errgroup"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/internal/wire"
)

// Names of the objects the benchmark creates.
const (
	Namespace       = "fanout"
	SystemNamespace = "vsplane-system"
	AgentAccount    = "vsplane-agent"
	CPAccount       = "vsplane-controlplane"
	servicePort     = 80
	targetPort      = 8080
	tokenSeconds    = 24 * 3600
)

// world is the cluster the benchmark writes and what every node must end up
// with: S ClusterIP Services with one EndpointSlice of E ready endpoints
// each (endpoint j of Service i on node (i*E+j) mod N), N Nodes, and one
// agent Pod and bound token per node.
type world struct {
	size  Size
	kube  kubernetes.Interface
	nodes []string
	svcs  []*service
	// byResource maps "service/<ns>/<name>" to the index in svcs.
	byResource map[string]int

	mu     sync.Mutex
	nextIP int
}

type service struct {
	name      string
	clusterIP string
	// slice is the current EndpointSlice as the API server returned it;
	// ips its endpoint addresses. Written by one goroutine at a time.
	slice *discoveryv1.EndpointSlice
	ips   []string
}

func newWorld(size Size, kube kubernetes.Interface) *world {
	w := &world{size: size, kube: kube, byResource: map[string]int{}}
	for i := range size.Nodes {
		w.nodes = append(w.nodes, fmt.Sprintf("node-%04d", i))
	}
	for i := range size.Services {
		s := &service{name: fmt.Sprintf("svc-%05d", i)}
		w.svcs = append(w.svcs, s)
		w.byResource[s.resource()] = i
	}
	return w
}

func (s *service) resource() string { return wire.ServiceResourcePrefix + Namespace + "/" + s.name }

// Endpoint addresses: 198.19.0-249.1-254 (63,500), reused after a wrap but
// never twice within one Service. Node addresses: 198.19.250-255.x.
const endpointPool = 250 * 254

func endpointIP(c int) string {
	c %= endpointPool
	return fmt.Sprintf("198.19.%d.%d", c/254, c%254+1)
}

func nodeIP(i int) string { return fmt.Sprintf("198.19.%d.%d", 250+i/254, i%254+1) }

// newIP returns an endpoint address that Service i does not use now.
func (w *world) newIP(i int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	used := map[string]bool{}
	for _, ip := range w.svcs[i].ips {
		used[ip] = true
	}
	for {
		ip := endpointIP(w.nextIP)
		w.nextIP++
		if !used[ip] {
			return ip
		}
	}
}

// create makes every object with `workers` concurrent writers; it returns
// the number of objects created.
func (w *world) create(ctx context.Context, workers int, tokenDir string) (tokenFiles []string, objects int, err error) {
	k := w.kube
	for _, ns := range []string{Namespace, SystemNamespace} {
		if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return nil, 0, fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	for _, sa := range []string{AgentAccount, CPAccount} {
		if _, err := k.CoreV1().ServiceAccounts(SystemNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			return nil, 0, fmt.Errorf("ServiceAccount %s: %w", sa, err)
		}
	}
	objects = 4
	// Endpoint addresses are assigned in order before anything runs.
	for i, s := range w.svcs {
		for j := range w.size.Endpoints {
			s.ips = append(s.ips, endpointIP(i*w.size.Endpoints+j))
		}
	}
	w.nextIP = w.size.Services * w.size.Endpoints
	tokenFiles = make([]string, len(w.nodes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i, n := range w.nodes {
		g.Go(func() error {
			if _, err := k.CoreV1().Nodes().Create(gctx, nodeObject(n, nodeIP(i)), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("node %s: %w", n, err)
			}
			pod, err := k.CoreV1().Pods(SystemNamespace).Create(gctx, agentPod(n), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("agent pod of %s: %w", n, err)
			}
			tok, err := w.token(gctx, AgentAccount, []string{auth.AgentAudience}, pod)
			if err != nil {
				return err
			}
			tokenFiles[i] = filepath.Join(tokenDir, n+".token")
			return os.WriteFile(tokenFiles[i], []byte(tok), 0o600)
		})
	}
	for i, s := range w.svcs {
		g.Go(func() error {
			created, err := k.CoreV1().Services(Namespace).Create(gctx, serviceObject(s.name), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("service %s: %w", s.name, err)
			}
			s.clusterIP = created.Spec.ClusterIP
			es, err := k.DiscoveryV1().EndpointSlices(Namespace).Create(gctx, w.sliceObject(i), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("EndpointSlice of %s: %w", s.name, err)
			}
			s.slice = es
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, err
	}
	objects += 3*len(w.nodes) + 2*len(w.svcs) // nodes, pods, tokens; services, slices
	return tokenFiles, objects, nil
}

// replace writes Service i's slice with endpoint j replaced by ip (same
// node) and returns when the API server answered.
func (w *world) replace(ctx context.Context, i, j int, ip string) error {
	s := w.svcs[i]
	es := s.slice.DeepCopy()
	es.Endpoints[j].Addresses = []string{ip}
	out, err := w.kube.DiscoveryV1().EndpointSlices(Namespace).Update(ctx, es, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update EndpointSlice of %s: %w", s.name, err)
	}
	w.mu.Lock()
	s.slice, s.ips[j] = out, ip
	w.mu.Unlock()
	return nil
}

// token requests a token of ServiceAccount sa (audiences nil: the API
// server's), bound to pod if set.
func (w *world) token(ctx context.Context, sa string, audiences []string, pod *corev1.Pod) (string, error) {
	exp := int64(tokenSeconds)
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &exp}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	r, err := w.kube.CoreV1().ServiceAccounts(SystemNamespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s: %w", sa, err)
	}
	return r.Status.Token, nil
}

func nodeObject(name, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}},
	}
}

// agentPod is the Pod node's agent "runs in": no kubelet here, it only
// anchors the agent's bound token to the node (as e2e/cluster does).
func agentPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: "vsplane-agent-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: AgentAccount,
			Containers: []corev1.Container{{Name: "agent", Image: "vsplane/vsplane-agent"}}},
	}
}

func serviceObject(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{
			Name: "http", Port: servicePort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(targetPort)}}},
	}
}

func (w *world) sliceObject(i int) *discoveryv1.EndpointSlice {
	s := w.svcs[i]
	name, port, proto := "http", int32(targetPort), corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.name + "-0",
			Labels: map[string]string{discoveryv1.LabelServiceName: s.name, discoveryv1.LabelManagedBy: "vsplane-fanout"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	ready := true
	for j, ip := range s.ips {
		node := w.nodes[(i*w.size.Endpoints+j)%len(w.nodes)]
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return es
}
