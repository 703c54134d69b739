//go:build vmbench

package vmbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/e2e/vm/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// The kube-proxy comparison: one apiserver and the same objects; node1
// runs kube-proxy v1.37 in IPVS mode and node3 in nftables mode (both
// reaching the host apiserver through guestfwd), node2 the vsplane agent
// fed by the control plane on the host. Everything each one's kernel holds
// is read by ipvsprobe (one guest process, netlink: IPVS, and kube-proxy's
// nftables chains), and every time is a host clock difference.
const (
	kpNode, vsNode, nftNode = "node1", "node2", "node3"
	kpEndpoints             = 10
	kpNamespace             = "default"
	kpTargetPort            = 8080
)

// kpPorts are each Service's ports (both TCP: graceful termination makes
// a replaced real server weight 0 first in both implementations).
var kpPorts = []corev1.ServicePort{
	{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(kpTargetPort)},
	{Name: "https", Port: 8443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(kpTargetPort)},
}

// kpFilter selects the benchmark's virtual servers (the apiserver's own
// "kubernetes" Service is on 443; kube-proxy's start-up probe on
// 198.51.100.0:20000).
var kpFilter = wire.ProbeFilter{CIDR: vm.ServiceNet, Ports: []uint16{80, 8443}}

func kpSizes(t *testing.T) []int {
	s := os.Getenv("VSPLANE_VMBENCH_KP_SERVICES")
	if s == "" {
		return []int{1000}
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 20000 {
			t.Fatalf("VSPLANE_VMBENCH_KP_SERVICES=%q: want comma-separated counts of 1..20000", s)
		}
		out = append(out, n)
	}
	return out
}

// kpQuiet is VSPLANE_VMBENCH_KP_QUIET: how long the quiet phase after the
// changes lasts (default 10m; 0 skips it).
func kpQuiet(t *testing.T) time.Duration {
	s := os.Getenv("VSPLANE_VMBENCH_KP_QUIET")
	if s == "" {
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		t.Fatalf("VSPLANE_VMBENCH_KP_QUIET=%q: want a duration, e.g. 10m", s)
	}
	return d
}

func kpChanges(t *testing.T) int {
	s := os.Getenv("VSPLANE_VMBENCH_KP_CHANGES")
	if s == "" {
		return 10
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("VSPLANE_VMBENCH_KP_CHANGES=%q: want a positive count", s)
	}
	return n
}

// TestVMBenchKubeProxy measures node apply side by side with kube-proxy
// (IPVS and nftables modes) at VSPLANE_VMBENCH_KP_SERVICES Services (default 1000; e.g. 1000,5000,10000,
// each size in a fresh cluster), 2 ports x 10 endpoints each: cold start
// into an empty kernel, VSPLANE_VMBENCH_KP_CHANGES (default 10) one-endpoint
// changes, VSPLANE_VMBENCH_KP_QUIET (default 10m) in which nothing changes,
// peak RSS and CPU. kube-proxy runs single-stack (IPv6 disabled in
// its namespace, as on an IPv4-only node) unless VSPLANE_VMBENCH_KP_DUALSTACK=1;
// VSPLANE_VMBENCH_KP_AGENT_ARGS are extra agent flags (e.g.
// "--reconcile-period=1h"; give such a run its own VSPLANE_VMBENCH_KP_REPORT).
// Results: bench/results/kubeproxy.{json,md} (or VSPLANE_VMBENCH_KP_REPORT). kube-proxy's initial sync runs
// one ipset command per entry: about 2 minutes per 1,000 Services under TCG,
// so 10,000 needs a -timeout of several hours.
func TestVMBenchKubeProxy(t *testing.T) {
	sizes, changes := kpSizes(t), kpChanges(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), d.Add(-30*time.Second))
	}
	defer cancel()
	rep := KubeProxyReport{Time: time.Now().UTC().Format(time.RFC3339),
		KubeProxy: "v1.37.2, --proxy-mode=ipvs, flags: see e2e/cluster.KubeProxyArgs", DualStack: os.Getenv("VSPLANE_VMBENCH_KP_DUALSTACK") == "1",
		AgentArgs: os.Getenv("VSPLANE_VMBENCH_KP_AGENT_ARGS")}
	for _, n := range sizes {
		r := runKubeProxyBench(t, ctx, n, changes, rep.DualStack, rep.AgentArgs)
		rep.Runs = append(rep.Runs, r)
		for _, k := range ratioKeys {
			t.Logf("N=%d %-30s kube-proxy IPVS / vsplane = %8.2f, nftables / vsplane = %8.2f", n, k, r.Ratios[k], r.RatiosNFT[k])
		}
		// After each size: a later size that fails (or runs out of
		// time: 10k takes most of an hour) keeps the earlier ones.
		if err := writeKubeProxyReport(rep); err != nil {
			t.Fatal(err)
		}
	}
}

// runKubeProxyBench runs one size in a fresh cluster.
func runKubeProxyBench(t *testing.T, ctx context.Context, n, changes int, dualStack bool, agentArgs string) KubeProxyRun {
	r := KubeProxyRun{Time: time.Now().UTC().Format(time.RFC3339), Services: n, Ports: len(kpPorts), Endpoints: kpEndpoints, VirtualServers: n * len(kpPorts),
		RealServers: n * len(kpPorts) * kpEndpoints, LoadAvg: measure.LoadAvgLine(),
		KubeProxy: Side{Node: kpNode}, KubeProxyNFT: &Side{Node: nftNode}, Vsplane: Side{Node: vsNode}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acks := make(chan stream.AckEvent, 1<<16)
	mem := 2048
	if n > 2000 {
		mem = 4096
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Nodes:         3,
		NoAgent:       []string{kpNode, vsNode, nftNode},
		KubeProxy:     true,
		AgentArgs:     agentArgs,
		GoPackages:    []string{vm.ProbePackage, vm.FloorPackage},
		GuestFwdPorts: []int{ln.Addr().(*net.TCPAddr).Port},
		VMMemoryMB:    mem,
		// One cluster CIDR both get (kube-proxy takes one per family).
		Translate: translate.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}},
		StreamHooks: stream.Hooks{OnAck: func(ev stream.AckEvent) {
			select {
			case acks <- ev:
			default:
			}
		}},
		VMBootTimeout: 8 * time.Minute,
		Log:           zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
	})
	if err != nil {
		if errors.Is(err, vm.ErrDepsMissing) {
			t.Fatalf("the VM test bed cannot run here (run bash scripts/vm/deps.sh): %v", err)
		}
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
			for _, p := range []string{"kube-proxy-" + kpNode + "-1", "kube-proxy-" + nftNode + "-1", "agent-" + vsNode + "-1"} {
				if res, err := c.VM.Run(lctx, "tail -n 30 /tmp/vmexec/"+p+".log"); err == nil {
					t.Logf("%s log tail:\n%s", p, res.Stdout)
				}
			}
			lcancel()
		}
		_ = c.Stop()
	}()
	r.VMBootSeconds = c.VM.BootTime.Seconds()
	probe, err := vm.StartProbe(ctx, c.VM, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Stop()

	start := time.Now()
	if err := createServices(ctx, c, n); err != nil {
		t.Fatal(err)
	}
	r.CreateSeconds = time.Since(start).Seconds()
	t.Logf("N=%d: %d Services and EndpointSlices created in %.1f s (load %s)", n, n, r.CreateSeconds, measure.LoadAvgLine())

	interval := 100 * time.Millisecond
	if n > 1000 {
		interval = 250 * time.Millisecond
	}
	if n > 5000 {
		interval = 500 * time.Millisecond
	}
	r.ColdPollMS = float64(interval.Milliseconds())
	kpOpts := cluster.KubeProxyOptions{IPv4Only: !dualStack}

	// Each cold start alone in the VM: kube-proxy (IPVS) first; then it is
	// stopped (SIGSTOP: its periodic 30 s full syncs would take the CPU
	// from the others) while kube-proxy (nftables) starts, which is stopped
	// in turn while the agent starts; both are continued afterwards.
	t0 := time.Now()
	if _, err := c.StartKubeProxy(ctx, kpNode, kpOpts); err != nil {
		t.Fatal(err)
	}
	ev, err := probe.AwaitCount(ctx, kpNode, kpFilter, r.VirtualServers, r.RealServers, interval, time.Until(deadline(ctx)))
	if err != nil {
		t.Fatalf("kube-proxy cold start: %v", err)
	}
	r.KubeProxy.ColdIPVSSeconds = ev.At.Sub(t0).Seconds()
	if err := awaitSyncsAbove(ctx, probe, kpNode, 0, time.Until(deadline(ctx)), 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	r.KubeProxy.ColdSyncedSeconds = time.Since(t0).Seconds()
	t.Logf("N=%d: kube-proxy IPVS complete after %.1f s, first sync done after %.1f s", n, r.KubeProxy.ColdIPVSSeconds, r.KubeProxy.ColdSyncedSeconds)
	kps := kubeProxyPIDs(t, ctx, probe)
	if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -STOP %d", kps[0])); err != nil {
		t.Fatal(err)
	}
	coldStartNFT(t, ctx, c, probe, &r, kpOpts, interval)
	kps = kubeProxyPIDs(t, ctx, probe)
	if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -STOP %d", kps[1])); err != nil {
		t.Fatal(err)
	}

	// The agent's cold start is timed by its last Ack (sent after every
	// kernel write of the cold start returned), not by polling: a poll of
	// a table this size takes the same two vCPUs and the IPVS mutex the
	// agent is writing with, and at 5k Services it slowed the agent down
	// several-fold (and its adaptive interval made the result coarse).
	// One count afterwards checks that the kernel holds everything.
	t0 = time.Now()
	if err := c.StartAgent(ctx, vsNode); err != nil {
		t.Fatal(err)
	}
	if err := c.AwaitAcked(ctx, time.Until(deadline(ctx))); err != nil {
		t.Fatal(err)
	}
	info, err := agentInfo(c, vsNode)
	if err != nil {
		t.Fatal(err)
	}
	lastAck := info.GetLastAck().AsTime()
	r.Vsplane.ColdConnectedSeconds = info.GetConnectedSince().AsTime().Sub(t0).Seconds()
	// The cold start's Acks are in acks (measureChanges skips them): the
	// earliest Delta sent shows how much of the cold start came before
	// the agent had anything to apply.
	var first time.Time
drain:
	for {
		select {
		case ev := <-acks:
			if ev.Node == vsNode && (first.IsZero() || ev.SentAt.Before(first)) {
				first = ev.SentAt
			}
		default:
			break drain
		}
	}
	r.Vsplane.ColdFirstDeltaSeconds = first.Sub(t0).Seconds()
	// Where the time to the first Delta went, by the agent's own clock.
	agentLog, err := c.AgentLog(ctx, vsNode)
	if err != nil {
		t.Fatal(err)
	}
	if r.Vsplane.ColdTimeline, err = ColdStartTimeline(agentLog); err != nil {
		t.Fatal(err)
	}
	if vs, rs, err := probe.Count(ctx, vsNode, kpFilter); err != nil || vs != r.VirtualServers || rs != r.RealServers {
		t.Fatalf("vsplane cold start acked, but its IPVS holds %d virtual and %d real servers, want %d and %d (%v)", vs, rs, r.VirtualServers, r.RealServers, err)
	}
	r.Vsplane.ColdIPVSSeconds = lastAck.Sub(t0).Seconds()
	r.Vsplane.ColdSyncedSeconds = r.Vsplane.ColdIPVSSeconds
	t.Logf("N=%d: vsplane IPVS complete after %.1f s, every Delta acked after %.1f s", n, r.Vsplane.ColdIPVSSeconds, r.Vsplane.ColdSyncedSeconds)
	r.KernelFloor = kernelFloor(t, ctx, c, probe)
	r.ColdOverFloor = r.Vsplane.ColdIPVSSeconds / r.KernelFloor.Seconds
	r.ApplyOverFloor = (r.Vsplane.ColdIPVSSeconds - r.Vsplane.ColdFirstDeltaSeconds) / r.KernelFloor.Seconds
	t.Logf("N=%d: kernel floor %.2f s for %d writes (%.0f/s): the agent's cold start is %.1fx it, its apply %.1fx",
		n, r.KernelFloor.Seconds, r.KernelFloor.Writes, r.KernelFloor.WritesPerSec, r.ColdOverFloor, r.ApplyOverFloor)
	if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -CONT %d %d", kps[0], kps[1])); err != nil {
		t.Fatal(err)
	}

	r.ParityAfterCold = parity(t, ctx, probe, n)
	coldProcs := procs(t, ctx, probe)
	for node, s := range r.sides() {
		s.ColdCPUSeconds = coldProcs[node].CPUSeconds() + coldProcs[node].ChildCPUSeconds()
	}

	measureChanges(t, ctx, c, probe, acks, &r, changes)

	r.ParityAfterChanges = parity(t, ctx, probe, n)
	if quiet := kpQuiet(t); quiet > 0 {
		// Nothing changes: what each costs just by being there (periodic
		// full syncs, full reconciles against the kernel).
		t.Logf("N=%d: quiet for %v", n, quiet)
		r.QuietSeconds = quiet.Seconds()
		cpu := quietCPU(t, ctx, probe, quiet)
		for node, s := range r.sides() {
			s.QuietCPUSeconds = cpu[node]
		}
		t.Logf("N=%d: quiet CPU kube-proxy IPVS %.2f s, nftables %.2f s, vsplane %.2f s", n, r.KubeProxy.QuietCPUSeconds, r.KubeProxyNFT.QuietCPUSeconds, r.Vsplane.QuietCPUSeconds)
		r.Vsplane.QuietAloneCPUSeconds = quietAgentAlone(t, ctx, c, probe, quiet)
		t.Logf("N=%d: quiet CPU of the agent alone in IPVS %.2f s", n, r.Vsplane.QuietAloneCPUSeconds)
	}
	end := procs(t, ctx, probe)
	for node, s := range r.sides() {
		p := end[node]
		s.PID, s.PeakRSSMB, s.RSSMB = p.PID, float64(p.VmHWMKB)/1024, float64(p.VmRSSKB)/1024
		s.RSSAnonMB, s.RSSFileMB, s.RSSShmemMB = float64(p.RssAnonKB)/1024, float64(p.RssFileKB)/1024, float64(p.RssShmemKB)/1024
		s.CPUSeconds, s.ChildCPUSeconds = p.CPUSeconds(), p.ChildCPUSeconds()
		s.ChangesCPUSeconds = (p.CPUSeconds() + p.ChildCPUSeconds()) - (coldProcs[node].CPUSeconds() + coldProcs[node].ChildCPUSeconds())
	}
	r.Ratios = ratios(r.KubeProxy, r)
	r.RatiosNFT = ratios(*r.KubeProxyNFT, r)
	r.LoadAvgAfter = measure.LoadAvgLine()
	return r
}

// coldStartNFT starts kube-proxy in nftables mode on nftNode and times its
// cold start: process start -> its first sync ended (polled every
// interval through its metrics). That sync is one nftables transaction, so
// its end is also when the kernel holds every rule; the chains and their
// endpoints are counted afterwards to check it.
func coldStartNFT(t *testing.T, ctx context.Context, c *cluster.Cluster, probe *vm.Probe, r *KubeProxyRun, o cluster.KubeProxyOptions, interval time.Duration) {
	t.Helper()
	o.Mode = "nftables"
	t0 := time.Now()
	if _, err := c.StartKubeProxy(ctx, nftNode, o); err != nil {
		t.Fatal(err)
	}
	if err := awaitSyncsAbove(ctx, probe, nftNode, 0, time.Until(deadline(ctx)), interval); err != nil {
		t.Fatalf("kube-proxy (nftables) cold start: %v", err)
	}
	s := r.KubeProxyNFT
	s.ColdSyncedSeconds = time.Since(t0).Seconds()
	s.ColdIPVSSeconds = s.ColdSyncedSeconds
	svcs, eps, err := probe.NFTCount(ctx, nftNode, "-"+kpNamespace+"/kp-")
	if err != nil || svcs != r.VirtualServers || eps != r.RealServers {
		t.Fatalf("kube-proxy (nftables) synced, but holds %d service-port chains with %d endpoints, want %d and %d (%v)", svcs, eps, r.VirtualServers, r.RealServers, err)
	}
	t.Logf("N=%d: kube-proxy (nftables) first sync done after %.1f s", r.Services, s.ColdSyncedSeconds)
}

// quietAgentAlone stops both kube-proxies, flushes the IPVS one's table and
// measures the agent's CPU (incl. children) over quiet again: what a quiet
// agent costs where no other namespace holds IPVS servers (see
// Side.QuietAloneCPUSeconds). kube-proxy stays stopped: nothing after this
// measures it.
func quietAgentAlone(t *testing.T, ctx context.Context, c *cluster.Cluster, probe *vm.Probe, quiet time.Duration) float64 {
	t.Helper()
	kps := kubeProxyPIDs(t, ctx, probe)
	if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -STOP %d %d", kps[0], kps[1])); err != nil {
		t.Fatal(err)
	}
	if out, err := c.RunInNode(ctx, kpNode, "ipvsadm -C && ipvsadm -Ln | grep -c -e '^TCP' -e '^UDP' -e '^SCTP' -e '^FWM' || true"); err != nil || strings.TrimSpace(out) != "0" {
		t.Fatalf("flush kube-proxy's IPVS table: %v, %q virtual servers left", err, out)
	}
	return quietCPU(t, ctx, probe, quiet)[vsNode]
}

// quietCPU waits quiet and returns the CPU (incl. children) each of the
// three used meanwhile, by node.
func quietCPU(t *testing.T, ctx context.Context, probe *vm.Probe, quiet time.Duration) map[string]float64 {
	t.Helper()
	before := procs(t, ctx, probe)
	timer := time.NewTimer(quiet)
	select {
	case <-ctx.Done():
		timer.Stop()
		t.Fatal("deadline during a quiet phase")
	case <-timer.C:
	}
	after := procs(t, ctx, probe)
	cpu := func(p wire.ProcStat) float64 { return p.CPUSeconds() + p.ChildCPUSeconds() }
	out := map[string]float64{}
	for node := range after {
		out[node] = cpu(after[node]) - cpu(before[node])
	}
	return out
}

// agentInfo is the control plane's record of node's agent, once it
// acknowledged something.
func agentInfo(c *cluster.Cluster, node string) (*vsplanev1.AgentInfo, error) {
	for _, a := range c.Replica.Streams.Registry().ListAgents(false) {
		if a.GetNodeName() == node && a.GetLastAck() != nil {
			return a, nil
		}
	}
	return nil, fmt.Errorf("agent %s: no Ack on record", node)
}

func deadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Hour)
	}
	return d
}

// createServices creates n Services (kpPorts) with one EndpointSlice of
// kpEndpoints ready endpoints each, on no node, through the apiserver with
// 8 writers.
func createServices(ctx context.Context, c *cluster.Cluster, n int) error {
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: kpNamespace, Name: kpName(i)},
					Spec: corev1.ServiceSpec{Ports: kpPorts}}
				if _, err := c.Kube.CoreV1().Services(kpNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				eps := make([]string, kpEndpoints)
				for j := range eps {
					eps[j] = kpEndpointIP(i, j)
				}
				if _, err := c.Kube.DiscoveryV1().EndpointSlices(kpNamespace).Create(ctx, kpSlice(i, eps), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for i := range n {
		select {
		case work <- i:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err != nil {
		return err
	}
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func kpName(i int) string { return fmt.Sprintf("kp-%d", i) }

// kpEndpointIP is endpoint j of Service i; nothing answers there (IPVS
// only holds it).
func kpEndpointIP(i, j int) string { return fmt.Sprintf("198.19.%d.%d", 100+j, i%250+1) }

// kpChangeIP is the address change k brings in (never an initial one).
func kpChangeIP(k int) string { return fmt.Sprintf("198.19.%d.%d", 110+(k/250)%100, k%250+1) }

func kpSlice(i int, eps []string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: kpNamespace, Name: kpName(i) + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: kpName(i), discoveryv1.LabelManagedBy: "vsplane-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range kpPorts {
		name, port, proto := p.Name, int32(kpTargetPort), p.Protocol
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
	}
	for _, ip := range eps {
		ready := true
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return es
}

// parity compares the two kernels' virtual and real servers in the Service
// range (retrying: kube-proxy may be mid-sync). One comparison reads both
// tables over netlink: about a minute for 10,000 Services under TCG.
func parity(t *testing.T, ctx context.Context, probe *vm.Probe, services int) Parity {
	t.Helper()
	f := wire.ProbeFilter{CIDR: vm.ServiceNet}
	var d wire.ProbeEvent
	err := cluster.Await(ctx, 2*time.Minute+time.Duration(services)*40*time.Millisecond, 2*time.Second, func(ctx context.Context) error {
		var err error
		if d, err = probe.Diff(ctx, kpNode, vsNode, f); err == nil && !d.Same {
			err = fmt.Errorf("differ: only kube-proxy %q, only vsplane %q", d.OnlyA, d.OnlyB)
		}
		return err
	})
	p := Parity{Same: d.Same, KubeProxyVS: d.VS, KubeProxyRS: d.RS, VsplaneVS: d.VS2, VsplaneRS: d.RS2, OnlyKubeProxy: d.OnlyA, OnlyVsplane: d.OnlyB}
	if err != nil {
		t.Errorf("IPVS parity: %v", err)
	}
	// The nftables side holds no IPVS: count its service-port chains and
	// their endpoints (the benchmark's Services only).
	p.NFTServiceChains, p.NFTEndpointChains, err = probe.NFTCount(ctx, nftNode, "-"+kpNamespace+"/kp-")
	if err != nil {
		t.Fatalf("kube-proxy nftables chains: %v", err)
	}
	if vs, rs := services*len(kpPorts), services*len(kpPorts)*kpEndpoints; p.NFTServiceChains != vs || p.NFTEndpointChains != rs {
		t.Errorf("kube-proxy nftables holds %d service-port chains with %d endpoints, want %d and %d",
			p.NFTServiceChains, p.NFTEndpointChains, vs, rs)
	}
	return p
}

// kernelFloor writes the agent's state again, with e2e/vm/cmd/kernelfloor,
// into an empty namespace, the agent stopped (SIGSTOP) during the timed
// write so its periodic pass does not share the vCPUs; see wire.FloorResult.
func kernelFloor(t *testing.T, ctx context.Context, c *cluster.Cluster, probe *vm.Probe) *wire.FloorResult {
	t.Helper()
	agent := procs(t, ctx, probe)[vsNode].PID
	script := fmt.Sprintf(`set -e
/usr/sbin/ip netns exec %[1]s /usr/local/bin/kernelfloor dump > /tmp/floor.json
/usr/sbin/ip netns add floor
# IPVS refuses (EINVAL) a NAT real server whose address type it cannot
# tell, as in a namespace whose lo is down (no local routing table yet).
/usr/sbin/ip -n floor link set lo up
kill -STOP %[2]d
trap 'kill -CONT %[2]d; /usr/sbin/ip netns del floor' EXIT
/usr/sbin/ip netns exec floor /usr/local/bin/kernelfloor write < /tmp/floor.json
`, vsNode, agent)
	out, err := c.VM.RunOK(ctx, script)
	if err != nil {
		t.Fatalf("kernel floor: %v", err)
	}
	var f wire.FloorResult
	if err := json.Unmarshal([]byte(out), &f); err != nil || f.Seconds <= 0 || f.Writes == 0 {
		t.Fatalf("kernel floor: %q: %v", out, err)
	}
	return &f
}

// kubeProxyPIDs are the guest PIDs of kube-proxy in IPVS mode (kpNode) and
// in nftables mode (nftNode, 0 before it started).
func kubeProxyPIDs(t *testing.T, ctx context.Context, probe *vm.Probe) [2]int {
	t.Helper()
	var out [2]int
	for i, node := range []string{kpNode, nftNode} {
		ps, err := probe.Procs(ctx, []string{"kube-proxy", "--hostname-override=" + node})
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) > 1 || (len(ps) == 0 && i == 0) {
			t.Fatalf("want one kube-proxy process on %s, have %+v", node, ps)
		}
		if len(ps) == 1 {
			out[i] = ps[0].PID
		}
	}
	return out
}

// procs returns both kube-proxies' and the agent's process stats by node.
func procs(t *testing.T, ctx context.Context, probe *vm.Probe) map[string]wire.ProcStat {
	t.Helper()
	ps, err := probe.Procs(ctx, []string{"kube-proxy", "--hostname-override=" + kpNode}, []string{"kube-proxy", "--hostname-override=" + nftNode},
		[]string{"vsplane-agent", "--node-name " + vsNode})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]wire.ProcStat{}
	for _, p := range ps {
		for _, node := range []string{kpNode, nftNode} {
			if strings.Contains(p.Cmdline, "--hostname-override="+node) {
				out[node] = p
			}
		}
		if strings.Contains(p.Cmdline, "vsplane-agent") {
			out[vsNode] = p
		}
	}
	if len(out) != 3 {
		t.Fatalf("both kube-proxies and the agent not all found among %+v", ps)
	}
	return out
}
