package vmtests

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
)

// TestVMNodeSettings checks the node settings the control plane pushes
// (NodePort addresses and node settings) on a real kernel: strictARP sysctls, IPVS
// timeouts, nodePortAddresses limiting where NodePorts answer,
// excludeCIDRs protecting foreign virtual servers from the agent's prune,
// the per-namespace conntrack settings, and detectLocalMode
// InterfaceNamePrefix telling Pods by their veths.
func TestVMNodeSettings(t *testing.T) {
	run := newVMRun(t, 6*time.Minute)
	ctx := run.ctx

	c := run.startCluster(cluster.Options{
		Nodes:           1,
		Pods:            [][]string{{"pod-a", "pod-b"}},
		ReconcilePeriod: reconcilePeriod,
		Translate: translate.Config{
			// The node side of every pod veth is vpN (e2e/vm); no cluster CIDRs.
			LocalDetect: translate.LocalDetect{Mode: translate.LocalByInterfacePrefix, Interface: "vp"},
			StrictARP:   true,
			TCPTimeout:  900 * time.Second, TCPFinTimeout: 60 * time.Second, UDPTimeout: 120 * time.Second,
			// Only the node network: not the pod gateway 198.19.1.1 on the pod veths.
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix(vm.NodeNet)},
			ExcludeCIDRs:      []netip.Prefix{netip.MustParsePrefix("198.18.250.0/24")},
			// The per-namespace conntrack sysctls (nf_conntrack_max and the
			// hashsize are host-wide: read-only in a node's namespace).
			Conntrack: translate.Conntrack{TCPEstablishedTimeout: 2 * time.Hour, TCPCloseWaitTimeout: 30 * time.Minute,
				TCPBeLiberal: true, UDPTimeout: 45 * time.Second, UDPStreamTimeout: 150 * time.Second},
		},
		Log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	run.phase("cluster up")
	e := &semEnv{c: c, ctx: ctx, client: c.Client, node1: c.Nodes[0]}
	node := e.node1

	svc := e.create(t, service("np", corev1.ServiceTypeNodePort, 80, corev1.ProtocolTCP))
	e.slice(t, svc, discoveryv1.AddressTypeIPv4, e.pods(t, false, "pod-a")...)
	np := nodePortOf(t, svc, corev1.ProtocolTCP)

	t.Run("strictARP and IPVS timeouts", func(t *testing.T) {
		mustAwait(t, ctx, func(ctx context.Context) error {
			out, err := c.RunInNode(ctx, "node1", "cat /proc/sys/net/ipv4/conf/all/arp_ignore /proc/sys/net/ipv4/conf/all/arp_announce; ipvsadm -L --timeout")
			if err != nil {
				return err
			}
			f := strings.Fields(out)
			if len(f) < 2 || f[0] != "1" || f[1] != "2" {
				return fmt.Errorf("strictARP: want arp_ignore 1 and arp_announce 2, have:\n%s", out)
			}
			if !strings.Contains(out, "Timeout (tcp tcpfin udp): 900 60 120") {
				return fmt.Errorf("want IPVS timeouts 900 60 120, have:\n%s", out)
			}
			return nil
		})
	})

	t.Run("conntrack timeouts and tcp_be_liberal", func(t *testing.T) {
		const want = "7200 1800 1 45 150"
		mustAwait(t, ctx, func(ctx context.Context) error {
			out, err := c.RunInNode(ctx, "node1", "cd /proc/sys/net/netfilter && cat nf_conntrack_tcp_timeout_established "+
				"nf_conntrack_tcp_timeout_close_wait nf_conntrack_tcp_be_liberal nf_conntrack_udp_timeout nf_conntrack_udp_timeout_stream")
			if err != nil {
				return err
			}
			if got := strings.Join(strings.Fields(out), " "); got != want {
				return fmt.Errorf("conntrack established, close_wait, be_liberal, udp, udp_stream: %s, want %s", got, want)
			}
			return nil
		})
	})

	t.Run("nodePortAddresses limit the NodePort to the selected addresses", func(t *testing.T) {
		e.await(t, e.client, "tcp", hostPort(node.IP, np), 5, only("pod-a"))
		if err := c.AwaitAcked(ctx, converge); err != nil {
			t.Fatal(err)
		}
		tab, err := e.table(ctx, "node1")
		if err != nil {
			t.Fatal(err)
		}
		// node1 also holds 198.19.1.1 (its side of the pod veth), outside
		// nodePortAddresses: no virtual server there, nothing answers.
		if got := tab.Find(node.PodGW, np); len(got) != 0 {
			t.Errorf("NodePort programmed on %s, outside nodePortAddresses %s: %v", node.PodGW, vm.NodeNet, got)
		}
		out := e.mustFail(t, e.client, "tcp", hostPort(node.PodGW, np), 2, "1s")
		t.Logf("client -> %s:%d (not a NodePort address): %q", node.PodGW, np, failLines(out))
	})

	t.Run("detectLocalMode InterfaceNamePrefix tells Pods by their veths", func(t *testing.T) {
		// An ETP Local load balancer: a client inside the cluster gets
		// Cluster semantics (masqueraded through the fwmark server), an
		// outside one the Local policy (its own address). Which is which is
		// only told by the interface the connection arrives on: vp2 for
		// pod-b, the node network for the client.
		const lb = "198.18.200.9"
		loc := service("loc", corev1.ServiceTypeLoadBalancer, 80, corev1.ProtocolTCP)
		loc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		loc = e.setIngress(t, e.create(t, loc), lb)
		e.slice(t, loc, discoveryv1.AddressTypeIPv4, e.pods(t, false, "pod-a")...)
		if err := e.client.RouteVia(ctx, lb+"/32", node); err != nil {
			t.Fatal(err)
		}
		// Programmed first: the Local server answers pod-b too until the
		// in-cluster rules are in.
		if err := c.AwaitAcked(ctx, converge); err != nil {
			t.Fatal(err)
		}
		podB := c.Pods["pod-b"]
		for _, tc := range []struct {
			from *vm.Netns
			src  string
		}{{&podB.Netns, node.PodGW}, {e.client, e.client.IP}} {
			_, out := e.await(t, tc.from, "tcp", hostPort(lb, 80), 4, only("pod-a"))
			for b, srcs := range peers(out) {
				if !slices.Equal(srcs, []string{tc.src}) {
					t.Errorf("%s -> %s: %s saw sources %v, want %s", tc.from.Name, lb, b, srcs, tc.src)
				}
			}
		}
		nat, err := c.RunInNode(ctx, "node1", "iptables-save -t nat")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"-A KUBE-SERVICES -i vp+ -j VSPLANE-IN-CLUSTER", "-A KUBE-SERVICES ! -i vp+ -m comment"} {
			if !strings.Contains(nat, want) {
				t.Errorf("no %q in node1's nat table:\n%s", want, nat)
			}
		}
	})

	t.Run("excludeCIDRs keep foreign virtual servers through the prune", func(t *testing.T) {
		// Both addresses on kube-ipvs0 make the virtual servers look like
		// the agent's own; only the one outside excludeCIDRs may go.
		if _, err := c.RunInNode(ctx, "node1", `set -e
/usr/sbin/ip addr add 198.18.250.1/32 dev kube-ipvs0
/usr/sbin/ip addr add 198.18.251.1/32 dev kube-ipvs0
ipvsadm -A -t 198.18.250.1:80 -s rr
ipvsadm -A -t 198.18.251.1:80 -s rr`); err != nil {
			t.Fatal(err)
		}
		err := cluster.Await(ctx, reconcilePeriod+30*time.Second, poll, func(ctx context.Context) error {
			tab, err := e.table(ctx, "node1")
			if err != nil {
				return err
			}
			if len(tab.Find("198.18.251.1", 80)) != 0 {
				return fmt.Errorf("foreign virtual server 198.18.251.1:80 (outside excludeCIDRs) not pruned:\n%s", tab)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		tab, err := e.table(ctx, "node1")
		if err != nil {
			t.Fatal(err)
		}
		if len(tab.Find("198.18.250.1", 80)) != 1 {
			t.Errorf("virtual server 198.18.250.1:80 inside excludeCIDRs was deleted:\n%s", tab)
		}
		addrs, err := e.kubeIPVS0(ctx, "node1")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(addrs, " 198.18.250.1/32 ") {
			t.Errorf("198.18.250.1 (inside excludeCIDRs) was unbound from kube-ipvs0:\n%s", addrs)
		}
	})
}
