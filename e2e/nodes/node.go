package nodes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/e2e/vm"
)

// ProxyPort is the port of the HTTP CONNECT proxy in the VM's root
// namespace (e2ehelper connect-proxy): the apiserver's way to kubelets and
// Pods, through QEMU's hostfwd (vm.Options.HostFwdPorts).
const ProxyPort = 7100

// nsDir holds each node's mount and UTS namespace, bind-mounted so that
// commands can enter them after the process that made them is gone.
const nsDir = "/run/vsnode"

// cgroupControllers are what the kubelet needs enabled for its Pods.
const cgroupControllers = "+cpuset +cpu +io +memory +pids +hugetlb"

// Bed is the real-node layer of a booted VM (vm.Options.TmpfsRoot, the node
// disk as its first disk): the disk mounted at /opt/vsnode, the OCI runtime
// installed, cgroup v2 controllers enabled, and the CONNECT proxy running.
type Bed struct {
	VM     *vm.VM
	Images []DiskImage
	log    *zap.Logger
	proxy  *vm.Proc
}

// Prepare sets the VM up for nodes; call it once per VM.
func Prepare(ctx context.Context, v *vm.VM, images []DiskImage, log *zap.Logger) (*Bed, error) {
	if log == nil {
		log = zap.NewNop()
	}
	script := fmt.Sprintf(`set -e
modprobe -a virtio_blk ext4 overlay
[ -b /dev/vda ] || { echo "no node disk at /dev/vda" >&2; exit 1; }
mkdir -p %[1]s
mount -o ro /dev/vda %[1]s
cp -a %[1]s/root/. /
echo "%[2]s" > /sys/fs/cgroup/cgroup.subtree_control
mkdir -p %[3]s
mount --bind %[3]s %[3]s
mount --make-private %[3]s
`, guestDisk, cgroupControllers, nsDir)
	if _, err := v.RunOK(ctx, script); err != nil {
		return nil, fmt.Errorf("nodes: preparing the VM: %w", err)
	}
	proxy, err := v.Start(ctx, "connect-proxy", fmt.Sprintf("exec e2ehelper connect-proxy --listen :%d --allow 198.18.0.0/15", ProxyPort))
	if err != nil {
		return nil, err
	}
	if _, err := proxy.AwaitLog(ctx, "connect-proxy serving"); err != nil {
		return nil, fmt.Errorf("nodes: CONNECT proxy: %w", err)
	}
	return &Bed{VM: v, Images: images, log: log, proxy: proxy}, nil
}

// Node is one real node: a network namespace of the topology plus its own
// mount and UTS namespaces (hostname = the node's name), with its own
// containerd and kubelet under the cgroup vsnode-NAME. Its methods are
// safe for concurrent use.
type Node struct {
	Name  string
	Netns *vm.Node
	bed   *Bed
	log   *zap.Logger

	mu       sync.Mutex
	procs    map[string]*vm.Proc // containerd, kubelet
	starts   map[string]int
	imported bool
	podCIDR  string
}

// Credentials are what a node's kubelet authenticates with: a kubeconfig
// (client certificate of system:node:NAME) and the cluster's CA.
type Credentials struct {
	Kubeconfig []byte
	CA         []byte
}

// AddNode turns the topology node n into a real node: namespaces, tmpfs
// mounts at the standard paths (/run, /var/lib/kubelet, /var/lib/containerd,
// /var/log, /etc/cni/net.d, /var/lib/cni, /etc/kubernetes, /etc/containerd),
// the CNI plugins at /opt/cni/bin and the configuration files. Nothing runs
// yet (StartRuntime, StartKubelet).
func (b *Bed) AddNode(ctx context.Context, n *vm.Node, creds Credentials) (*Node, error) {
	node := &Node{Name: n.Name, Netns: n, bed: b, log: b.log.With(zap.String("node", n.Name)),
		procs: map[string]*vm.Proc{}, starts: map[string]int{}}
	mounts := []string{"/run", "/var/lib/kubelet", "/var/lib/containerd", "/var/log", "/etc/cni/net.d",
		"/var/lib/cni", "/etc/kubernetes", "/etc/containerd"}
	script := fmt.Sprintf(`set -e
C=/sys/fs/cgroup/%[1]s
mkdir -p $C/system
echo "%[2]s" > $C/cgroup.subtree_control
touch %[3]s/%[4]s.mnt %[3]s/%[4]s.uts
unshare --mount=%[3]s/%[4]s.mnt --uts=%[3]s/%[4]s.uts --propagation private true
nsenter --mount=%[3]s/%[4]s.mnt --uts=%[3]s/%[4]s.uts -F -- sh -s <<'EOF'
set -e
hostname %[4]s
mount --make-rshared /
for d in %[5]s; do mkdir -p $d; mount -t tmpfs -o mode=755 vsnode-%[4]s $d; done
mkdir -p /opt/cni/bin /var/log/pods /var/log/containers
mount --bind %[6]s /opt/cni/bin
touch /run/xtables.lock %[7]s
EOF
`, node.cgroup(), cgroupControllers, nsDir, n.Name, strings.Join(mounts, " "), guestCNI, nodeResolvConf)
	if _, err := b.VM.RunOK(ctx, script); err != nil {
		return nil, fmt.Errorf("nodes: setting up %s: %w", n.Name, err)
	}
	cc, err := containerdConfigFor()
	if err != nil {
		return nil, err
	}
	kc, err := kubeletConfigFor(node.cgroup())
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		path string
		data []byte
	}{{containerdConfig, cc}, {kubeletConfig, kc}, {kubeletKubecfg, creds.Kubeconfig}, {clusterCAFile, creds.CA}} {
		if err := node.WriteFile(ctx, f.path, f.data); err != nil {
			return nil, err
		}
	}
	return node, nil
}

// cgroup is the node's cgroup (relative to the VM's root cgroup): the
// kubelet's cgroupRoot, with the node's daemons in its "system" child.
func (n *Node) cgroup() string { return "vsnode-" + n.Name }

// IP is the node's address (its InternalIP).
func (n *Node) IP() string { return n.Netns.IP }

// Wrap makes cmd (sh -c) run inside the node's mount and UTS namespaces;
// vmexec enters its network namespace.
func (n *Node) Wrap(cmd string) string {
	return fmt.Sprintf("nsenter --mount=%[1]s/%[2]s.mnt --uts=%[1]s/%[2]s.uts -F -- /bin/sh -c %[3]s",
		nsDir, n.Name, vm.ShellQuote(cmd))
}

// Run runs cmd on the node (its network, mount and UTS namespaces).
func (n *Node) Run(ctx context.Context, cmd string) (vm.Result, error) {
	return n.bed.VM.RunIn(ctx, n.Name, n.Wrap(cmd))
}

// RunOK is Run that fails unless cmd exits 0, quoting its output.
func (n *Node) RunOK(ctx context.Context, cmd string) (string, error) {
	r, err := n.Run(ctx, cmd)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		return r.Stdout, fmt.Errorf("on %s: %q: %w", n.Name, cmd, err)
	}
	return r.Stdout, nil
}

// WriteFile writes data to path in the node's mount namespace.
func (n *Node) WriteFile(ctx context.Context, path string, data []byte) error {
	r, err := n.bed.VM.RunInWithInput(ctx, n.Name, n.Wrap("cat > "+vm.ShellQuote(path)), data)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		return fmt.Errorf("on %s: writing %s: %w", n.Name, path, err)
	}
	return nil
}

// start runs a node daemon in the background in the node's namespaces and
// in its cgroup's system child.
func (n *Node) start(ctx context.Context, daemon, cmd string) (*vm.Proc, error) {
	n.mu.Lock()
	if p := n.procs[daemon]; p != nil {
		n.mu.Unlock()
		return nil, fmt.Errorf("%s on %s is running already", daemon, n.Name)
	}
	n.starts[daemon]++
	name := fmt.Sprintf("%s-%s-%d", daemon, n.Name, n.starts[daemon])
	n.mu.Unlock()
	full := fmt.Sprintf("echo $$ > /sys/fs/cgroup/%s/system/cgroup.procs && exec nsenter --mount=%s/%s.mnt --uts=%s/%s.uts -F -- %s",
		n.cgroup(), nsDir, n.Name, nsDir, n.Name, cmd)
	p, err := n.bed.VM.StartIn(ctx, n.Name, name, full)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.procs[daemon] = p
	n.mu.Unlock()
	return p, nil
}

func (n *Node) stop(ctx context.Context, daemon string) error {
	n.mu.Lock()
	p := n.procs[daemon]
	delete(n.procs, daemon)
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	_, err := p.Kill(ctx)
	return err
}

// StartRuntime starts containerd and, the first time, imports every image
// of the disk into it (namespace k8s.io, what the kubelet uses), checking
// each one's manifest digest against the builder's. A failed import is an
// error naming the image.
func (n *Node) StartRuntime(ctx context.Context) error {
	if _, err := n.start(ctx, "containerd", guestBin+"/containerd --config "+containerdConfig); err != nil {
		return err
	}
	if _, err := n.RunOK(ctx, fmt.Sprintf("i=0; until %s/ctr --address %s version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 600 ] || { echo containerd did not answer >&2; exit 1; }; sleep 0.1; done",
		guestBin, containerdSocket)); err != nil {
		return fmt.Errorf("containerd on %s: %w\n%s", n.Name, err, n.LogTail(ctx, "containerd", 20))
	}
	n.mu.Lock()
	imported := n.imported
	n.mu.Unlock()
	if imported {
		return nil
	}
	t0 := time.Now()
	if err := n.importImages(ctx, n.bed.Images); err != nil {
		return err
	}
	n.mu.Lock()
	n.imported = true
	n.mu.Unlock()
	n.log.Info("images imported", zap.Int("images", len(n.bed.Images)), zap.Duration("took", time.Since(t0)))
	return nil
}

// importImages imports the disk's image archives one by one and checks
// that containerd holds each under its reference with its digest.
func (n *Node) importImages(ctx context.Context, imgs []DiskImage) error {
	for _, img := range imgs {
		archive := guestImages + "/" + img.Name() + ".tar"
		if err := n.ImportImage(ctx, img.Ref, img.Digest, archive); err != nil {
			return err
		}
	}
	return nil
}

// ImportImage imports the OCI archive at guestPath (in the node) as ref and
// fails, naming the image, unless containerd then holds ref with digest.
func (n *Node) ImportImage(ctx context.Context, ref, digest, guestPath string) error {
	ctr := fmt.Sprintf("%s/ctr --address %s -n k8s.io", guestBin, containerdSocket)
	r, err := n.Run(ctx, fmt.Sprintf("%s images import --local %s && %s images ls", ctr, vm.ShellQuote(guestPath), ctr))
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		return fmt.Errorf("node %s: importing image %s from %s failed: %w", n.Name, ref, guestPath, err)
	}
	got := ""
	sc := bufio.NewScanner(strings.NewReader(r.Stdout))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == ref {
			got = f[2]
		}
	}
	switch {
	case got == "":
		return fmt.Errorf("node %s: image %s is not in containerd after importing %s", n.Name, ref, guestPath)
	case got != digest:
		return fmt.Errorf("node %s: image %s has digest %s in containerd, the builder made %s", n.Name, ref, got, digest)
	}
	return nil
}

// StopRuntime stops containerd (SIGTERM): running containers keep running
// under their shims, the kubelet reports the runtime down.
func (n *Node) StopRuntime(ctx context.Context) error { return n.stop(ctx, "containerd") }

// StartKubelet starts the kubelet: it registers Node NAME with InternalIP
// IP() and gets its Pod range from kube-controller-manager.
func (n *Node) StartKubelet(ctx context.Context) error {
	_, err := n.start(ctx, "kubelet", fmt.Sprintf("%s/kubelet --config %s --kubeconfig %s --node-ip %s --hostname-override %s --v=1",
		guestBin, kubeletConfig, kubeletKubecfg, n.IP(), n.Name))
	return err
}

// StartKubeProxy runs kube-proxy on the node as a node daemon, the way
// hack/local-up-cluster.sh runs it: kubeconfig is its credentials (user
// system:kube-proxy, whom the default RBAC policy binds to
// system:node-proxier), args its flags after --kubeconfig and
// --hostname-override. It returns once kube-proxy logged
// the proxier it uses (logLine, e.g. "Using ipvs Proxier").
func (n *Node) StartKubeProxy(ctx context.Context, kubeconfig []byte, logLine string, args ...string) error {
	if err := n.WriteFile(ctx, kubeProxyKubecfg, kubeconfig); err != nil {
		return err
	}
	cmd := fmt.Sprintf("%s/kube-proxy --kubeconfig %s --hostname-override %s %s",
		guestBin, kubeProxyKubecfg, n.Name, strings.Join(args, " "))
	p, err := n.start(ctx, "kube-proxy", cmd)
	if err != nil {
		return err
	}
	if _, err := p.AwaitLog(ctx, logLine); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w\n%s", n.Name, err, n.LogTail(ctx, "kube-proxy", 30))
	}
	return nil
}

// StopKubelet stops the kubelet (SIGTERM).
func (n *Node) StopKubelet(ctx context.Context) error { return n.stop(ctx, "kubelet") }

// SetPodCIDR writes the node's CNI configuration for its Pod range (what
// a CNI daemon does once kube-controller-manager assigned spec.podCIDR).
func (n *Node) SetPodCIDR(ctx context.Context, cidr string) error {
	conf, err := cniConfigFor(cidr)
	if err != nil {
		return err
	}
	if err := n.WriteFile(ctx, cniConfig, conf); err != nil {
		return err
	}
	n.mu.Lock()
	n.podCIDR = cidr
	n.mu.Unlock()
	return nil
}

// PodCIDR is the range SetPodCIDR gave the node ("" before).
func (n *Node) PodCIDR() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.podCIDR
}

// DaemonLog is the whole log of the node's daemon (kube-proxy, kubelet,
// containerd) as started last.
func (n *Node) DaemonLog(ctx context.Context, daemon string) (string, error) {
	n.mu.Lock()
	p := n.procs[daemon]
	n.mu.Unlock()
	if p == nil {
		return "", fmt.Errorf("%s on %s is not running", daemon, n.Name)
	}
	return p.Log(ctx)
}

// LogTail returns the last lines of a node daemon's log ("kubelet",
// "containerd"), for failure messages.
func (n *Node) LogTail(ctx context.Context, daemon string, lines int) string {
	n.mu.Lock()
	p := n.procs[daemon]
	n.mu.Unlock()
	if p == nil {
		return fmt.Sprintf("(%s on %s is not running)", daemon, n.Name)
	}
	log, err := p.Log(ctx)
	if err != nil {
		return fmt.Sprintf("(%s log: %v)", daemon, err)
	}
	ls := strings.Split(strings.TrimRight(log, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return fmt.Sprintf("--- %s on %s ---\n%s", daemon, n.Name, strings.Join(ls, "\n"))
}

// Stop stops the node's kube-proxy (if any) and kubelet, then containerd.
func (n *Node) Stop(ctx context.Context) error {
	return errors.Join(n.stop(ctx, "kube-proxy"), n.StopKubelet(ctx), n.StopRuntime(ctx))
}
