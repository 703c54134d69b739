package vmtests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// semEnv is the shared state of TestVMServiceSemantics' subtests.
type semEnv struct {
	c       *cluster.Cluster
	ctx     context.Context
	client  *vm.Netns // 198.19.0.201, Service ranges via node1
	client2 *vm.Netns // 198.19.0.202, Service ranges via node2
	node1   *vm.Node
	node2   *vm.Node
}

// semConverge bounds every wait for the cluster to reach a state; the
// agents normally need a few seconds.
const semConverge = 45 * time.Second

func (e *semEnv) nodeNs(n *vm.Node) *vm.Netns { return &n.Netns }

// service builds a Service with one port per proto (all on port, target
// ServePort), named after the protocol.
func service(name string, typ corev1.ServiceType, port int32, protos ...corev1.Protocol) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: typ},
	}
	for _, p := range protos {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: strings.ToLower(string(p)), Port: port, Protocol: p, TargetPort: intstr.FromInt32(cluster.ServePort),
		})
	}
	return svc
}

// portsOf are the cluster.Ports of svc (for its EndpointSlices).
func portsOf(svc *corev1.Service) []cluster.Port {
	var out []cluster.Port
	for _, p := range svc.Spec.Ports {
		out = append(out, cluster.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
	}
	return out
}

func (e *semEnv) create(t *testing.T, svc *corev1.Service) *corev1.Service {
	t.Helper()
	got, err := e.c.Kube.CoreV1().Services(ns).Create(e.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service %s: %v", svc.Name, err)
	}
	return got
}

// setIngress sets status.loadBalancer.ingress of a LoadBalancer Service, as
// a cloud controller would.
func (e *semEnv) setIngress(t *testing.T, svc *corev1.Service, ips ...string) *corev1.Service {
	t.Helper()
	cur, err := e.c.Kube.CoreV1().Services(ns).Get(e.ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	got, err := e.c.Kube.CoreV1().Services(ns).UpdateStatus(e.ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("set ingress of %s: %v", svc.Name, err)
	}
	return got
}

// slice creates or replaces svc's EndpointSlice of the family given by
// addrType (name svc-v4 / svc-v6).
func (e *semEnv) slice(t *testing.T, svc *corev1.Service, addrType discoveryv1.AddressType, eps ...cluster.Endpoint) {
	t.Helper()
	name := svc.Name + "-v4"
	if addrType == discoveryv1.AddressTypeIPv6 {
		name = svc.Name + "-v6"
	}
	if err := e.c.ApplySlice(e.ctx, ns, svc.Name, name, addrType, portsOf(svc), eps); err != nil {
		t.Fatal(err)
	}
}

// pods returns the (IPv4 or IPv6) endpoints of the named pods, ready.
func (e *semEnv) pods(t *testing.T, ipv6 bool, names ...string) []cluster.Endpoint {
	t.Helper()
	var out []cluster.Endpoint
	for _, n := range names {
		ep, err := e.c.PodEndpoint(n, ipv6)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ep)
	}
	return out
}

func (e *semEnv) ip(name string) string { return e.c.Pods[name].IP }

// try sends count requests from `from` and returns the summary and output;
// a request that could not run at all fails the test.
func (e *semEnv) try(t *testing.T, from *vm.Netns, proto, addr string, count int, timeout string) (wire.Summary, string) {
	t.Helper()
	sum, out, err := e.c.RequestsFrom(e.ctx, from, proto, addr, count, timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d %s requests to %s: %d ok, %d failed, per backend %v", from.Name, count, proto, addr, sum.OK, sum.Fail, sum.Backends)
	return sum, out
}

// await repeats a burst of count requests from `from` until check accepts
// the summary (and every request succeeded), bounded by semConverge, and
// returns the accepted burst's summary and output.
func (e *semEnv) await(t *testing.T, from *vm.Netns, proto, addr string, count int, check func(wire.Summary) error) (wire.Summary, string) {
	t.Helper()
	var sum wire.Summary
	var out string
	err := cluster.Await(e.ctx, semConverge, poll, func(ctx context.Context) error {
		var err error
		sum, out, err = e.c.RequestsFrom(ctx, from, proto, addr, count, "2s")
		if err != nil {
			return err
		}
		if sum.OK != count {
			return fmt.Errorf("%d of %d %s requests from %s to %s failed:\n%s", count-sum.OK, count, proto, from.Name, addr, tail(out, 6))
		}
		if check != nil {
			return check(sum)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d %s requests to %s: all ok, per backend %v", from.Name, count, proto, addr, sum.Backends)
	return sum, out
}

// only accepts summaries whose answers all came from backends in want, and
// from each of them at least once.
func only(want ...string) func(wire.Summary) error {
	return func(s wire.Summary) error {
		for b := range s.Backends {
			if !slices.Contains(want, b) {
				return fmt.Errorf("answer from %s, want only %v (got %v)", b, want, s.Backends)
			}
		}
		for _, w := range want {
			if s.Backends[w] == 0 {
				return fmt.Errorf("no answer from %s (got %v)", w, s.Backends)
			}
		}
		return nil
	}
}

// anyOf accepts summaries whose answers all came from backends in want.
func anyOf(want ...string) func(wire.Summary) error {
	return func(s wire.Summary) error {
		for b := range s.Backends {
			if !slices.Contains(want, b) {
				return fmt.Errorf("answer from %s, want only %v (got %v)", b, want, s.Backends)
			}
		}
		return nil
	}
}

var answerLine = regexp.MustCompile(`(?m)^\d+ ok (\S+) from (\S+)$`)

// peers returns the source addresses (without port) the backends reported
// in request output, per backend.
func peers(out string) map[string][]string {
	res := map[string][]string{}
	for _, m := range answerLine.FindAllStringSubmatch(out, -1) {
		host, _, err := net.SplitHostPort(m[2])
		if err != nil {
			host = m[2]
		}
		if !slices.Contains(res[m[1]], host) {
			res[m[1]] = append(res[m[1]], host)
		}
	}
	return res
}

// mustFail sends count requests that must all fail; it returns the output.
func (e *semEnv) mustFail(t *testing.T, from *vm.Netns, proto, addr string, count int, timeout string) string {
	t.Helper()
	sum, out := e.try(t, from, proto, addr, count, timeout)
	if sum.OK != 0 {
		t.Errorf("%s -> %s: %d of %d requests got through (backends %v), want none:\n%s", from.Name, addr, sum.OK, count, sum.Backends, tail(out, 8))
	}
	return out
}

// failLines are the "N fail: ..." lines of request output.
func failLines(out string) []string {
	var res []string
	for _, l := range strings.Split(out, "\n") {
		if _, rest, ok := strings.Cut(l, " fail: "); ok {
			res = append(res, rest)
		}
	}
	return res
}

// awaitVS waits until node has exactly one virtual server of proto on
// addr:port and returns its real servers as "addr:port w=W".
func (e *semEnv) awaitVS(t *testing.T, node, proto, addr string, port int32) []string {
	t.Helper()
	var rs []string
	err := cluster.Await(e.ctx, semConverge, poll, func(ctx context.Context) error {
		tab, err := e.table(ctx, node)
		if err != nil {
			return err
		}
		var keys []string
		for k := range tab.Find(addr, port) {
			if strings.HasPrefix(k, strings.ToUpper(proto)+" ") {
				keys = append(keys, k)
			}
		}
		if len(keys) != 1 {
			return fmt.Errorf("%s: want one %s virtual server on %s:%d, have:\n%s", node, proto, addr, port, tab)
		}
		rs = tab[keys[0]]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func (e *semEnv) table(ctx context.Context, node string) (cluster.IPVSTable, error) {
	out, err := e.c.IPVS(ctx, node)
	if err != nil {
		return nil, err
	}
	return cluster.ParseIPVSADM(out)
}

// hcBody is kube-proxy's health-check answer.
type hcBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int   `json:"localEndpoints"`
	ServiceProxyHealthy *bool `json:"serviceProxyHealthy"`
}

// checkHC checks one health-check answer against kube-proxy's: status,
// headers and JSON body.
func checkHC(r cluster.HTTPResponse, svc string, wantStatus, wantLocal int) error {
	var b hcBody
	if err := json.Unmarshal([]byte(r.Body), &b); err != nil {
		return fmt.Errorf("body is not kube-proxy's JSON: %v (status %d, body %q)", err, r.Status, r.Body)
	}
	var errs []string
	if r.Status != wantStatus {
		errs = append(errs, fmt.Sprintf("status %d, want %d", r.Status, wantStatus))
	}
	if got := r.Header.Get("Content-Type"); got != "application/json" {
		errs = append(errs, fmt.Sprintf("Content-Type %q, want application/json", got))
	}
	if got := r.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		errs = append(errs, fmt.Sprintf("X-Content-Type-Options %q, want nosniff", got))
	}
	if got, want := r.Header.Get("X-Load-Balancing-Endpoint-Weight"), fmt.Sprint(wantLocal); got != want {
		errs = append(errs, fmt.Sprintf("X-Load-Balancing-Endpoint-Weight %q, want %q", got, want))
	}
	if b.Service.Namespace != ns || b.Service.Name != svc {
		errs = append(errs, fmt.Sprintf("service %s/%s, want %s/%s", b.Service.Namespace, b.Service.Name, ns, svc))
	}
	if b.LocalEndpoints != wantLocal {
		errs = append(errs, fmt.Sprintf("localEndpoints %d, want %d", b.LocalEndpoints, wantLocal))
	}
	if b.ServiceProxyHealthy == nil || !*b.ServiceProxyHealthy {
		errs = append(errs, "serviceProxyHealthy missing or false")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s (body %q)", strings.Join(errs, "; "), r.Body)
	}
	return nil
}

// kubeIPVS0 returns the addresses on node's kube-ipvs0.
func (e *semEnv) kubeIPVS0(ctx context.Context, node string) (string, error) {
	return e.c.RunInNode(ctx, node, "/usr/sbin/ip -o addr show dev kube-ipvs0")
}
