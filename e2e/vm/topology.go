package vm

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// Addresses of the in-VM topology (see README.md for the diagram).
const (
	BridgeName = "vsbr0"
	BridgeIP   = "198.19.0.1"    // VM root namespace on the node bridge
	NodeNet    = "198.19.0.0/24" // node IPs: 198.19.0.(10+N)
	ServiceNet = "198.18.0.0/16" // ClusterIPs, routed to a node by clients
	// IPv6 (TopologyOptions.IPv6): the bridge's, nodes' and clients' /64,
	// pods 2001:2:0:(100+N)::(10+k)/128, Services 2001:2:0:1::/112.
	BridgeIP6   = "2001:2:0:100::1"
	NodeNet6    = "2001:2:0:100::/64"
	ServiceNet6 = "2001:2:0:1::/112"
	// podGW6 is the node side of every pod veth (link-local, like calico's).
	podGW6     = "fe80::1"
	maxNodes   = 100
	maxPods    = 200 // pods per node: 198.19.N.11 .. 198.19.N.210
	maxClients = 50  // clients on the bridge: 198.19.0.201 ..
)

var netnsName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)

// Netns is a network namespace inside the VM.
type Netns struct {
	vm   *VM
	Name string
	IP   string // its primary IPv4 address
	IP6  string // its IPv6 address; "" unless the topology has IPv6
}

// Wrap turns cmd into a root-namespace command that runs it (with /bin/sh -c)
// inside the namespace through "ip netns exec", which also gives it the
// namespace's own /sys.
func (n *Netns) Wrap(cmd string) string {
	return "/usr/sbin/ip netns exec " + n.Name + " /bin/sh -c " + ShellQuote(cmd)
}

// Run runs cmd inside the namespace (see VM.RunIn).
func (n *Netns) Run(ctx context.Context, cmd string) (Result, error) {
	return n.vm.RunIn(ctx, n.Name, cmd)
}

// RunOK runs cmd inside the namespace and returns its stdout (see VM.RunInOK).
func (n *Netns) RunOK(ctx context.Context, cmd string) (string, error) {
	return n.vm.RunInOK(ctx, n.Name, cmd)
}

// Start starts a background process inside the namespace (see VM.StartIn).
func (n *Netns) Start(ctx context.Context, name, cmd string) (*Proc, error) {
	// exec: the process group's leader is the program itself, so Kill's
	// SIGTERM reaches it directly.
	return n.vm.StartIn(ctx, n.Name, name, "exec "+cmd)
}

// Node is a node's network namespace: eth0 on the bridge with 198.19.0.(10+N),
// one routed veth per pod.
type Node struct {
	Netns
	Index   int
	PodCIDR string // 198.19.N.0/24
	PodGW   string // 198.19.N.1: the node's side of every pod veth
	// PodCIDR6 is 2001:2:0:(100+N)::/64; "" unless the topology has IPv6.
	PodCIDR6 string
	topo     *Topology
	pods     int
}

// Pod is a pod's network namespace, its eth0 a veth to its node.
type Pod struct {
	Netns
	Node *Node
}

// Topology builds node, pod and client namespaces in a VM. Methods are safe
// for concurrent use; every name must be unique in the VM.
type Topology struct {
	vm      *VM
	opts    TopologyOptions
	mu      sync.Mutex
	nodes   []*Node
	clients int
	names   map[string]bool
}

// TopologyOptions configure NewTopologyWith. The zero value is IPv4 only.
type TopologyOptions struct {
	// IPv6 gives every namespace an address from 2001:2::/48 as well (see
	// the constants), routed like the IPv4 ones. Duplicate address
	// detection is off in every namespace, so addresses work at once.
	IPv6 bool
}

// NewTopology is NewTopologyWith with the zero TopologyOptions (IPv4 only).
func NewTopology(ctx context.Context, v *VM) (*Topology, error) {
	return NewTopologyWith(ctx, v, TopologyOptions{})
}

// NewTopologyWith sets up the VM root namespace: bridge vsbr0 (198.19.0.1/24,
// with IPv6 also 2001:2:0:100::1/64) and MASQUERADE of node and pod traffic
// leaving through eth0, so that every namespace reaches the host's forwarded
// loopback ports at 198.19.255.100. The Service range is unreachable there:
// a packet for a Service address no node serves (a deleted Service) fails in
// the VM instead of leaving it through slirp. Call it once per VM.
func NewTopologyWith(ctx context.Context, v *VM, opts TopologyOptions) (*Topology, error) {
	script := fmt.Sprintf(`set -e
/usr/sbin/ip -batch - <<EOF
link add %[1]s type bridge
addr add %[2]s/24 dev %[1]s
link set %[1]s up
EOF
iptables -t nat -A POSTROUTING -s 198.19.0.0/16 -o eth0 -j MASQUERADE
/usr/sbin/ip route add unreachable %[3]s
`, BridgeName, BridgeIP, ServiceNet)
	if opts.IPv6 {
		// New namespaces inherit the root's settings (IPv6 included), so
		// DAD is off everywhere: no tentative addresses, no waiting.
		script += fmt.Sprintf(`echo 1 > /proc/sys/net/core/devconf_inherit_init_net
echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad
echo 1 > /proc/sys/net/ipv6/conf/all/forwarding
/usr/sbin/ip addr add %s/64 dev %s nodad
/usr/sbin/ip -6 route add unreachable %s
`, BridgeIP6, BridgeName, ServiceNet6)
	}
	if _, err := v.RunOK(ctx, script); err != nil {
		return nil, fmt.Errorf("set up VM root namespace: %w", err)
	}
	return &Topology{vm: v, opts: opts, names: map[string]bool{}}, nil
}

// IPv6 reports whether the topology gives namespaces IPv6 addresses.
func (t *Topology) IPv6() bool { return t.opts.IPv6 }

// Nodes returns the nodes added so far, in order.
func (t *Topology) Nodes() []*Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*Node(nil), t.nodes...)
}

func (t *Topology) claim(name string) error {
	if !netnsName.MatchString(name) {
		return fmt.Errorf("invalid namespace name %q (want %s)", name, netnsName)
	}
	if t.names[name] {
		return fmt.Errorf("namespace %q already exists", name)
	}
	t.names[name] = true
	return nil
}

// AddNode creates the next node namespace "node<N>" (N = 1, 2, ...), routes
// its pod CIDR from the root namespace and from every other node.
func (t *Topology) AddNode(ctx context.Context) (*Node, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := len(t.nodes) + 1
	if idx > maxNodes {
		return nil, fmt.Errorf("at most %d nodes", maxNodes)
	}
	name := fmt.Sprintf("node%d", idx)
	if err := t.claim(name); err != nil {
		return nil, err
	}
	n := &Node{
		Netns:   Netns{vm: t.vm, Name: name, IP: fmt.Sprintf("198.19.0.%d", 10+idx)},
		Index:   idx,
		PodCIDR: fmt.Sprintf("198.19.%d.0/24", idx),
		PodGW:   fmt.Sprintf("198.19.%d.1", idx),
		topo:    t,
	}
	if t.opts.IPv6 {
		n.IP6 = fmt.Sprintf("2001:2:0:100::%d", 10+idx)
		n.PodCIDR6 = fmt.Sprintf("2001:2:0:%d::/64", 100+idx)
	}
	var b strings.Builder
	// Few processes: each exec of a dynamically linked program costs ~0.3 s under TCG.
	fmt.Fprintf(&b, `set -e
/usr/sbin/ip netns add %[1]s
/usr/sbin/ip -batch - <<EOF
link add vsn%[2]d type veth peer name eth0 netns %[1]s
link set vsn%[2]d master %[3]s up
route add %[6]s via %[4]s
EOF
/usr/sbin/ip -n %[1]s -batch - <<EOF
link set lo up
link set eth0 up
addr add %[4]s/24 dev eth0
route add default via %[5]s
EOF
`, name, idx, BridgeName, n.IP, BridgeIP, n.PodCIDR)
	if t.opts.IPv6 {
		fmt.Fprintf(&b, `/usr/sbin/ip route add %[3]s via %[4]s
/usr/sbin/ip -n %[1]s -batch - <<EOF
addr add %[4]s/64 dev eth0 nodad
route add ::/0 via %[2]s
EOF
`, name, BridgeIP6, n.PodCIDR6, n.IP6)
	}
	for _, o := range t.nodes {
		fmt.Fprintf(&b, "/usr/sbin/ip -n %s route add %s via %s\n", o.Name, n.PodCIDR, n.IP)
		fmt.Fprintf(&b, "/usr/sbin/ip -n %s route add %s via %s\n", n.Name, o.PodCIDR, o.IP)
		if t.opts.IPv6 {
			fmt.Fprintf(&b, "/usr/sbin/ip -n %s route add %s via %s\n", o.Name, n.PodCIDR6, n.IP6)
			fmt.Fprintf(&b, "/usr/sbin/ip -n %s route add %s via %s\n", n.Name, o.PodCIDR6, o.IP6)
		}
	}
	if _, err := t.vm.RunOK(ctx, b.String()); err != nil {
		return nil, fmt.Errorf("add node %s: %w", name, err)
	}
	// /proc/sys/net is the reader's namespace's.
	sysctls := `echo 1 > /proc/sys/net/ipv4/ip_forward
echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter
echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter`
	if t.opts.IPv6 {
		sysctls += "\necho 1 > /proc/sys/net/ipv6/conf/all/forwarding"
	}
	if _, err := n.RunOK(ctx, sysctls); err != nil {
		return nil, fmt.Errorf("add node %s: %w", name, err)
	}
	t.nodes = append(t.nodes, n)
	return n, nil
}

// AddPod creates a pod namespace named name on the node, with the next free
// address 198.19.N.(10+k) on a veth routed by the node (a /32 with the node's
// 198.19.N.1 as gateway, so all pod traffic crosses the node's IP stack, IPVS
// included).
func (n *Node) AddPod(ctx context.Context, name string) (*Pod, error) {
	t := n.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	if n.pods >= maxPods {
		return nil, fmt.Errorf("at most %d pods per node", maxPods)
	}
	if err := t.claim(name); err != nil {
		return nil, err
	}
	k := n.pods + 1
	p := &Pod{Netns: Netns{vm: t.vm, Name: name, IP: fmt.Sprintf("198.19.%d.%d", n.Index, 10+k)}, Node: n}
	if t.opts.IPv6 {
		p.IP6 = fmt.Sprintf("2001:2:0:%d::%d", 100+n.Index, 10+k)
	}
	script := fmt.Sprintf(`set -e
/usr/sbin/ip netns add %[1]s
/usr/sbin/ip -n %[2]s -batch - <<EOF
link add vp%[3]d type veth peer name eth0 netns %[1]s
link set vp%[3]d up
addr add %[4]s/32 dev vp%[3]d
route add %[5]s/32 dev vp%[3]d
EOF
/usr/sbin/ip -n %[1]s -batch - <<EOF
link set lo up
link set eth0 up
addr add %[5]s/32 dev eth0
route add %[4]s dev eth0 scope link
route add default via %[4]s dev eth0
EOF
`, name, n.Name, k, n.PodGW, p.IP)
	if t.opts.IPv6 {
		// The node answers for fe80::1 on every pod veth; the pod's /128
		// is routed to its veth.
		script += fmt.Sprintf(`/usr/sbin/ip -n %[2]s -batch - <<EOF
addr add %[4]s/64 dev vp%[3]d nodad
route add %[5]s/128 dev vp%[3]d
EOF
/usr/sbin/ip -n %[1]s -batch - <<EOF
addr add %[5]s/128 dev eth0 nodad
route add ::/0 via %[4]s dev eth0
EOF
`, name, n.Name, k, podGW6, p.IP6)
	}
	if _, err := t.vm.RunOK(ctx, script); err != nil {
		delete(t.names, name)
		return nil, fmt.Errorf("add pod %s on %s: %w", name, n.Name, err)
	}
	n.pods = k
	return p, nil
}

// AddClient creates a client namespace on the bridge (198.19.0.(200+k)),
// default route via the VM root namespace. If via is not nil, the service
// range 198.18.0.0/16 is routed to that node, as an external client's router
// would.
func (t *Topology) AddClient(ctx context.Context, name string, via *Node) (*Netns, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.clients >= maxClients {
		return nil, fmt.Errorf("at most %d clients", maxClients)
	}
	if err := t.claim(name); err != nil {
		return nil, err
	}
	k := t.clients + 1
	c := &Netns{vm: t.vm, Name: name, IP: fmt.Sprintf("198.19.0.%d", 200+k)}
	if t.opts.IPv6 {
		c.IP6 = fmt.Sprintf("2001:2:0:100::%d", 200+k)
	}
	script := fmt.Sprintf(`set -e
/usr/sbin/ip netns add %[1]s
/usr/sbin/ip -batch - <<EOF
link add vsc%[2]d type veth peer name eth0 netns %[1]s
link set vsc%[2]d master %[3]s up
EOF
/usr/sbin/ip -n %[1]s -batch - <<EOF
link set lo up
link set eth0 up
addr add %[4]s/24 dev eth0
route add default via %[5]s
EOF
`, name, k, BridgeName, c.IP, BridgeIP)
	if t.opts.IPv6 {
		script += fmt.Sprintf(`/usr/sbin/ip -n %[1]s -batch - <<EOF
addr add %[2]s/64 dev eth0 nodad
route add ::/0 via %[3]s
EOF
`, name, c.IP6, BridgeIP6)
	}
	if via != nil {
		script += fmt.Sprintf("/usr/sbin/ip -n %s route add %s via %s\n", name, ServiceNet, via.IP)
		if t.opts.IPv6 {
			script += fmt.Sprintf("/usr/sbin/ip -n %s route add %s via %s\n", name, ServiceNet6, via.IP6)
		}
	}
	if _, err := t.vm.RunOK(ctx, script); err != nil {
		delete(t.names, name)
		return nil, fmt.Errorf("add client %s: %w", name, err)
	}
	t.clients = k
	return c, nil
}

// RouteVia routes dst (a CIDR or an address, IPv4 or IPv6) from this
// namespace through via's address of the same family, replacing any route
// to exactly dst: how a test points one client's traffic for an external
// or load-balancer IP at a chosen node, as an external router would.
func (n *Netns) RouteVia(ctx context.Context, dst string, via *Node) error {
	gw := via.IP
	if strings.Contains(dst, ":") {
		if via.IP6 == "" {
			return fmt.Errorf("route %s via %s: the topology has no IPv6", dst, via.Name)
		}
		gw = via.IP6
	}
	if _, err := n.vm.RunOK(ctx, fmt.Sprintf("/usr/sbin/ip -n %s route replace %s via %s", n.Name, dst, gw)); err != nil {
		return fmt.Errorf("route %s via %s in %s: %w", dst, via.Name, n.Name, err)
	}
	return nil
}

// ShellQuote quotes s as one word for a POSIX shell.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
