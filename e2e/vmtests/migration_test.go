package vmtests

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// migrationAdoptWrites is every kernel write the agent makes when it takes
// over the state kube-proxy v1.37 (IPVS mode, same settings) left behind,
// in its first Ack: exactly what differs, nothing that is already right.
// A regression that flushes and re-creates shows up here as
// ipvs_add_service, ipset_create, addr_bind or ipset_add writes.
var migrationAdoptWrites = map[string]uint32{
	// One iptables-restore --noflush for migrationAdoptRules (each table
	// it writes is replaced in one commit: no packet sees a half-written
	// chain).
	"iptables_restore": 1,
}

// migrationAdoptRules are the rules the agent has and kube-proxy's IPVS
// proxier has not (filter table, each inserted before the line named):
// vsplane drops INVALID forwarded packets like kube-proxy's iptables
// proxier does, unless nf_conntrack_tcp_be_liberal is set
// (dataplane/rules/chains.go, kubernetes#74839). kube-proxy deletes it
// again when it takes the node back.
var migrationAdoptRules = []struct{ rule, before string }{
	{"-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP", "-A KUBE-FORWARD "},
}

// withAdoptRules is s with migrationAdoptRules added.
func withAdoptRules(t *testing.T, s kernelState) kernelState {
	t.Helper()
	out := kernelState{sections: maps.Clone(s.sections)}
	for _, r := range migrationAdoptRules {
		lines := out.sections["filter"]
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, r.before) })
		if i < 0 {
			t.Fatalf("no %q in kube-proxy's filter table:\n%s", r.before, strings.Join(lines, "\n"))
		}
		out.sections["filter"] = slices.Insert(slices.Clone(lines), i, r.rule)
	}
	return out
}

// TestVMMigrateFromKubeProxy is a migration from kube-proxy on one node:
// kube-proxy v1.37 (IPVS mode) serves a ClusterIP Service and a NodePort
// Service, both endpoints on the node, while the client sends a request
// every 50 ms to each; then, the loops spanning each switch:
//
//	to the agent: kube-proxy gets SIGTERM (the kernel stays exactly as it
//	  was), the vsplane agent starts on the node, adopts that state and
//	  writes only migrationAdoptWrites: the result is kube-proxy's state
//	  plus migrationAdoptRules, and a full reconcile later writes nothing;
//	back: the agent gets SIGTERM (the kernel stays as it was), kube-proxy
//	  starts again, and the kernel is again exactly what kube-proxy had;
//	to the agent again, now with the first agent's state file: the same.
//
// No request fails. The ipsets' initvals (in `ipset save`) show that no
// set was ever re-created; IPVS and kube-ipvs0 never change.
func TestVMMigrateFromKubeProxy(t *testing.T) {
	run := newVMRun(t, 6*time.Minute)
	ctx, phase := run.ctx, run.phase
	const node = "node1"
	var (
		mu   sync.Mutex
		acks []stream.AckEvent
	)
	c := run.startCluster(cluster.Options{
		Nodes: 1,
		// Both endpoints on the node: the client's requests need no
		// masquerading, whichever proxy runs (the cluster CIDR of both is
		// the node's pod CIDR, 198.19.1.0/24).
		Pods:            [][]string{{"pod-a", "pod-b"}},
		NoAgent:         []string{node},
		KubeProxy:       true,
		ReconcilePeriod: 5 * time.Second,
		StreamHooks: stream.Hooks{OnAck: func(ev stream.AckEvent) {
			if ev.Node == node {
				mu.Lock()
				acks = append(acks, ev)
				mu.Unlock()
			}
		}},
		Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	n1, err := c.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	phase("apiserver+control plane+VM")

	// The Services: ClusterIP "web" and NodePort "web-np", endpoints pod-a and pod-b.
	var eps []cluster.Endpoint
	var want []string
	for _, p := range []string{"pod-a", "pod-b"} {
		ep, err := c.PodEndpoint(p, false)
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
		want = append(want, fmt.Sprintf("%s:%d", ep.IP, cluster.ServePort))
	}
	svcPorts := []cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	var vips []string
	var nodePort int32
	for _, typ := range []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort} {
		name := "web"
		if typ == corev1.ServiceTypeNodePort {
			name = "web-np"
		}
		svc, err := c.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Type: typ, Ports: []corev1.ServicePort{{Name: "http", Port: 80,
				Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(cluster.ServePort)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		vips = append(vips, svc.Spec.ClusterIP)
		if typ == corev1.ServiceTypeNodePort {
			nodePort = svc.Spec.Ports[0].NodePort
		}
		if err := c.ApplySlice(ctx, ns, name, name+"-1", discoveryv1.AddressTypeIPv4, svcPorts, eps); err != nil {
			t.Fatal(err)
		}
	}
	targets := map[string]string{
		"clusterip": vips[0] + ":80",
		"nodeport":  fmt.Sprintf("%s:%d", n1.IP, nodePort),
	}

	startKubeProxy := func(t *testing.T) *vm.Proc {
		t.Helper()
		// --v=4 logs the end of every sync ("syncProxyRules complete").
		kp, err := c.StartKubeProxy(ctx, node, cluster.KubeProxyOptions{IPv4Only: true, Verbosity: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				if l, err := kp.Log(context.Background()); err == nil {
					t.Logf("kube-proxy log tail:\n%s", tail(l, 40))
				}
			}
		})
		// Synced: a full sync finished (kube-proxy syncs only after both
		// informers synced, so the first one has everything).
		sctx, cancel := context.WithTimeout(ctx, converge)
		defer cancel()
		if _, err := kp.AwaitLog(sctx, "syncProxyRules complete"); err != nil {
			t.Fatal(err)
		}
		for _, vip := range []string{vips[0], vips[1]} {
			if err := c.AwaitServing(ctx, node, vip, 80, 1, want, converge); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.AwaitServing(ctx, node, n1.IP, nodePort, 1, want, converge); err != nil {
			t.Fatal(err)
		}
		return kp
	}
	kp := startKubeProxy(t)
	byKubeProxy := captureKernel(t, ctx, c, node)
	t.Logf("kube-proxy's kernel state:\n%s", byKubeProxy)
	phase("kube-proxy serving both Services")

	var loopN int
	// switchOver runs the switch while a request loop per target spans it:
	// the loops start before it, and stop (between two requests) once
	// each has answered settle more requests after it; none may fail.
	switchOver := func(t *testing.T, name string, settle int, sw func(t *testing.T)) {
		t.Helper()
		loopN++
		stop := fmt.Sprintf("/tmp/migration-stop-%d", loopN)
		loops := map[string]*vm.Proc{}
		for _, what := range slices.Sorted(maps.Keys(targets)) {
			p, err := c.Client.Start(ctx, name+"-"+what, fmt.Sprintf(
				"e2ehelper request --proto tcp --addr %s --count 6000 --timeout 2s --interval 50ms --stop-file %s", targets[what], stop))
			if err != nil {
				t.Fatal(err)
			}
			loops[what] = p
			t.Cleanup(func() { _, _ = c.VM.Kill(context.Background(), p.Name, time.Second) })
		}
		actx, cancel := context.WithTimeout(ctx, converge)
		defer cancel()
		for what, p := range loops {
			if _, err := p.AwaitLog(actx, "\n3 ok"); err != nil {
				t.Fatalf("%s loop: %v", what, err)
			}
		}
		sw(t)
		// settle more answers after the switch from each loop.
		marks := map[string]int{}
		for what, p := range loops {
			l, err := p.Log(ctx)
			if err != nil {
				t.Fatal(err)
			}
			marks[what] = strings.Count(l, "\n")
		}
		actx, cancel = context.WithTimeout(ctx, converge)
		defer cancel()
		for what, p := range loops {
			if _, err := p.AwaitLog(actx, fmt.Sprintf("\n%d ", marks[what]+settle)); err != nil {
				t.Fatalf("%s loop: %v", what, err)
			}
		}
		if _, err := c.VM.RunOK(ctx, "touch "+stop); err != nil {
			t.Fatal(err)
		}
		for _, what := range slices.Sorted(maps.Keys(loops)) {
			sum, out, err := cluster.LoopResult(ctx, loops[what])
			if err != nil {
				t.Fatalf("%s loop: %v\n%s", what, err, tail(out, 20))
			}
			t.Logf("%s %s (%s): %d ok, %d failed, by backend %v", name, what, targets[what], sum.OK, sum.Fail, sum.Backends)
			if sum.Fail != 0 || sum.OK < marks[what]+settle-1 {
				t.Errorf("%s %s: %d ok, %d failed\n%s", name, what, sum.OK, sum.Fail, failedLines(out))
			}
		}
	}

	// toAgent stops kube-proxy and starts the agent under the loops, then
	// checks what the agent wrote and that the result is kube-proxy's state
	// plus exactly migrationAdoptRules.
	toAgent := func(t *testing.T, name string) {
		before := captureKernel(t, ctx, c, node)
		mu.Lock()
		acks = nil
		mu.Unlock()
		switchOver(t, name, 20, func(t *testing.T) {
			t0 := time.Now()
			st, err := c.VM.Kill(ctx, kp.Name, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("kube-proxy stopped (SIGTERM, exit %d)", st.ExitCode)
			defer func() { t.Logf("kube-proxy's SIGTERM to the agent's Ack: %v", time.Since(t0).Round(time.Millisecond)) }()
			// kube-proxy has no cleanup on SIGTERM: its state stays.
			if d := before.diff(captureKernel(t, ctx, c, node)); d != "" {
				t.Fatalf("kube-proxy changed the kernel on SIGTERM (-running +stopped):\n%s", d)
			}
			if err := c.StartAgent(ctx, node); err != nil {
				t.Fatal(err)
			}
			if err := c.AwaitAcked(ctx, converge); err != nil {
				t.Fatal(err)
			}
		})
		mu.Lock()
		got := map[string]uint32{}
		for _, a := range acks {
			if a.Status != vsplanev1.AckStatus_ACK_STATUS_ACK {
				t.Errorf("Ack %s: %v %v", a.Nonce, a.Status, a.Errors)
			}
			for op, n := range a.KernelOperations {
				got[op] += n
			}
		}
		t.Logf("%d Ack(s), kernel writes %v", len(acks), got)
		mu.Unlock()
		if d := cmp.Diff(migrationAdoptWrites, got); d != "" {
			t.Errorf("the agent's kernel writes on adoption (-want +got):\n%s", d)
		}
		adopted := captureKernel(t, ctx, c, node)
		t.Logf("what the agent changed (-kube-proxy +agent):\n%s", before.diff(adopted))
		if d := withAdoptRules(t, before).diff(adopted); d != "" {
			t.Errorf("the kernel after adoption is not kube-proxy's plus migrationAdoptRules (-want +got):\n%s", d)
		}
		// A full reconcile (every 5 s) finds nothing more to do: the agent
		// does not fight anything kube-proxy left.
		var m map[string]float64
		mustAwait(t, ctx, func(ctx context.Context) error {
			var err error
			if m, err = agentMetrics(ctx, c, node); err != nil {
				return err
			}
			if m["vsplane_agent_full_reconciles_total"] < 1 {
				return fmt.Errorf("no full reconcile yet")
			}
			return nil
		})
		if r := sumPrefix(m, "vsplane_agent_drift_repairs_total"); r != 0 {
			t.Errorf("full reconciles after adoption repaired %v kernel items", r)
		}
		if w := sumPrefix(m, "vsplane_agent_kernel_operations_total"); w != float64(sumOps(got)) {
			t.Errorf("the agent's metrics count %v kernel writes, its Acks %d", w, sumOps(got))
		}
	}

	t.Run("kube-proxy to agent", func(t *testing.T) { toAgent(t, "to-agent") })
	phase("kube-proxy -> agent")

	t.Run("agent back to kube-proxy", func(t *testing.T) {
		before := captureKernel(t, ctx, c, node)
		switchOver(t, "to-kube-proxy", 20, func(t *testing.T) {
			t0 := time.Now()
			defer func() {
				t.Logf("the agent's SIGTERM to kube-proxy's first sync: %v", time.Since(t0).Round(time.Millisecond))
			}()
			st, err := c.StopAgent(ctx, node, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("agent stopped (SIGTERM, exit %d)", st.ExitCode)
			// The agent has no cleanup on SIGTERM either.
			if d := before.diff(captureKernel(t, ctx, c, node)); d != "" {
				t.Fatalf("the agent changed the kernel on SIGTERM (-running +stopped):\n%s", d)
			}
			kp = startKubeProxy(t)
		})
		back := captureKernel(t, ctx, c, node)
		t.Logf("what kube-proxy changed (-agent +kube-proxy):\n%s", before.diff(back))
		// kube-proxy takes back its own rules and changes nothing else:
		// the ipsets' initvals say none was re-created.
		if d := byKubeProxy.diff(back); d != "" {
			t.Errorf("the kernel differs from kube-proxy's first run (-first +again):\n%s", d)
		}
	})
	phase("agent -> kube-proxy")

	// Forth again, now with the first agent's state file in its state dir
	// (a restarted agent widens its first Delta to everything it restored
	// and compares all of it with the kernel): the same writes.
	t.Run("kube-proxy to agent again", func(t *testing.T) { toAgent(t, "to-agent-again") })
	phase("kube-proxy -> agent (state file)")
}

// kernelState is what a proxy leaves in a node's kernel, normalized for
// comparison: `ipvsadm -Sn`, `ipset save` (with each set's initval, which
// changes when a set is re-created), the addresses of kube-ipvs0, the
// nat and filter tables without counters, and the IPVS sysctls.
type kernelState struct {
	sections map[string][]string
}

var kernelSections = []string{"ipvs", "ipset", "kube-ipvs0", "nat", "filter", "sysctl"}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

func captureKernel(t *testing.T, ctx context.Context, c *cluster.Cluster, node string) kernelState {
	t.Helper()
	out, err := c.RunInNode(ctx, node, `echo '#ipvs'; ipvsadm -Sn | sort
echo '#ipset'; ipset save | sort
echo '#kube-ipvs0'; /usr/sbin/ip -o addr show dev kube-ipvs0 | awk '{print $3, $4}' | sort
echo '#nat'; iptables-save -t nat
echo '#filter'; iptables-save -t filter
echo '#sysctl'; cd /proc/sys/net/ipv4 && grep . vs/conntrack vs/expire_nodest_conn vs/expire_quiescent_template vs/conn_reuse_mode ip_forward conf/all/arp_ignore conf/all/arp_announce`)
	if err != nil {
		t.Fatal(err)
	}
	s := kernelState{sections: map[string][]string{}}
	cur := ""
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "#") && slices.Contains(kernelSections, l[1:]):
			cur = l[1:]
		case l == "", strings.HasPrefix(l, "# "), cur == "":
		default:
			s.sections[cur] = append(s.sections[cur], counters.ReplaceAllString(l, "[0:0]"))
		}
	}
	return s
}

func (s kernelState) String() string {
	var b strings.Builder
	for _, sec := range kernelSections {
		fmt.Fprintf(&b, "# %s\n%s\n", sec, strings.Join(s.sections[sec], "\n"))
	}
	return b.String()
}

// diff is every difference, section by section ("" if none).
func (s kernelState) diff(o kernelState) string { return s.diffOf(o, kernelSections) }

// diffServing compares what carries the traffic and its identity: IPVS,
// the ipsets and kube-ipvs0.
func (s kernelState) diffServing(o kernelState) string {
	return s.diffOf(o, []string{"ipvs", "ipset", "kube-ipvs0"})
}

func (s kernelState) diffOf(o kernelState, sections []string) string {
	var b strings.Builder
	for _, sec := range sections {
		if d := cmp.Diff(s.sections[sec], o.sections[sec]); d != "" {
			fmt.Fprintf(&b, "%s:\n%s", sec, d)
		}
	}
	return b.String()
}

// agentMetrics reads node's agent's vsplane_agent_* metrics as
// "name{labels}" -> value. (kube-proxy's metrics server does not answer
// busybox wget or nc in the VM; "syncProxyRules complete" in its log
// tells when it synced.)
func agentMetrics(ctx context.Context, c *cluster.Cluster, node string) (map[string]float64, error) {
	text, err := c.RunInNode(ctx, node, "wget -qO- http://127.0.0.1:10249/metrics | grep '^vsplane_agent_'")
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for _, l := range strings.Split(text, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", l, err)
		}
		m[l[:i]] = v
	}
	return m, nil
}

func sumPrefix(m map[string]float64, prefix string) float64 {
	var n float64
	for k, v := range m {
		if k == prefix || strings.HasPrefix(k, prefix+"{") {
			n += v
		}
	}
	return n
}

func sumOps(m map[string]uint32) uint32 {
	var n uint32
	for _, v := range m {
		n += v
	}
	return n
}

// failedLines are the loop's failed requests.
func failedLines(out string) string {
	var f []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " fail: ") {
			f = append(f, l)
		}
	}
	return strings.Join(f, "\n")
}
