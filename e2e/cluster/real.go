package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/e2e/helmchart"
	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/nodes"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/internal/testpki"
)

// The real-node cluster's address plan (inside 198.18.0.0/15, clear of the
// namespace test bed's 198.19.1-15.0/24 Pod ranges).
const (
	// RealPodNet is --cluster-cidr: kube-controller-manager gives each
	// Node a /24 of it (spec.podCIDR), its CNI configuration follows.
	RealPodNet = "198.19.16.0/20"
	// RealOverlay is the kustomize overlay of deploy/ the real cluster
	// applies (plus the apiserver's address, which changes per run).
	RealOverlay = "deploy/overlays/testbed"
)

// RealProxy is the Service proxy a real cluster runs.
type RealProxy string

const (
	// ProxyVsplane: vsplane's control plane and agents, deployed from its
	// manifests and images (the default).
	ProxyVsplane RealProxy = "vsplane"
	// ProxyKubeProxy: kube-proxy v1.37.2 in IPVS mode on every node (the
	// baseline of the conformance runs), a node daemon started the way
	// hack/local-up-cluster.sh starts it.
	ProxyKubeProxy RealProxy = "kube-proxy"
)

// RealOptions configure StartReal. The zero value gives two nodes running
// vsplane.
type RealOptions struct {
	// Proxy is the Service proxy (default ProxyVsplane).
	Proxy RealProxy
	// Nodes is the number of real nodes (default 2; the testbed overlay
	// points the agents at the control-plane replicas on node1 and node2).
	Nodes int
	// VMMemoryMB is the guest's memory (default 6144: two nodes' containerd
	// content stores and Pods live in tmpfs).
	VMMemoryMB int
	// FromChart installs vsplane from the Helm chart (deploy/helm/vsplane
	// with ci/testbed-values.yaml, rendered with Helm's SDK) instead of the
	// testbed overlay: the same objects (e2e/integration checks the two
	// agree), installed the other way users install it.
	FromChart bool
	// SkipVsplane leaves the proxy (and CoreDNS, which needs its
	// Services) undeployed: DeployVsplane or StartKubeProxies, then
	// DeployDNS, do it later.
	SkipVsplane bool
	// GoPackages are extra Go packages built into the VM's /usr/local/bin
	// (vm.Options.GoPackages): helpers a test runs in a node's namespace.
	GoPackages []string
	// BuildTimeout bounds building the images and the node disk (default 30
	// minutes: a cold Go build cache on a loaded 2-core machine).
	BuildTimeout time.Duration
	// StartTimeout bounds the start once the images are built: the
	// apiserver, the VM, image import, kubelets, vsplane and DNS (default 25
	// minutes: about 3 under TCG on a quiet machine, 12 to vsplane serving
	// beside two CPU burners and another VM).
	StartTimeout time.Duration
	Log          *zap.Logger
}

// RealCluster is a cluster on real nodes: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler on the host; per node in the
// VM a kubelet, containerd and CNI (e2e/nodes); vsplane's control plane
// (a Deployment) and agents (a DaemonSet) running as Pods from its own
// images, applied from the testbed overlay; CoreDNS behind kube-dns.
type RealCluster struct {
	Env    *kubeenv.Env
	Kube   kubernetes.Interface
	VM     *vm.VM
	Topo   *vm.Topology
	Bed    *nodes.Bed
	Nodes  []*nodes.Node
	Client *vm.Netns // outside the cluster, on the node bridge
	// CA and TLS files of the control plane's Secret vsplane-controlplane-tls.
	CA      *testpki.CA
	TLS     testpki.Files
	APIPort int // the apiserver's port, the same in the VM at vm.HostLoopIP
	Root    string
	// Images are every image imported into the nodes, with the builder's
	// manifest digests.
	Images []nodes.DiskImage

	opts    RealOptions
	log     *zap.Logger
	relay   *nodes.Relay
	workDir string

	inspectMu      sync.Mutex
	inspectorToken string
	inspectConns   map[string]*grpc.ClientConn

	stopOnce sync.Once
	stopErr  error
}

// StartReal builds what the nodes need (images, the node disk), starts the
// host's Kubernetes control plane, boots the VM, starts every node and
// waits until each is Ready, then (unless SkipVsplane) deploys vsplane and
// CoreDNS and waits until they serve. On error everything is torn down.
func StartReal(ctx context.Context, opts RealOptions) (_ *RealCluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Nodes < 1 || opts.Nodes > 4 {
		return nil, fmt.Errorf("cluster: real Nodes must be 1..4, got %d", opts.Nodes)
	}
	switch opts.Proxy {
	case "":
		opts.Proxy = ProxyVsplane
	case ProxyVsplane, ProxyKubeProxy:
	default:
		return nil, fmt.Errorf("cluster: unknown real Proxy %q (want %q or %q)", opts.Proxy, ProxyVsplane, ProxyKubeProxy)
	}
	if opts.VMMemoryMB == 0 {
		opts.VMMemoryMB = 6144
	}
	if opts.BuildTimeout == 0 {
		opts.BuildTimeout = 30 * time.Minute
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 25 * time.Minute
	}
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	parent := ctx
	ctx, cancelBuild := context.WithTimeout(parent, opts.BuildTimeout)
	defer cancelBuild()
	c := &RealCluster{opts: opts, log: log}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.Root, err = measure.RepoRoot("."); err != nil {
		return nil, err
	}
	bins, err := nodes.FindBinaries(c.Root)
	if err != nil {
		return nil, err
	}
	if c.workDir, err = os.MkdirTemp("", "vsplane-real-"); err != nil {
		return nil, err
	}
	t0 := time.Now()
	images, err := nodes.BuildImages(ctx, c.Root, c.workDir)
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	c.Images = images
	disk := filepath.Join(c.workDir, "node.img")
	if err := nodes.BuildDisk(ctx, bins, images, disk); err != nil {
		return nil, fmt.Errorf("node disk: %w", err)
	}
	log.Info("images and node disk built", zap.Int("images", len(images)), zap.Duration("took", time.Since(t0)))
	// The build's time does not eat into the start's: on a busy machine a
	// cold build alone can take most of StartTimeout.
	cancelBuild()
	ctx, cancelStart := context.WithTimeout(parent, opts.StartTimeout)
	defer cancelStart()

	if c.relay, err = nodes.NewRelay(filepath.Join(c.workDir, "egress.sock")); err != nil {
		return nil, err
	}
	c.Env, err = kubeenv.Start(ctx, kubeenv.Options{
		AdvertiseAddress:  vm.HostLoopIP,
		EgressProxySocket: c.relay.Addr(),
		Controllers:       true,
		ClusterCIDR:       RealPodNet,
		AuthorizationMode: "Node,RBAC",
		// Kubelets may change only their own Node and its Pods.
		ExtraAPIServerFlags: []string{"--enable-admission-plugins=NodeRestriction"},
		Logger:              log.Named("kubeenv"),
	})
	if err != nil {
		return nil, fmt.Errorf("start the Kubernetes control plane (binaries: bash scripts/kube/build.sh): %w", err)
	}
	if c.Kube, err = kubernetes.NewForConfig(c.Env.RESTConfig()); err != nil {
		return nil, err
	}
	u, err := url.Parse(c.Env.Host)
	if err != nil {
		return nil, err
	}
	if c.APIPort, err = strconv.Atoi(u.Port()); err != nil {
		return nil, err
	}
	c.VM, err = vm.Boot(ctx, vm.Options{
		TmpfsRoot:     true,
		Disks:         []string{disk},
		MemoryMB:      opts.VMMemoryMB,
		GuestFwdPorts: []int{c.APIPort},
		HostFwdPorts:  []int{nodes.ProxyPort},
		GoPackages:    opts.GoPackages,
		BootTimeout:   5 * time.Minute,
		Log:           log.Named("vm"),
	})
	if err != nil {
		return nil, fmt.Errorf("boot VM: %w", err)
	}
	c.relay.SetTarget(c.VM.HostFwdAddr(nodes.ProxyPort))
	if c.Topo, err = vm.NewTopology(ctx, c.VM); err != nil {
		return nil, err
	}
	var netns []*vm.Node
	for range opts.Nodes {
		n, err := c.Topo.AddNode(ctx)
		if err != nil {
			return nil, err
		}
		netns = append(netns, n)
	}
	if c.Client, err = c.Topo.AddClient(ctx, "client", netns[0]); err != nil {
		return nil, err
	}
	if c.Bed, err = nodes.Prepare(ctx, c.VM, images, log.Named("nodes")); err != nil {
		return nil, err
	}
	if err := c.startNodes(ctx, netns); err != nil {
		return nil, err
	}
	log.Info("nodes ready", zap.Duration("after", time.Since(t0)))
	if opts.SkipVsplane {
		return c, nil
	}
	if opts.Proxy == ProxyKubeProxy {
		if err := c.StartKubeProxies(ctx); err != nil {
			return nil, err
		}
		log.Info("kube-proxy serving", zap.Duration("after", time.Since(t0)))
	} else {
		if err := c.DeployVsplane(ctx); err != nil {
			return nil, err
		}
		log.Info("vsplane serving", zap.Duration("after", time.Since(t0)))
	}
	if err := c.DeployDNS(ctx); err != nil {
		return nil, err
	}
	log.Info("cluster DNS serving", zap.Duration("after", time.Since(t0)))
	return c, nil
}

// startNodes starts every node's runtime and kubelet, waits for each Node
// to register and get its Pod range, configures CNI and the routes between
// the nodes' Pod ranges, and waits until every Node is Ready.
func (c *RealCluster) startNodes(ctx context.Context, netns []*vm.Node) error {
	server := c.guestAPIServer()
	errs := make([]error, len(netns))
	c.Nodes = make([]*nodes.Node, len(netns))
	var wg sync.WaitGroup
	for i, n := range netns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kc, err := c.Env.KubeconfigFor(server, "system:node:"+n.Name, "system:nodes")
			if err != nil {
				errs[i] = err
				return
			}
			node, err := c.Bed.AddNode(ctx, n, nodes.Credentials{Kubeconfig: kc, CA: c.Env.CACert()})
			if err != nil {
				errs[i] = err
				return
			}
			c.Nodes[i] = node
			if err := node.StartRuntime(ctx); err != nil {
				errs[i] = err
				return
			}
			errs[i] = node.StartKubelet(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Pod ranges: what a CNI daemon reads from its Node, and the routes a
	// routed network (Calico-like) gives every other host.
	for _, n := range c.Nodes {
		cidr, err := c.awaitPodCIDR(ctx, n)
		if err != nil {
			return err
		}
		if err := n.SetPodCIDR(ctx, cidr); err != nil {
			return err
		}
		if _, err := c.VM.RunOK(ctx, "/usr/sbin/ip route replace "+cidr+" via "+n.IP()); err != nil {
			return err
		}
		if err := c.Client.RouteVia(ctx, cidr, n.Netns); err != nil {
			return err
		}
		for _, o := range c.Nodes {
			if o != n {
				if err := o.Netns.RouteVia(ctx, cidr, n.Netns); err != nil {
					return err
				}
			}
		}
	}
	for _, n := range c.Nodes {
		if err := c.AwaitNodeReady(ctx, n.Name, true); err != nil {
			return fmt.Errorf("%w\n%s\n%s", err, n.LogTail(ctx, "kubelet", 30), n.LogTail(ctx, "containerd", 10))
		}
		// The base places the replicas on control-plane nodes; here every
		// node is one (NodeRestriction keeps kubelets from setting node-role
		// labels themselves, so the admin does, as kubeadm does).
		patch := []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`)
		if _, err := c.Kube.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label %s: %w", n.Name, err)
		}
	}
	return nil
}

// guestAPIServer is the apiserver's URL as the nodes reach it (guestfwd).
func (c *RealCluster) guestAPIServer() string {
	return "https://" + vm.HostLoopIP + ":" + strconv.Itoa(c.APIPort)
}

func (c *RealCluster) awaitPodCIDR(ctx context.Context, n *nodes.Node) (string, error) {
	var cidr string
	err := c.poll(ctx, 3*time.Minute, func() (bool, error) {
		node, err := c.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		cidr = node.Spec.PodCIDR
		return cidr != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("Node %s registered with a Pod range: %w\n%s", n.Name, err, n.LogTail(ctx, "kubelet", 30))
	}
	return cidr, nil
}

// AwaitNodeReady waits until Node name's Ready condition is ready (true) or
// not (false).
func (c *RealCluster) AwaitNodeReady(ctx context.Context, name string, ready bool) error {
	want := corev1.ConditionFalse
	if ready {
		want = corev1.ConditionTrue
	}
	var last string
	err := c.poll(ctx, 3*time.Minute, func() (bool, error) {
		node, err := c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s: %s", cond.Status, cond.Message)
				return cond.Status == want, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("Node %s Ready=%s: %w (last: %s)", name, want, err, last)
	}
	return nil
}

// poll calls cond every 250 ms until it is true, it fails, or limit (or
// ctx) ends.
func (c *RealCluster) poll(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Kubectl runs the cluster's kubectl (the admin kubeconfig) and returns its
// stdout; a failure quotes its stderr.
func (c *RealCluster) Kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.Env.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Env.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// DeployVsplane deploys vsplane the way a user does: `kubectl apply
// --server-side -k` of the testbed overlay with the apiserver's address on
// top (or, with FromChart, the chart rendered with the test bed's values),
// then the Secret with the control plane's serving certificate (a user's
// PKI), and waits until both replicas are available and every node's agent
// is ready.
func (c *RealCluster) DeployVsplane(ctx context.Context) error {
	if c.opts.FromChart {
		if err := c.installChart(ctx); err != nil {
			return err
		}
	} else {
		overlay, err := c.writeOverlay()
		if err != nil {
			return err
		}
		if _, err := c.Kubectl(ctx, nil, "apply", "--server-side", "-k", overlay); err != nil {
			return err
		}
	}
	if err := c.createTLSSecret(ctx); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, nil, "-n", SystemNamespace, "rollout", "status", "deployment/vsplane-controlplane", "--timeout=5m"); err != nil {
		return fmt.Errorf("%w\n%s", err, c.PodsSummary(ctx))
	}
	if _, err := c.Kubectl(ctx, nil, "-n", SystemNamespace, "rollout", "status", "daemonset/vsplane-agent", "--timeout=5m"); err != nil {
		return fmt.Errorf("%w\n%s", err, c.PodsSummary(ctx))
	}
	return nil
}

// StartKubeProxies starts kube-proxy v1.37.2 in IPVS mode on every node
// (user system:kube-proxy; the cluster CIDR; conntrack table sizing left
// alone: nf_conntrack_max is the VM's, not a node's) and returns once each
// uses its IPVS proxier.
func (c *RealCluster) StartKubeProxies(ctx context.Context) error {
	kc, err := c.Env.KubeconfigFor(c.guestAPIServer(), "system:kube-proxy")
	if err != nil {
		return err
	}
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// --v=4 logs each sync's and each endpoint change's time
			// and every conntrack cleanup: what explains a failed spec
			// (conformance keeps the logs with each run).
			errs[i] = n.StartKubeProxy(ctx, kc, "Using ipvs Proxier",
				"--proxy-mode=ipvs", "--cluster-cidr="+RealPodNet, "--conntrack-max-per-core=0",
				"--metrics-bind-address=0.0.0.0:10249", "--healthz-bind-address=0.0.0.0:10256", "--v=4")
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// writeOverlay writes the run's top layer over RealOverlay: where the
// replicas (host network) reach the apiserver without a Service VIP.
func (c *RealCluster) writeOverlay() (string, error) {
	dir := filepath.Join(c.workDir, "overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	rel, err := filepath.Rel(dir, filepath.Join(c.Root, RealOverlay))
	if err != nil {
		return "", err
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
patches:
  - target: {kind: Deployment, name: vsplane-controlplane}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {name: KUBERNETES_SERVICE_HOST, value: "%s"}
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {name: KUBERNETES_SERVICE_PORT, value: "%d"}
`, rel, vm.HostLoopIP, c.APIPort)
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// installChart renders the chart with the test bed's values file and, as
// writeOverlay adds, where the replicas reach the apiserver; creates the
// release namespace (helm install --create-namespace) and applies the
// objects server-side.
func (c *RealCluster) installChart(ctx context.Context) error {
	vals, err := helmchart.ReadValues(filepath.Join(c.Root, helmchart.Dir, "ci", "testbed-values.yaml"))
	if err != nil {
		return err
	}
	cp, ok := vals["controlplane"].(map[string]any)
	if !ok {
		return errors.New("cluster: ci/testbed-values.yaml has no controlplane values")
	}
	cp["extraEnv"] = []any{
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": vm.HostLoopIP},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": strconv.Itoa(c.APIPort)},
	}
	objs, err := helmchart.Render(c.Root, vals)
	if err != nil {
		return fmt.Errorf("cluster: render the chart: %w", err)
	}
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: helmchart.Namespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err = c.Kubectl(ctx, objs, "apply", "--server-side", "-f", "-")
	return err
}

// createTLSSecret creates vsplane-controlplane-tls from a CA of the test's
// own (the Secret the base expects from the user's PKI or cert-manager).
func (c *RealCluster) createTLSSecret(ctx context.Context) error {
	ca, err := testpki.NewCA("vsplane real-node test CA")
	if err != nil {
		return err
	}
	dir := filepath.Join(c.workDir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		return err
	}
	c.CA, c.TLS = ca, files
	data := map[string][]byte{}
	for k, f := range map[string]string{"tls.crt": files.Cert, "tls.key": files.Key, "ca.crt": files.CA} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		data[k] = b
	}
	_, err = c.Kube.CoreV1().Secrets(SystemNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "vsplane-controlplane-tls", Namespace: SystemNamespace},
		Type:       corev1.SecretTypeTLS, Data: data}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Secret vsplane-controlplane-tls: %w", err)
	}
	return nil
}

// DeployDNS applies CoreDNS (e2e/nodes' manifest) and waits until both
// replicas are ready: they reach the apiserver through the kubernetes
// Service's ClusterIP, which vsplane serves.
func (c *RealCluster) DeployDNS(ctx context.Context) error {
	if _, err := c.Kubectl(ctx, nodes.CoreDNSManifest, "apply", "--server-side", "-f", "-"); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, nil, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=10m"); err != nil {
		return fmt.Errorf("%w\n%s", err, c.PodsSummary(ctx))
	}
	return nil
}

// PodsSummary lists every Pod with its node and state, and the recent
// warning events: for failure messages.
func (c *RealCluster) PodsSummary(ctx context.Context) string {
	pods, _ := c.Kubectl(ctx, nil, "get", "pods", "-A", "-o", "wide")
	events, _ := c.Kubectl(ctx, nil, "get", "events", "-A", "--field-selector", "type=Warning")
	return "--- pods ---\n" + pods + "--- warning events ---\n" + events
}

// SaveProxyLogs writes what the proxy logged into dir: each node's
// kube-proxy (node daemons) or vsplane's Pods (agents and replicas), one
// file each, so a failed spec can be explained after the cluster is gone.
func (c *RealCluster) SaveProxyLogs(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	if c.opts.Proxy == ProxyKubeProxy {
		for _, n := range c.Nodes {
			log, err := n.DaemonLog(ctx, "kube-proxy")
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, n.Name+"-kube-proxy.log"), []byte(log), 0o644)
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	pods, err := c.Kube.CoreV1().Pods(SystemNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			log, err := c.Kube.CoreV1().Pods(SystemNamespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name}).DoRaw(ctx)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, p.Spec.NodeName+"-"+p.Name+"-"+ctr.Name+".log"), log, 0o644)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Node returns the real node called name.
func (c *RealCluster) Node(name string) (*nodes.Node, error) {
	for _, n := range c.Nodes {
		if n != nil && n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("cluster: no real node %q", name)
}

// Stop tears everything down: nodes, VM, control plane, work files.
func (c *RealCluster) Stop() error {
	c.stopOnce.Do(func() {
		var errs []error
		c.inspectMu.Lock()
		for _, conn := range c.inspectConns {
			conn.Close()
		}
		c.inspectMu.Unlock()
		if c.VM != nil {
			c.VM.Stop()
		}
		if c.relay != nil {
			c.relay.Close()
		}
		if c.Env != nil {
			errs = append(errs, c.Env.Stop())
		}
		if c.workDir != "" {
			errs = append(errs, os.RemoveAll(c.workDir))
		}
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}
