package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/vsplane/vsplane/e2e/vm"
)

// KubeProxyBinary is kube-proxy's file name in the kube binaries' directory
// (scripts/kube/build.sh builds it next to kube-apiserver).
const KubeProxyBinary = "kube-proxy"

// KubeProxyOptions configure StartKubeProxy.
type KubeProxyOptions struct {
	// Mode is --proxy-mode: "ipvs" (the default), "nftables" (kube-proxy
	// runs Debian's nft, put into the guest by scripts/vm/build-initramfs.sh)
	// or "iptables".
	Mode string
	// IPv4Only sets net.ipv6.conf.all.disable_ipv6=1 in the node namespace
	// first, so kube-proxy runs its single-stack IPv4 proxier as on an
	// IPv4-only node. Otherwise it runs its dual-stack proxier whenever the
	// kernel has IPv6 (the VM's has), a second full sync per change.
	IPv4Only bool
	// Verbosity is --v (default 2).
	Verbosity int
	// Args are extra flags, after the defaults (the last one wins).
	Args []string
}

// kubeProxyInputs returns the kube-proxy binary to put into the guest and
// the apiserver port the guest must reach (Options.KubeProxy).
func (c *Cluster) kubeProxyInputs() (string, int, error) {
	bin := filepath.Join(c.Env.BinDir, KubeProxyBinary)
	st, err := os.Stat(bin)
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", 0, fmt.Errorf("cluster: no executable kube-proxy at %s (run bash scripts/kube/build.sh): %v", bin, err)
	}
	port, err := c.apiPort()
	return bin, port, err
}

func (c *Cluster) apiPort() (int, error) {
	u, err := url.Parse(c.Env.Host)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Port())
}

// GuestAPIServer is the apiserver's URL as the guest reaches it through
// guestfwd (only with Options.KubeProxy): https://198.19.255.100:PORT.
func (c *Cluster) GuestAPIServer() (string, error) {
	port, err := c.apiPort()
	if err != nil {
		return "", err
	}
	return "https://" + net.JoinHostPort(vm.HostLoopIP, strconv.Itoa(port)), nil
}

// GuestKubeconfig is kubeenv's admin kubeconfig (client certificate of
// group system:masters) pointed at GuestAPIServer, with TLS server name
// "localhost": the apiserver's certificate names 127.0.0.1 and localhost,
// not the guestfwd address.
func (c *Cluster) GuestKubeconfig() ([]byte, error) {
	server, err := c.GuestAPIServer()
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.LoadFromFile(c.Env.Kubeconfig)
	if err != nil {
		return nil, err
	}
	for _, cl := range cfg.Clusters {
		cl.Server, cl.TLSServerName = server, "localhost"
	}
	return clientcmd.Write(*cfg)
}

// KubeProxyArgs are the flags StartKubeProxy gives kube-proxy on node:
// o.Mode (IPVS by default), the node's name, metrics (10249) and healthz (10256) on the
// namespace's loopback, the cluster CIDRs (one per family: the smallest
// prefix covering them), and conntrack sizing off (nf_conntrack_max and
// the hash size are VM-wide, not the namespace's).
func (c *Cluster) KubeProxyArgs(node string, o KubeProxyOptions) []string {
	v := o.Verbosity
	if v == 0 {
		v = 2
	}
	args := []string{
		"--kubeconfig=" + kubeProxyDir(node) + "/kubeconfig",
		"--proxy-mode=" + o.mode(),
		"--hostname-override=" + node,
		"--metrics-bind-address=127.0.0.1:10249",
		"--healthz-bind-address=127.0.0.1:10256",
		"--cluster-cidr=" + strings.Join(kubeProxyCIDRs(c.opts.translateConfig().ClusterCIDRs), ","),
		"--conntrack-max-per-core=0",
		"--v=" + strconv.Itoa(v),
	}
	return append(args, o.Args...)
}

func (o KubeProxyOptions) mode() string {
	if o.Mode == "" {
		return "ipvs"
	}
	return o.Mode
}

func kubeProxyDir(node string) string { return "/run/kube-proxy/" + node }

// kubeProxyCIDRs returns one prefix per family covering that family's
// cidrs (kube-proxy takes at most one cluster CIDR per family).
func kubeProxyCIDRs(cidrs []netip.Prefix) []string {
	var out []string
	for _, v4 := range []bool{true, false} {
		var cover netip.Prefix
		for _, p := range cidrs {
			if p.Addr().Is4() != v4 {
				continue
			}
			p = p.Masked()
			if !cover.IsValid() {
				cover = p
				continue
			}
			for !cover.Contains(p.Addr()) || cover.Bits() > p.Bits() {
				cover = netip.PrefixFrom(cover.Addr(), cover.Bits()-1).Masked()
			}
		}
		if cover.IsValid() {
			out = append(out, cover.String())
		}
	}
	return out
}

// StartKubeProxy runs kube-proxy in node's namespace (through "ip netns
// exec", like the agent) with KubeProxyArgs, its kubeconfig written to
// /run/kube-proxy/<node>/kubeconfig, and returns once kube-proxy logged
// that it uses the proxier of o.Mode. Needs Options.KubeProxy and a node that
// runs no agent. The process is called "kube-proxy-<node>-<n>".
func (c *Cluster) StartKubeProxy(ctx context.Context, node string, o KubeProxyOptions) (*vm.Proc, error) {
	if !c.opts.KubeProxy {
		return nil, fmt.Errorf("cluster: StartKubeProxy needs Options.KubeProxy")
	}
	if m := o.mode(); m != "ipvs" && m != "nftables" && m != "iptables" {
		return nil, fmt.Errorf("cluster: kube-proxy mode %q: want ipvs, nftables or iptables", m)
	}
	n, err := c.Node(node)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.agents[node] != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("cluster: %s runs a vsplane agent", node)
	}
	c.starts["kube-proxy-"+node]++
	name := fmt.Sprintf("kube-proxy-%s-%d", node, c.starts["kube-proxy-"+node])
	c.mu.Unlock()
	kc, err := c.GuestKubeconfig()
	if err != nil {
		return nil, err
	}
	if strings.Contains(string(kc), "'") {
		return nil, fmt.Errorf("cluster: unexpected quote in the kubeconfig")
	}
	script := fmt.Sprintf("mkdir -p %[1]s && printf '%%s' '%[2]s' > %[1]s/kubeconfig", kubeProxyDir(node), kc)
	if o.IPv4Only {
		script += " && echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"
	}
	if _, err := c.RunInNode(ctx, node, script); err != nil {
		return nil, err
	}
	cmd := "exec kube-proxy " + strings.Join(c.KubeProxyArgs(node, o), " ")
	proc, err := c.VM.Start(ctx, name, n.Wrap(cmd))
	if err != nil {
		return nil, fmt.Errorf("start kube-proxy on %s: %w", node, err)
	}
	if _, err := proc.AwaitLog(ctx, "Using "+o.mode()+" Proxier"); err != nil {
		_, _ = c.VM.Kill(context.Background(), name, 2*time.Second)
		return nil, fmt.Errorf("kube-proxy on %s: %w", node, err)
	}
	return proc, nil
}
