package cluster

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// Port is one Service port; the pods serve it on ServePort.
type Port struct {
	Name     string
	Port     int32
	Protocol corev1.Protocol // TCP or UDP
}

// Backend is one endpoint: a pod's address and the node it runs on.
type Backend struct {
	IP   string
	Node string
}

// BackendOf returns the Backend of the pod called name.
func (c *Cluster) BackendOf(name string) (Backend, error) {
	c.mu.Lock()
	p := c.Pods[name]
	c.mu.Unlock()
	if p == nil {
		return Backend{}, fmt.Errorf("cluster: no pod %q", name)
	}
	return Backend{IP: p.IP, Node: p.Node.Name}, nil
}

// Backends is BackendOf for several pods.
func (c *Cluster) Backends(names ...string) ([]Backend, error) {
	var out []Backend
	for _, n := range names {
		b, err := c.BackendOf(n)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// sliceName is the name of the one EndpointSlice the cluster manages per Service.
func sliceName(svc string) string { return svc + "-vsplane" }

// CreateService creates a ClusterIP Service with ports (target port
// ServePort) and its EndpointSlice with backends, and returns the allocated
// ClusterIP.
func (c *Cluster) CreateService(ctx context.Context, ns, name string, ports []Port, backends []Backend) (string, error) {
	if len(ports) == 0 {
		return "", fmt.Errorf("cluster: Service %s/%s needs at least one port", ns, name)
	}
	if err := c.ensureNamespace(ctx, ns); err != nil {
		return "", err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Port: p.Port, Protocol: p.Protocol, TargetPort: intstr.FromInt32(ServePort),
		})
	}
	created, err := c.Kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create Service %s/%s: %w", ns, name, err)
	}
	es := endpointSlice(ns, name, ports, backends)
	if _, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create EndpointSlice for %s/%s: %w", ns, name, err)
	}
	return created.Spec.ClusterIP, nil
}

// SetEndpoints replaces the Service's endpoints with backends.
func (c *Cluster) SetEndpoints(ctx context.Context, ns, name string, ports []Port, backends []Backend) error {
	cur, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, sliceName(name), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get EndpointSlice of %s/%s: %w", ns, name, err)
	}
	es := endpointSlice(ns, name, ports, backends)
	es.ResourceVersion = cur.ResourceVersion
	if _, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update EndpointSlice of %s/%s: %w", ns, name, err)
	}
	return nil
}

// DeleteService deletes the Service and its EndpointSlice.
func (c *Cluster) DeleteService(ctx context.Context, ns, name string) error {
	if err := c.Kube.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete Service %s/%s: %w", ns, name, err)
	}
	err := c.Kube.DiscoveryV1().EndpointSlices(ns).Delete(ctx, sliceName(name), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete EndpointSlice of %s/%s: %w", ns, name, err)
	}
	return nil
}

func (c *Cluster) ensureNamespace(ctx context.Context, ns string) error {
	if ns == metav1.NamespaceDefault {
		return nil // kube-apiserver creates it
	}
	_, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return nil
}

func endpointSlice(ns, svc string, ports []Port, backends []Backend) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: sliceName(svc),
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "vsplane-e2e"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range ports {
		name, port, proto := p.Name, int32(ServePort), p.Protocol
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
	}
	ready := true
	for _, b := range backends {
		e := discoveryv1.Endpoint{Addresses: []string{b.IP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
		if b.Node != "" {
			n := b.Node
			e.NodeName = &n
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

// Requests sends count requests (proto "tcp" or "udp") from the client
// namespace to addr (HOST:PORT) with e2ehelper request and returns the
// summary (answers per backend, failures) and the raw output. Failed
// requests are in the summary, not an error; the error is for a command
// that could not run or report.
func (c *Cluster) Requests(ctx context.Context, proto, addr string, count int) (wire.Summary, string, error) {
	return c.requestsFrom(ctx, c.Client, proto, addr, count, "")
}

func (c *Cluster) requestsFrom(ctx context.Context, ns *vm.Netns, proto, addr string, count int, extra string) (wire.Summary, string, error) {
	cmd := fmt.Sprintf("e2ehelper request --proto %s --addr %s --count %d --timeout 2s %s", proto, addr, count, extra)
	res, err := ns.Run(ctx, cmd)
	if err != nil {
		return wire.Summary{}, "", fmt.Errorf("run %q: %w", cmd, err)
	}
	sum, err := vm.ParseSummary(res.Stdout)
	if err != nil {
		return wire.Summary{}, res.Stdout + res.Stderr, fmt.Errorf("%q: %w (output %s)", cmd, err, strings.TrimSpace(res.Stdout+res.Stderr))
	}
	return sum, res.Stdout, nil
}

// StartRequestLoop starts count requests, one every interval, from the
// client in the background (as process name); collect the result with
// LoopResult.
func (c *Cluster) StartRequestLoop(ctx context.Context, name, proto, addr string, count int, interval string) (*vm.Proc, error) {
	return c.StartRequestLoopFrom(ctx, c.Client, name, proto, addr, count, interval, "")
}

// StartRequestLoopFrom is StartRequestLoop from any namespace (e.g. a
// client routed through another node); a non-empty stopFile (a guest path)
// ends the loop once it exists, count then being its bound.
func (c *Cluster) StartRequestLoopFrom(ctx context.Context, from *vm.Netns, name, proto, addr string, count int, interval, stopFile string) (*vm.Proc, error) {
	cmd := fmt.Sprintf("e2ehelper request --proto %s --addr %s --count %d --timeout 2s --interval %s", proto, addr, count, interval)
	if stopFile != "" {
		cmd += " --stop-file " + stopFile
	}
	return from.Start(ctx, name, cmd)
}

// LoopResult waits for a request loop started by StartRequestLoop and
// returns its summary.
func LoopResult(ctx context.Context, p *vm.Proc) (wire.Summary, string, error) {
	st, err := p.Wait(ctx)
	if err != nil {
		return wire.Summary{}, "", err
	}
	if st.Running || st.TimedOut {
		return wire.Summary{}, st.Log, fmt.Errorf("request loop %s still running", p.Name)
	}
	sum, err := vm.ParseSummary(st.Log)
	if err != nil {
		return wire.Summary{}, st.Log, err
	}
	return sum, st.Log, nil
}
