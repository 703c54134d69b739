package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/textproto"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// Endpoint is one EndpointSlice endpoint with full control of what
// kube-proxy's endpoint selection looks at. The zero conditions are
// ready+serving, not terminating.
type Endpoint struct {
	// IP is the endpoint's address (a pod's IP or IP6).
	IP   string
	Node string
	// NotReady, NotServing and Terminating set the conditions (ready,
	// serving, terminating) to !NotReady, !NotServing and Terminating.
	NotReady, NotServing, Terminating bool
	// Zone is the endpoint's zone; HintZones its hints.forZones.
	Zone      string
	HintZones []string
}

// PodEndpoint returns the Endpoint of the pod called name (IPv6 address if
// ipv6), ready and on the pod's node.
func (c *Cluster) PodEndpoint(name string, ipv6 bool) (Endpoint, error) {
	c.mu.Lock()
	p := c.Pods[name]
	c.mu.Unlock()
	if p == nil {
		return Endpoint{}, fmt.Errorf("cluster: no pod %q", name)
	}
	ip := p.IP
	if ipv6 {
		if p.IP6 == "" {
			return Endpoint{}, fmt.Errorf("cluster: pod %q has no IPv6 address (Options.IPv6)", name)
		}
		ip = p.IP6
	}
	return Endpoint{IP: ip, Node: p.Node.Name}, nil
}

// ApplySlice creates or replaces the EndpointSlice called slice of Service
// svc with the given address type, ports (target port ServePort) and
// endpoints. Tests that need conditions, zones or hints, or IPv6, use it
// instead of CreateService's slice.
func (c *Cluster) ApplySlice(ctx context.Context, ns, svc, slice string, addrType discoveryv1.AddressType, ports []Port, eps []Endpoint) error {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: slice,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "vsplane-e2e"},
		},
		AddressType: addrType,
	}
	for _, p := range ports {
		name, port, proto := p.Name, int32(ServePort), p.Protocol
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
	}
	for _, e := range eps {
		ready, serving, term := !e.NotReady, !e.NotServing, e.Terminating
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term},
		}
		if e.Node != "" {
			n := e.Node
			ep.NodeName = &n
		}
		if e.Zone != "" {
			z := e.Zone
			ep.Zone = &z
		}
		if len(e.HintZones) > 0 {
			ep.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.HintZones {
				ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	cur, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, slice, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create EndpointSlice %s/%s: %w", ns, slice, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get EndpointSlice %s/%s: %w", ns, slice, err)
	}
	es.ResourceVersion = cur.ResourceVersion
	if _, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update EndpointSlice %s/%s: %w", ns, slice, err)
	}
	return nil
}

// RequestsFrom is Requests from namespace from (a client, a node or a pod),
// each attempt bounded by timeout.
func (c *Cluster) RequestsFrom(ctx context.Context, from *vm.Netns, proto, addr string, count int, timeout string) (wire.Summary, string, error) {
	cmd := fmt.Sprintf("e2ehelper request --proto %s --addr %s --count %d --timeout %s", proto, addr, count, timeout)
	if proto == "sctp" {
		cmd = fmt.Sprintf("sctphelper request --addr %s --count %d --timeout %s", addr, count, timeout)
	}
	res, err := from.Run(ctx, cmd)
	if err != nil {
		return wire.Summary{}, "", fmt.Errorf("run %q in %s: %w", cmd, from.Name, err)
	}
	sum, err := vm.ParseSummary(res.Stdout)
	if err != nil {
		return wire.Summary{}, res.Stdout + res.Stderr, fmt.Errorf("%q in %s: %w (output %s)", cmd, from.Name, err, strings.TrimSpace(res.Stdout+res.Stderr))
	}
	return sum, res.Stdout, nil
}

// HTTPResponse is a parsed HTTP/1.x answer.
type HTTPResponse struct {
	Status int
	Header textproto.MIMEHeader
	Body   string
}

// HTTPGet sends "GET path HTTP/1.0" to hostport from namespace from with
// busybox nc (no HTTP client is in the guest), bounded by timeoutSec, and
// parses the answer.
func (c *Cluster) HTTPGet(ctx context.Context, from *vm.Netns, hostport, path string, timeoutSec int) (HTTPResponse, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return HTTPResponse{}, fmt.Errorf("HTTPGet: want HOST:PORT or [IPv6]:PORT, got %q", hostport)
	}
	cmd := fmt.Sprintf(`printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' | nc -w %d %s %s`, path, hostport, timeoutSec, host, port)
	res, err := from.Run(ctx, cmd)
	if err != nil {
		return HTTPResponse{}, fmt.Errorf("HTTP GET %s from %s: %w", hostport, from.Name, err)
	}
	if res.Stdout == "" {
		return HTTPResponse{}, fmt.Errorf("HTTP GET %s from %s: no answer (exit %d, %s)", hostport, from.Name, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return ParseHTTPResponse(res.Stdout)
}

// ParseHTTPResponse parses a raw HTTP/1.x response (status line, headers, body).
func ParseHTTPResponse(raw string) (HTTPResponse, error) {
	r := textproto.NewReader(bufio.NewReader(strings.NewReader(raw)))
	line, err := r.ReadLine()
	if err != nil {
		return HTTPResponse{}, fmt.Errorf("HTTP status line: %w (raw %q)", err, raw)
	}
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/1.") {
		return HTTPResponse{}, fmt.Errorf("bad HTTP status line %q", line)
	}
	code, err := strconv.Atoi(f[1])
	if err != nil {
		return HTTPResponse{}, fmt.Errorf("bad HTTP status line %q", line)
	}
	h, err := r.ReadMIMEHeader()
	if err != nil {
		return HTTPResponse{}, fmt.Errorf("HTTP headers: %w (raw %q)", err, raw)
	}
	_, body, _ := strings.Cut(raw, "\r\n\r\n")
	return HTTPResponse{Status: code, Header: h, Body: body}, nil
}
