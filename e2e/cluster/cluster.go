// Package cluster runs a whole vsplane cluster on one machine for the VM
// tests and the demo: a real etcd + kube-apiserver on loopback (kubeenv), one
// in-process control-plane replica on 127.0.0.1:PORT, and the QEMU test bed
// (e2e/vm) with one node network namespace per Node object, each running a
// real vsplane-agent that reaches the control plane through guestfwd at
// 198.19.255.100:PORT.
//
//	host 127.0.0.1                     QEMU VM
//	etcd, kube-apiserver ◀── watch ── control plane :PORT ◀══ guestfwd ══ vsplane-agent (node1, node2, ...)
//	                                                                      pods: e2ehelper serve :8080 tcp+udp
//	                                                                      client: 198.18.0.0/16 via node1
package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// ServePort is the port every pod's e2ehelper serves on, TCP and UDP.
const ServePort = 8080

// AgentPackage is the agent's Go package, built into the guest.
const AgentPackage = "./dataplane/cmd/vsplane-agent"

// Options configure Start. The zero value gives two nodes with no pods.
type Options struct {
	// Nodes is the number of node namespaces and Node objects (default 2).
	Nodes int
	// Pods lists pod names per node index (0 = node1); each pod runs
	// "e2ehelper serve --name <pod> --tcp :8080 --udp :8080".
	Pods [][]string
	// ReconcilePeriod is the agents' --reconcile-period (default 30s).
	ReconcilePeriod time.Duration
	// AgentArgs are extra vsplane-agent flags (shell words, e.g.
	// "--max-drain 8s"); SetAgentArgs changes them for later StartAgent calls.
	AgentArgs string
	// Zone is the topology.kubernetes.io/zone label of every Node (default zone-a).
	Zone string
	// Zones, if set, gives node i (0 = node1) the zone Zones[i] instead
	// (nodes beyond its length get Zone).
	Zones []string
	// IPv6 makes the cluster dual-stack: the apiserver gets an IPv6 Service
	// range (vm.ServiceNet6), every namespace an IPv6 address (vm.TopologyOptions),
	// Node objects an IPv6 InternalIP, agents detect IPv6 (--ipv6 auto), and the IPv6 pod CIDRs
	// are cluster CIDRs too.
	IPv6 bool
	// GoPackages are extra Go packages built (static) into the guest's /usr/local/bin.
	GoPackages []string
	// Translate is the control plane's translation config (node settings:
	// strictARP, IPVS timeouts, nodePortAddresses, excludeCIDRs...). Empty
	// ClusterCIDRs default to the pod CIDRs.
	Translate translate.Config
	// Binaries are extra static host executables put in the guest's /usr/local/bin.
	Binaries []string
	// Trees are host directories copied into the guest (vm.Options.Trees),
	// e.g. an unpacked agent image.
	Trees []vm.Tree
	// AgentExec is the guest command that runs the agent, its flags
	// appended (default "vsplane-agent"): e.g. a shell wrapper that
	// chroots into an unpacked image (e2e/images).
	AgentExec string
	// AgentExecs gives a node (by name) an agent command of its own instead
	// of AgentExec, e.g. another version's binary put in the guest by
	// Binaries (e2e/skew); SetAgentExec changes it for later StartAgent calls.
	AgentExecs map[string]string
	// Replicas > 0 runs that many control-plane replicas as separate host
	// processes (vsplane-controlplane, built for the test) instead of one
	// in-process replica, each on its own port the guest reaches through
	// guestfwd; agents get all of them in --controlplane. ReplicaArgs are
	// extra flags for every replica. ReplicaBinary, if set, is the host
	// executable the replicas run instead of one built from this checkout
	// (e.g. an earlier commit's, e2e/skew); ReplicaProc.SetBinary changes it
	// per replica.
	Replicas      int
	ReplicaArgs   []string
	ReplicaBinary string
	// ReplicaMetrics gives each replica process a /metrics listener on a
	// free loopback port (ReplicaProc.MetricsAddr); off, they have none.
	ReplicaMetrics bool
	// StreamHooks observe the in-process replica's agent streams (e.g. each
	// Ack, for end-to-end latency); unused with Replicas.
	StreamHooks stream.Hooks
	// Kube configures etcd + kube-apiserver.
	Kube kubeenv.Options
	// KubeProxy puts kube-proxy (built by scripts/kube/build.sh next to
	// kube-apiserver) into the guest and forwards the apiserver's port to
	// it (vm.HostLoopIP:APIPORT), so StartKubeProxy can run kube-proxy in a
	// node namespace (usually one of NoAgent).
	KubeProxy bool
	// NoAgent names nodes (node1, ...) whose agent Start does not start:
	// StartAgent starts it later (e.g. a cold start into a prepared
	// cluster), or the node runs kube-proxy. AwaitAcked skips them while
	// they have no agent.
	NoAgent []string
	// GuestFwdPorts are extra host loopback ports the guest reaches at
	// vm.HostLoopIP (e.g. a vm.Probe listener).
	GuestFwdPorts []int
	// VMMemoryMB is the guest's memory (default vm.Options' 1 GiB).
	VMMemoryMB int
	// VMBootTimeout bounds the guest build and boot (default 5 minutes: TCG on a busy host).
	VMBootTimeout time.Duration
	// Log receives progress; default zap.NewNop().
	Log *zap.Logger
}

// Cluster is a running cluster. Its methods are safe for concurrent use
// unless they say otherwise; Stop tears everything down.
type Cluster struct {
	Env  *kubeenv.Env
	Kube kubernetes.Interface
	// Replica is the in-process replica (nil with Options.Replicas).
	Replica *app.Replica
	// ReplicaProcs are the replica processes of Options.Replicas.
	ReplicaProcs []*ReplicaProc
	// Sec is the cluster's CA, certificates and tokens (always TLS and
	// token authentication, as in a real deployment).
	Sec        *Security
	replicaDir string
	replicaBin string
	// CPAddr is the control plane's host address, 127.0.0.1:CPPort.
	CPAddr string
	CPPort int
	VM     *vm.VM
	Topo   *vm.Topology
	Nodes  []*vm.Node
	// Pods by name.
	Pods   map[string]*vm.Pod
	Client *vm.Netns

	opts     Options
	log      *zap.Logger
	cpCancel context.CancelFunc
	cpDone   chan error

	mu     sync.Mutex
	agents map[string]*vm.Proc // node name -> running agent
	starts map[string]int      // node name -> agent starts so far (process names must be unique)

	stopOnce sync.Once
	stopErr  error
}

// Start brings the whole cluster up: apiserver, control plane, VM, topology,
// Node objects, pods and one agent per node (each awaited until its stream
// is open). On error everything already started is torn down. ctx bounds
// start-up only.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.Nodes < 1 || opts.Nodes > 9 {
		return nil, fmt.Errorf("cluster: Nodes must be 1..9, got %d", opts.Nodes)
	}
	if len(opts.Pods) > opts.Nodes {
		return nil, fmt.Errorf("cluster: pods given for %d nodes, only %d nodes", len(opts.Pods), opts.Nodes)
	}
	for _, n := range opts.NoAgent {
		var k int
		if _, err := fmt.Sscanf(n, "node%d", &k); err != nil || k < 1 || k > opts.Nodes || n != fmt.Sprint("node", k) {
			return nil, fmt.Errorf("cluster: NoAgent names %q, not one of node1..node%d", n, opts.Nodes)
		}
	}
	if opts.ReconcilePeriod == 0 {
		opts.ReconcilePeriod = 30 * time.Second
	}
	if opts.Zone == "" {
		opts.Zone = "zone-a"
	}
	if opts.VMBootTimeout == 0 {
		opts.VMBootTimeout = 5 * time.Minute
	}
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	c := &Cluster{opts: opts, log: log, Pods: map[string]*vm.Pod{}, agents: map[string]*vm.Proc{}, starts: map[string]int{}}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	if opts.Kube.Logger == nil {
		opts.Kube.Logger = log.Named("kubeenv")
	}
	if opts.IPv6 {
		// Appended after kubeenv's own flag: the last one wins.
		svc := opts.Kube.ServiceCIDR
		if svc == "" {
			svc = kubeenv.DefaultServiceCIDR
		}
		opts.Kube.ExtraAPIServerFlags = append(opts.Kube.ExtraAPIServerFlags,
			"--service-cluster-ip-range="+svc+","+vm.ServiceNet6)
	}
	t0 := time.Now()
	c.Env, err = kubeenv.Start(ctx, opts.Kube)
	if err != nil {
		return nil, fmt.Errorf("start etcd + kube-apiserver (binaries: bash scripts/kube/build.sh): %w", err)
	}
	log.Info("apiserver ready", zap.String("host", c.Env.Host), zap.Duration("took", time.Since(t0)))
	c.Kube, err = kubernetes.NewForConfig(c.Env.RESTConfig())
	if err != nil {
		return nil, err
	}

	if err := c.setupSecurity(ctx); err != nil {
		return nil, fmt.Errorf("TLS and tokens: %w", err)
	}
	root, err := measure.RepoRoot(".")
	if err != nil {
		return nil, err
	}
	if err := c.Env.InstallCRDs(ctx, filepath.Join(root, "deploy", "crds")); err != nil {
		return nil, err
	}
	var fwd []int
	if opts.Replicas > 0 {
		if err := c.startReplicaProcs(ctx, opts.Replicas); err != nil {
			return nil, err
		}
		for _, r := range c.ReplicaProcs {
			fwd = append(fwd, r.Port)
		}
	} else {
		if err := c.startReplica(opts, log); err != nil {
			return nil, err
		}
		fwd = []int{c.CPPort}
	}

	fwd = append(fwd, opts.GuestFwdPorts...)
	bins := opts.Binaries
	if opts.KubeProxy {
		kp, port, err := c.kubeProxyInputs()
		if err != nil {
			return nil, err
		}
		bins = append(slices.Clone(bins), kp)
		fwd = append(fwd, port)
	}
	bctx, cancel := context.WithTimeout(ctx, opts.VMBootTimeout)
	defer cancel()
	c.VM, err = vm.Boot(bctx, vm.Options{
		GuestFwdPorts: fwd,
		GoPackages:    append([]string{AgentPackage}, opts.GoPackages...),
		Binaries:      bins,
		Trees:         opts.Trees,
		MemoryMB:      opts.VMMemoryMB,
		BootTimeout:   opts.VMBootTimeout,
		Log:           log.Named("vm"),
	})
	if err != nil {
		return nil, fmt.Errorf("boot VM: %w", err)
	}
	log.Info("VM up", zap.Duration("build", c.VM.BuildTime), zap.Duration("boot", c.VM.BootTime))

	if err := c.buildTopology(ctx); err != nil {
		return nil, err
	}
	for _, r := range c.ReplicaProcs {
		if err := r.AwaitServing(ctx, 2*time.Minute); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, r.LogTail(20))
		}
	}
	for _, n := range c.Nodes {
		if slices.Contains(opts.NoAgent, n.Name) {
			continue
		}
		if err := c.StartAgent(ctx, n.Name); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// startReplica runs the in-process control-plane replica.
func (c *Cluster) startReplica(opts Options, log *zap.Logger) error {
	// The listener is handed to the replica as is: no window in which another
	// process could take the port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	c.CPAddr = ln.Addr().String()
	c.CPPort = ln.Addr().(*net.TCPAddr).Port
	srv, err := tlsfiles.NewServer(c.Sec.Files.Cert, c.Sec.Files.Key)
	if err != nil {
		ln.Close()
		return err
	}
	dyn, err := dynamic.NewForConfig(c.Env.RESTConfig())
	if err != nil {
		ln.Close()
		return err
	}
	c.Replica, err = app.New(app.Config{
		Kube:         c.Kube,
		GRPCListener: ln,
		TLS:          srv.Config(),
		AgentAuth:    auth.NewAgents(c.Kube, SystemNamespace+"/"+AgentServiceAccount).Node,
		InspectAuth:  auth.NewInspectors(c.Kube).Authorize,
		Rollouts:     true,
		Dynamic:      dyn,
		RolloutLease: SystemNamespace + "/vsplane-rollout-leader",
		RolloutTiming: &app.RolloutTiming{LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second,
			RetryPeriod: 500 * time.Millisecond, Interval: 500 * time.Millisecond},
		Watch:  watch.Options{MinInterval: 50 * time.Millisecond},
		Stream: stream.Options{Hooks: opts.StreamHooks},
		// The pod CIDRs are the cluster CIDRs: traffic from the client (a node-
		// network address) to a ClusterIP is then masqueraded like kube-proxy
		// does for off-cluster sources, so replies from other nodes' pods come
		// back through the node that did the IPVS DNAT.
		Translate: opts.translateConfig(),
		Logger:    log.Named("controlplane"),
	})
	if err != nil {
		ln.Close()
		return err
	}
	cpCtx, cpCancel := context.WithCancel(context.Background())
	c.cpCancel, c.cpDone = cpCancel, make(chan error, 1)
	go func() { c.cpDone <- c.Replica.Run(cpCtx) }()
	log.Info("control plane serving", zap.String("addr", c.CPAddr))
	return nil
}

func (c *Cluster) buildTopology(ctx context.Context) error {
	var err error
	if c.Topo, err = vm.NewTopologyWith(ctx, c.VM, vm.TopologyOptions{IPv6: c.opts.IPv6}); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	for i := 0; i < c.opts.Nodes; i++ {
		n, err := c.Topo.AddNode(ctx)
		if err != nil {
			return fmt.Errorf("add node: %w", err)
		}
		c.Nodes = append(c.Nodes, n)
		if _, err := c.Kube.CoreV1().Nodes().Create(ctx, nodeObject(n, c.ZoneOf(i)), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Node %s: %w", n.Name, err)
		}
	}
	if c.Client, err = c.Topo.AddClient(ctx, "client", c.Nodes[0]); err != nil {
		return fmt.Errorf("add client: %w", err)
	}
	for i, pods := range c.opts.Pods {
		for _, p := range pods {
			if _, err := c.AddPod(ctx, c.Nodes[i].Name, p); err != nil {
				return err
			}
		}
	}
	return nil
}

func (o Options) translateConfig() translate.Config {
	cfg := o.Translate
	if len(cfg.ClusterCIDRs) == 0 {
		cfg.ClusterCIDRs = podCIDRs(o.Nodes, o.IPv6)
	}
	return cfg
}

// podCIDRs are the pod networks of nodes 1..n (198.19.N.0/24, as
// vm.Node.PodCIDR; with ipv6 also 2001:2:0:(100+N)::/64, as vm.Node.PodCIDR6).
func podCIDRs(n int, ipv6 bool) []netip.Prefix {
	var out []netip.Prefix
	for i := 1; i <= n; i++ {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(i), 0}), 24))
		if ipv6 {
			out = append(out, netip.MustParsePrefix(fmt.Sprintf("2001:2:0:%d::/64", 100+i)))
		}
	}
	return out
}

// ZoneOf returns the zone label of node i (0 = node1).
func (c *Cluster) ZoneOf(i int) string {
	if i < len(c.opts.Zones) && c.opts.Zones[i] != "" {
		return c.opts.Zones[i]
	}
	return c.opts.Zone
}

func nodeObject(n *vm.Node, zone string) *corev1.Node {
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP}}
	if n.IP6 != "" {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.IP6})
	}
	// spec.podCIDRs as a node IPAM controller would set them (the pod
	// networks the topology routes to the node).
	cidrs := []string{n.PodCIDR}
	if n.PodCIDR6 != "" {
		cidrs = append(cidrs, n.PodCIDR6)
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
			corev1.LabelTopologyZone: zone, corev1.LabelHostname: n.Name,
		}},
		Spec:   corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
		Status: corev1.NodeStatus{Addresses: addrs},
	}
}

// Node returns the node namespace called name (node1, node2, ...).
func (c *Cluster) Node(name string) (*vm.Node, error) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("cluster: no node %q", name)
}

// AddPod creates a pod namespace on node and starts its e2ehelper server
// (TCP and UDP on ServePort), returning once the server is ready.
func (c *Cluster) AddPod(ctx context.Context, node, name string) (*vm.Pod, error) {
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	p, err := n.AddPod(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("add pod %s: %w", name, err)
	}
	proc, err := p.Start(ctx, "serve-"+name, fmt.Sprintf("e2ehelper serve --name %s --tcp :%d --udp :%d", name, ServePort, ServePort))
	if err != nil {
		return nil, fmt.Errorf("start server in %s: %w", name, err)
	}
	if _, err := proc.AwaitLog(ctx, "ready"); err != nil {
		return nil, fmt.Errorf("server in %s: %w", name, err)
	}
	c.mu.Lock()
	c.Pods[name] = p
	c.mu.Unlock()
	return p, nil
}

// AgentCommand is the guest command line of node's agent.
func (c *Cluster) AgentCommand(node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	// --ipv6 is left at auto: a dual-stack topology gives every node a
	// global IPv6 address, so the agents detect it (and an IPv4-only one
	// does not).
	extra := c.opts.AgentArgs
	agent := c.opts.AgentExec
	if e := c.opts.AgentExecs[node]; e != "" {
		agent = e
	}
	if agent == "" {
		agent = "vsplane-agent"
	}
	return fmt.Sprintf("mkdir -p /run/vsplane/%[1]s && exec %[6]s --controlplane %[2]s --node-name %[1]s --state-dir /run/vsplane/%[1]s --reconcile-period %[3]s --metrics-address 127.0.0.1:10249 %[4]s %[5]s",
		node, c.agentTargets(), c.opts.ReconcilePeriod, agentSecurityArgs(node), extra, agent)
}

// SetAgentArgs replaces the extra agent flags (Options.AgentArgs) for
// agents started from now on; running agents keep theirs.
func (c *Cluster) SetAgentArgs(args string) {
	c.mu.Lock()
	c.opts.AgentArgs = args
	c.mu.Unlock()
}

// SetAgentExec replaces the command that runs node's agent
// (Options.AgentExecs; "" falls back to Options.AgentExec) for agents
// started from now on: e.g. StopAgent, SetAgentExec, StartAgent upgrades
// or downgrades node's agent over its state dir.
func (c *Cluster) SetAgentExec(node, exec string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opts.AgentExecs = maps.Clone(c.opts.AgentExecs)
	if c.opts.AgentExecs == nil {
		c.opts.AgentExecs = map[string]string{}
	}
	c.opts.AgentExecs[node] = exec
}

// StartAgent starts node's agent (with the same state dir every time) and
// waits until its stream to the control plane is open.
func (c *Cluster) StartAgent(ctx context.Context, node string) error {
	n, err := c.Node(node)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.agents[node] != nil {
		c.mu.Unlock()
		return fmt.Errorf("cluster: agent on %s already running", node)
	}
	c.starts[node]++
	name := fmt.Sprintf("agent-%s-%d", node, c.starts[node])
	c.mu.Unlock()
	if err := c.provisionAgent(ctx, node); err != nil {
		return fmt.Errorf("credentials of the agent on %s: %w", node, err)
	}
	// "ip netns exec" rather than setns alone: the agent then sees the node's
	// own /sys (kube-ipvs0 and friends).
	proc, err := c.VM.Start(ctx, name, n.Wrap(c.AgentCommand(node)))
	if err != nil {
		return fmt.Errorf("start agent on %s: %w", node, err)
	}
	if _, err := proc.AwaitLog(ctx, "agent stream open"); err != nil {
		_, _ = c.VM.Kill(context.Background(), name, 2*time.Second)
		return fmt.Errorf("agent on %s did not connect: %w", node, err)
	}
	c.mu.Lock()
	c.agents[node] = proc
	c.mu.Unlock()
	c.log.Info("agent connected", zap.String("node", node), zap.String("proc", name))
	return nil
}

// StopAgent stops node's agent (SIGTERM, then SIGKILL after grace) and
// returns its final state, log included.
func (c *Cluster) StopAgent(ctx context.Context, node string, grace time.Duration) (vm.ProcState, error) {
	c.mu.Lock()
	proc := c.agents[node]
	delete(c.agents, node)
	c.mu.Unlock()
	if proc == nil {
		return vm.ProcState{}, fmt.Errorf("cluster: no agent running on %s", node)
	}
	return c.VM.Kill(ctx, proc.Name, grace)
}

// AgentProc returns node's running agent process (nil if none): its PID
// is the leader of the agent's process group in the guest (signals to
// -PID reach the agent).
func (c *Cluster) AgentProc(node string) *vm.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.agents[node]
}

// AgentLog returns the output of node's running agent.
func (c *Cluster) AgentLog(ctx context.Context, node string) (string, error) {
	c.mu.Lock()
	proc := c.agents[node]
	c.mu.Unlock()
	if proc == nil {
		return "", fmt.Errorf("cluster: no agent running on %s", node)
	}
	return proc.Log(ctx)
}

// RunInNode runs a shell script in node's namespace (through "ip netns
// exec", so /sys is the node's) and returns its stdout.
func (c *Cluster) RunInNode(ctx context.Context, node, script string) (string, error) {
	n, err := c.Node(node)
	if err != nil {
		return "", err
	}
	return c.VM.RunOK(ctx, n.Wrap(script))
}

// IPVS returns `ipvsadm -Ln` as run in node.
func (c *Cluster) IPVS(ctx context.Context, node string) (string, error) {
	return c.RunInNode(ctx, node, "ipvsadm -Ln")
}

// Stop tears everything down: agents, VM, control plane, apiserver and its
// temporary directory. Idempotent; it returns the first teardown error.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		var errs []error
		if c.VM != nil {
			c.mu.Lock()
			agents := c.agents
			c.agents = map[string]*vm.Proc{}
			c.mu.Unlock()
			for node, p := range agents {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				if _, err := c.VM.Kill(ctx, p.Name, 3*time.Second); err != nil {
					errs = append(errs, fmt.Errorf("stop agent %s: %w", node, err))
				}
				cancel()
			}
			c.VM.Stop()
		}
		for _, r := range c.ReplicaProcs {
			if err := r.Signal(syscall.SIGKILL); err != nil {
				errs = append(errs, err)
			}
		}
		if c.replicaDir != "" {
			_ = os.RemoveAll(c.replicaDir)
		}
		if c.Sec != nil {
			_ = os.RemoveAll(c.Sec.Dir)
		}
		if c.cpCancel != nil {
			c.cpCancel()
			select {
			case err := <-c.cpDone:
				if err != nil && !errors.Is(err, context.Canceled) {
					errs = append(errs, fmt.Errorf("control plane: %w", err))
				}
			case <-time.After(30 * time.Second):
				errs = append(errs, errors.New("control plane did not stop within 30s"))
			}
		}
		if c.Env != nil {
			if err := c.Env.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("kubeenv: %w", err))
			}
		}
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}

// Await polls cond every interval until it returns nil or ctx/timeout ends;
// the error then carries cond's last answer.
func Await(ctx context.Context, timeout, interval time.Duration, cond func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v: %w", timeout, err)
		case <-time.After(interval):
		}
	}
}

// AwaitServing waits (bounded by timeout) until node has exactly
// virtualServers virtual servers on vip:port (one per protocol), each
// serving exactly want ("addr:port", draining real servers aside).
func (c *Cluster) AwaitServing(ctx context.Context, node, vip string, port int32, virtualServers int, want []string, timeout time.Duration) error {
	want = slices.Sorted(slices.Values(want))
	return Await(ctx, timeout, 500*time.Millisecond, func(ctx context.Context) error {
		out, err := c.IPVS(ctx, node)
		if err != nil {
			return err
		}
		tab, err := ParseIPVSADM(out)
		if err != nil {
			return err
		}
		found := tab.Find(vip, port)
		if len(found) != virtualServers {
			return fmt.Errorf("%s: want %d virtual servers on %s:%d, have:\n%s", node, virtualServers, vip, port, tab)
		}
		for k := range found {
			if got := tab.Serving(k); !slices.Equal(got, want) {
				return fmt.Errorf("%s: %s serves %v, want %v", node, k, got, want)
			}
		}
		return nil
	})
}

// AwaitAcked waits (bounded by timeout) until every node's agent is
// connected to the control plane and has acknowledged all its resources
// (Options.NoAgent nodes only while their agent runs).
func (c *Cluster) AwaitAcked(ctx context.Context, timeout time.Duration) error {
	return Await(ctx, timeout, 200*time.Millisecond, func(ctx context.Context) error {
		agents := map[string]*vsplanev1.AgentInfo{}
		if c.Replica != nil {
			for _, a := range c.Replica.Streams.Registry().ListAgents(false) {
				agents[a.GetNodeName()] = a
			}
		} else {
			resp, err := c.Inspect(ctx)
			if err != nil {
				return err
			}
			for _, a := range resp.GetAgents() {
				agents[a.GetNodeName()] = a
			}
		}
		for _, n := range c.Nodes {
			c.mu.Lock()
			running := c.agents[n.Name] != nil
			c.mu.Unlock()
			if !running && slices.Contains(c.opts.NoAgent, n.Name) {
				continue // an agentless node (kube-proxy, or not started yet)
			}
			a, ok := agents[n.Name]
			if !ok {
				return fmt.Errorf("agent %s not connected", n.Name)
			}
			if p := a.GetPendingResources(); p != 0 || a.GetLastAck() == nil {
				return fmt.Errorf("agent %s has %d resources not acknowledged (acked once: %v)", n.Name, p, a.GetLastAck() != nil)
			}
		}
		return nil
	})
}
