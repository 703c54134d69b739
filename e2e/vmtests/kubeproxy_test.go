package vmtests

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// TestVMKubeProxyParity runs the reference next to vsplane on one kernel:
// kube-proxy v1.37 (IPVS mode, built by scripts/kube/build.sh) in node1,
// the vsplane agent fed by the control plane in node2, the same apiserver
// and objects. Both must program the same virtual servers (address, port,
// protocol, scheduler, persistence) with the same real servers and weights,
// bind the same addresses to kube-ipvs0 and fill KUBE-CLUSTER-IP alike,
// after the initial sync and after one endpoint is replaced. It is the tiny,
// always-run version of e2e/vmbench's TestVMBenchKubeProxy (parity, not
// timing), so neither can rot.
func TestVMKubeProxyParity(t *testing.T) {
	run := newVMRun(t, 4*time.Minute)
	ctx, phase := run.ctx, run.phase
	const kp, agent = "node1", "node2"
	// ipvsprobe, the benchmark's reader, runs here too so it cannot rot.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := run.startCluster(cluster.Options{
		Nodes:         2,
		NoAgent:       []string{kp},
		KubeProxy:     true,
		GoPackages:    []string{vm.ProbePackage},
		GuestFwdPorts: []int{ln.Addr().(*net.TCPAddr).Port},
		Log:           zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	probe, err := vm.StartProbe(ctx, c.VM, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Stop()
	phase("apiserver+control plane+VM+agent")

	const services, endpoints = 5, 3
	ports := []cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}
	for i := range services {
		name := fmt.Sprintf("parity-%d", i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		for _, p := range ports {
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol,
				TargetPort: intstr.FromInt32(cluster.ServePort)})
		}
		if i == 0 {
			svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}
		if _, err := c.Kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Endpoints in the benchmarking range that nothing answers on, and
		// a not-ready one both must leave out.
		eps := []cluster.Endpoint{{IP: fmt.Sprintf("198.19.200.%d", i+1), NotReady: true}}
		for j := range endpoints {
			eps = append(eps, cluster.Endpoint{IP: fmt.Sprintf("198.19.%d.%d", 100+j, i+1)})
		}
		if err := c.ApplySlice(ctx, ns, name, name+"-1", discoveryv1.AddressTypeIPv4, ports, eps); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.AwaitAcked(ctx, converge); err != nil {
		t.Fatal(err)
	}
	phase("5 Services programmed by the agent")

	proc, err := c.StartKubeProxy(ctx, kp, cluster.KubeProxyOptions{IPv4Only: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if l, err := proc.Log(context.Background()); err == nil {
				t.Logf("kube-proxy log tail:\n%s", tail(l, 40))
			}
		}
	})
	// 2 virtual servers per Service and the apiserver's own "kubernetes"
	// Service (no endpoints here), each Service's with `endpoints` real servers.
	awaitParity(t, ctx, c, kp, agent, 2*services+1, 2*services*endpoints, services+1)
	phase("kube-proxy initial sync, same kernel state as the agent")

	// The change the way the benchmark times it: ipvsprobe polls both
	// nodes for the new real server from before the write.
	svc, err := c.Kube.CoreV1().Services(ns).Get(ctx, "parity-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := probe.Send(wire.ProbeRequest{Op: wire.ProbeAwaitRS, Netns: []string{kp, agent}, IntervalMS: 10, TimeoutMS: 60000,
		Targets: []wire.ProbeTarget{{VS: svc.Spec.ClusterIP + ":80", RS: "198.19.201.1:8080"}}})
	if err != nil {
		t.Fatal(err)
	}
	eps := []cluster.Endpoint{{IP: "198.19.201.1"}}
	for j := 1; j < endpoints; j++ {
		eps = append(eps, cluster.Endpoint{IP: fmt.Sprintf("198.19.%d.3", 100+j)})
	}
	seen := map[string]bool{}
	for done := false; !done; {
		ev, err := probe.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.ID != id {
			continue
		}
		switch ev.Kind {
		case "polling":
			if err := c.ApplySlice(ctx, ns, "parity-2", "parity-2-1", discoveryv1.AddressTypeIPv4, ports, eps); err != nil {
				t.Fatal(err)
			}
		case "seen":
			seen[ev.Netns] = true
		}
		done = ev.Final
	}
	if !seen[kp] || !seen[agent] {
		t.Fatalf("ipvsprobe saw the new real server in %v, want %s and %s", seen, kp, agent)
	}
	awaitParity(t, ctx, c, kp, agent, 2*services+1, 2*services*endpoints, services+1, "198.19.201.1:8080")
	phase("one endpoint replaced, same kernel state again")

	// ipvsprobe's netlink view agrees, and it finds both processes.
	d, err := probe.Diff(ctx, kp, agent, wire.ProbeFilter{CIDR: vm.ServiceNet})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Same || d.VS != 2*services+1 || d.RS != 2*services*endpoints {
		t.Fatalf("ipvsprobe diff: %+v", d)
	}
	ps, err := probe.Procs(ctx, []string{"kube-proxy", "--hostname-override=" + kp}, []string{"vsplane-agent", "--node-name " + agent})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].VmHWMKB == 0 || ps[1].VmHWMKB == 0 {
		t.Fatalf("ipvsprobe procs: %+v", ps)
	}
	for _, p := range ps {
		t.Logf("%s: peak RSS %d MB, CPU %.1f s (children %.1f s)", strings.Fields(p.Cmdline)[0], p.VmHWMKB>>10, p.CPUSeconds(), p.ChildCPUSeconds())
	}
}

// awaitParity waits until node a and node b both hold vs virtual servers
// in the Service range with rs serving real servers, among them every one
// of want, as many KUBE-CLUSTER-IP entries and addrs addresses on
// kube-ipvs0, and then requires all of it (draining real servers aside) to
// be equal on both. kube-proxy fills the ipsets after IPVS, one ipset
// command per entry, so the wait covers both.
func awaitParity(t *testing.T, ctx context.Context, c *cluster.Cluster, a, b string, vs, rs, addrs int, want ...string) {
	t.Helper()
	tables := map[string]cluster.IPVSTable{}
	other := map[string][]string{}
	mustAwait(t, ctx, func(ctx context.Context) error {
		for _, node := range []string{a, b} {
			out, err := c.RunInNode(ctx, node, "ipvsadm -Ln && echo '#' && ipset list KUBE-CLUSTER-IP | sed '1,/^Members:/d' && /usr/sbin/ip -o addr show dev kube-ipvs0")
			if err != nil {
				return err
			}
			ipvs, rest, _ := strings.Cut(out, "#\n")
			tab, err := cluster.ParseIPVSADM(ipvs)
			if err != nil {
				return err
			}
			tab = serviceRange(tab).WithoutDraining()
			n, all := 0, ""
			for k, v := range tab {
				n += len(v)
				all += k + " " + strings.Join(v, " ") + "\n"
			}
			if len(tab) != vs || n != rs {
				return fmt.Errorf("%s has %d virtual / %d real servers, want %d / %d:\n%s", node, len(tab), n, vs, rs, tab)
			}
			for _, w := range want {
				if !strings.Contains(all, w+" ") {
					return fmt.Errorf("%s lacks real server %s:\n%s", node, w, tab)
				}
			}
			var o []string
			for _, l := range strings.Split(rest, "\n") {
				if f := strings.Fields(l); len(f) == 1 {
					o = append(o, "KUBE-CLUSTER-IP "+f[0])
				} else if len(f) > 3 && f[2] == "inet" {
					o = append(o, "kube-ipvs0 "+f[3])
				}
			}
			slices.Sort(o)
			if len(o) != vs+addrs {
				return fmt.Errorf("%s has %d KUBE-CLUSTER-IP entries and kube-ipvs0 addresses, want %d + %d: %q", node, len(o), vs, addrs, o)
			}
			tables[node], other[node] = tab, o
		}
		return nil
	})
	if diff := cmp.Diff(tables[a], tables[b]); diff != "" {
		t.Fatalf("IPVS of kube-proxy (%s, -) and the vsplane agent (%s, +) differ:\n%s", a, b, diff)
	}
	if diff := cmp.Diff(other[a], other[b]); diff != "" {
		t.Fatalf("KUBE-CLUSTER-IP or kube-ipvs0 of kube-proxy (%s, -) and the vsplane agent (%s, +) differ:\n%s", a, b, diff)
	}
	t.Logf("%s and %s hold the same %d virtual servers (and the same KUBE-CLUSTER-IP entries and kube-ipvs0 addresses):\n%s",
		a, b, len(tables[a]), tables[a])
}

// serviceRange keeps the virtual servers on Service addresses (kube-proxy
// briefly adds a probe virtual server on 198.51.100.0 at start).
func serviceRange(t cluster.IPVSTable) cluster.IPVSTable {
	out := cluster.IPVSTable{}
	for k, v := range t {
		if f := strings.Fields(k); len(f) > 1 && strings.HasPrefix(f[1], "198.18.") {
			out[k] = v
		}
	}
	return out
}
