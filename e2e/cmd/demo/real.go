package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/internal/wire"
)

// helloManifest is the demo's workload on real nodes: two Pods of agnhost
// serve-hostname (raw TCP on 9376, each answer its Pod's name), one per
// node, behind a NodePort Service on port 80.
const helloManifest = `apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: hello, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: hello}}
  template:
    metadata: {labels: {app: hello}}
    spec:
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: hello}}}
      containers:
        - name: hello
          image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
          args: [serve-hostname, --tcp, --http=false, --port=9376]
          readinessProbe: {tcpSocket: {port: 9376}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: demo}
spec:
  type: NodePort
  selector: {app: hello}
  ports: [{name: tcp, port: 80, targetPort: 9376}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo}
spec:
  containers: [{name: client, image: registry.k8s.io/e2e-test-images/agnhost:2.66.1, args: [pause]}]
`

// runReal is the demo on real nodes: kubelets, containerd and Pods in the
// VM, vsplane deployed from its images and manifests, CoreDNS.
func runReal(ctx context.Context, grpcurl string, requests int, duration time.Duration, log *zap.Logger) error {
	t0 := time.Now()
	step("building the images and the node disk; starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the VM with two kubelets; deploying vsplane (kubectl apply -k deploy/overlays/testbed) and CoreDNS")
	c, err := cluster.StartReal(ctx, cluster.RealOptions{Log: log})
	if err != nil {
		return err
	}
	defer func() {
		step("cleaning up: nodes, VM, control plane")
		if err := c.Stop(); err != nil {
			fmt.Printf("demo: teardown: %v\n", err)
		}
	}()
	kubectl := filepath.Join(c.Env.BinDir, "kubectl") + " --kubeconfig " + c.Env.Kubeconfig
	fmt.Printf("  apiserver %s; all up in %v\n", c.Env.Host, time.Since(t0).Round(time.Second))

	section("(a) vsplane's own Pods (the control-plane Deployment, the agent DaemonSet), CoreDNS: kubectl get pods -A -o wide")
	out, err := c.Kubectl(ctx, nil, "get", "pods", "-A", "-o", "wide")
	if err != nil {
		return err
	}
	fmt.Print(out)

	step("creating Deployment demo/hello (two Pods, one per node) behind a NodePort Service, and a client Pod")
	if _, err := c.Kubectl(ctx, []byte(helloManifest), "apply", "-f", "-"); err != nil {
		return err
	}
	for _, w := range []string{"deployment/hello", "pod/client"} {
		args := []string{"-n", "demo", "rollout", "status", w, "--timeout=4m"}
		if strings.HasPrefix(w, "pod/") {
			args = []string{"-n", "demo", "wait", "--for=condition=Ready", w, "--timeout=4m"}
		}
		if _, err := c.Kubectl(ctx, nil, args...); err != nil {
			return fmt.Errorf("%w\n%s", err, c.PodsSummary(ctx))
		}
	}
	ipsOut, err := c.Kubectl(ctx, nil, "-n", "demo", "get", "pods", "-l", "app=hello", "-o", "jsonpath={.items[*].status.podIP}")
	if err != nil {
		return err
	}
	if err := c.AwaitProgrammed(ctx, "demo", "hello", strings.Fields(ipsOut)); err != nil {
		return err
	}

	section(fmt.Sprintf("(b) %d connections from the client Pod to hello.demo:80, resolved by CoreDNS (kube-dns, a ClusterIP vsplane serves)", requests))
	out, err = c.Kubectl(ctx, nil, "-n", "demo", "exec", "client", "--", "sh", "-c",
		fmt.Sprintf("for i in $(seq %d); do nc -w 3 hello.demo 80; echo; done", requests))
	if err != nil {
		return err
	}
	fmt.Print(indent(out))

	np, err := c.Kubectl(ctx, nil, "-n", "demo", "get", "svc", "hello", "-o", "jsonpath={.spec.ports[0].nodePort}")
	if err != nil {
		return err
	}
	section(fmt.Sprintf("(c) %d requests from outside the cluster to node1's NodePort %s:%s", requests, c.Nodes[0].IP(), np))
	r, err := c.Client.Run(ctx, fmt.Sprintf("e2ehelper request --proto tcp --addr %s:%s --count %d --timeout 3s", c.Nodes[0].IP(), np, requests))
	if err != nil {
		return err
	}
	fmt.Print(indent(r.Stdout))
	if sum, err := vm.ParseSummary(r.Stdout); err != nil || sum.Fail > 0 {
		return fmt.Errorf("requests through the NodePort: %+v %v", sum, err)
	}

	token, err := c.InspectorTokenFile(ctx)
	if err != nil {
		return err
	}
	cp := fmt.Sprintf("%s:%d", c.Nodes[0].IP(), cluster.ControlPlanePort)
	g := fmt.Sprintf("%s -cacert %s -servername %s", grpcurl, c.TLS.CA, wire.DefaultServerName)
	section("(d) the agents, from a control-plane replica (grpcurl through the VM's CONNECT proxy)")
	if err := showEnv(ctx, []string{"HTTPS_PROXY=http://" + c.ProxyAddr()}, grpcurl, "-cacert", c.TLS.CA, "-servername", wire.DefaultServerName,
		"-H", "authorization: Bearer "+readTrim(token), "-d", `{"omit_versions":true}`, cp, "vsplane.v1.InspectService/ListAgents"); err != nil {
		return err
	}

	section("poke at it")
	fmt.Printf(`  export HTTPS_PROXY=http://%[5]s   # the VM's CONNECT proxy: grpcurl reaches the replicas' node addresses
  K="%[1]s"; G="%[2]s"; T="authorization: Bearer $(cat %[3]s)"
  $K get pods -A -o wide
  $K -n demo exec client -- sh -c 'nc -w 3 hello.demo 80'
  $K -n vsplane-system logs deploy/vsplane-controlplane
  $G -H "$T" %[4]s vsplane.v1.InspectService/ListAgents
  $G -H "$T" -d '{"node_name":"node2","namespace":"demo","name":"hello"}' %[4]s vsplane.v1.InspectService/ExplainService
`, kubectl, g, token, cp, c.ProxyAddr())
	return waitFor(ctx, duration)
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if !strings.HasPrefix(l, "summary ") {
			b.WriteString("  " + l + "\n")
		}
	}
	return b.String()
}
