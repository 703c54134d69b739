package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// portForward forwards a local loopback port (chosen by the kernel) through
// the API server to the gRPC port of a Ready Pod behind the control plane's
// Service, as `kubectl port-forward svc/vsplane-controlplane` does. It
// returns the local address and a stop function.
func portForward(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, ns string, stderr io.Writer) (string, func(), error) {
	svc, err := kube.CoreV1().Services(ns).Get(ctx, ServiceName, metav1.GetOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("the control plane's Service: %w (or pass --address)", err)
	}
	if len(svc.Spec.Selector) == 0 {
		return "", nil, fmt.Errorf("Service %s/%s has no selector", ns, ServiceName)
	}
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(svc.Spec.Selector).String()})
	if err != nil {
		return "", nil, fmt.Errorf("the control plane's Pods: %w", err)
	}
	pod, port, err := choosePod(svc, pods.Items)
	if err != nil {
		return "", nil, err
	}
	url := kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, url)
	// Newer API servers tunnel SPDY over WebSockets; fall back to plain SPDY
	// as kubectl does.
	if ws, err := portforward.NewSPDYOverWebsocketDialer(url, cfg); err == nil {
		dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stopCh, readyCh, io.Discard, stderr)
	if err != nil {
		return "", nil, err
	}
	errCh := make(chan error, 1)
	go func() { errCh <- fw.ForwardPorts() }()
	stop := func() { close(stopCh) }
	select {
	case <-readyCh:
	case err := <-errCh:
		return "", nil, fmt.Errorf("port-forward to pod %s/%s: %w", ns, pod, err)
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		stop()
		return "", nil, fmt.Errorf("port-forward to pod %s/%s: no local port (%v)", ns, pod, err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), stop, nil
}

// choosePod picks, among pods, a Ready, running, not terminating Pod the
// Service selects (the first by name, so repeated calls agree) and the
// container port its "grpc" port targets.
func choosePod(svc *corev1.Service, pods []corev1.Pod) (string, int32, error) {
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == PortName || len(svc.Spec.Ports) == 1 {
			sp = &svc.Spec.Ports[i]
			break
		}
	}
	if sp == nil {
		return "", 0, fmt.Errorf("Service %s/%s has no port named %q", svc.Namespace, svc.Name, PortName)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var skipped []string
	candidates := slices.Clone(pods)
	slices.SortFunc(candidates, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range candidates {
		switch {
		case p.Namespace != svc.Namespace || !sel.Matches(labels.Set(p.Labels)):
			continue
		case p.DeletionTimestamp != nil:
			skipped = append(skipped, p.Name+" (terminating)")
			continue
		case p.Status.Phase != corev1.PodRunning:
			skipped = append(skipped, fmt.Sprintf("%s (%s)", p.Name, p.Status.Phase))
			continue
		case !podReady(p):
			skipped = append(skipped, p.Name+" (not Ready)")
			continue
		}
		port, err := targetPort(*sp, p)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("%s (%v)", p.Name, err))
			continue
		}
		return p.Name, port, nil
	}
	if len(skipped) == 0 {
		return "", 0, fmt.Errorf("no Pod behind Service %s/%s (selector %s)", svc.Namespace, svc.Name, sel)
	}
	return "", 0, fmt.Errorf("no Ready Pod behind Service %s/%s: %s", svc.Namespace, svc.Name, strings.Join(skipped, ", "))
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// targetPort resolves a Service port's targetPort in pod (a number, a
// container port's name, or unset: the port itself).
func targetPort(sp corev1.ServicePort, pod corev1.Pod) (int32, error) {
	tp := sp.TargetPort
	switch {
	case tp.Type == intstr.Int && tp.IntVal != 0:
		return tp.IntVal, nil
	case tp.Type == intstr.Int:
		return sp.Port, nil
	}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == tp.StrVal {
				return cp.ContainerPort, nil
			}
		}
	}
	return 0, fmt.Errorf("no container port named %q", tp.StrVal)
}
