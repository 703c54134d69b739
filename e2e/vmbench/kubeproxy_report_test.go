//go:build vmbench

package vmbench

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// KubeProxyReport is bench/results/kubeproxy.json.
// A run of one size replaces that size's run in the file and keeps the
// others (each run carries its own time and host load).
type KubeProxyReport struct {
	Time      string `json:"time"`
	KubeProxy string `json:"kube_proxy"`
	// DualStack: kube-proxy ran its dual-stack proxier (IPv6 left on in its
	// namespace); else single-stack IPv4 like the agent.
	DualStack bool `json:"kube_proxy_dual_stack"`
	// AgentArgs are the agent's extra flags (VSPLANE_VMBENCH_KP_AGENT_ARGS).
	AgentArgs string         `json:"agent_args,omitempty"`
	Runs      []KubeProxyRun `json:"runs"`
}

// KubeProxyRun is one size, in a fresh cluster.
type KubeProxyRun struct {
	Time           string  `json:"time"`
	Services       int     `json:"services"`
	Ports          int     `json:"ports_per_service"`
	Endpoints      int     `json:"endpoints_per_service"`
	VirtualServers int     `json:"virtual_servers"`
	RealServers    int     `json:"real_servers"`
	LoadAvg        string  `json:"host_loadavg_at_start"`
	LoadAvgAfter   string  `json:"host_loadavg_at_end"`
	VMBootSeconds  float64 `json:"vm_boot_seconds"`
	CreateSeconds  float64 `json:"create_seconds"`
	// ColdPollMS and ChangePollMS are ipvsprobe's polling intervals (the
	// resolution of the cold-start and change times).
	ColdPollMS   float64 `json:"cold_poll_ms"`
	ChangePollMS float64 `json:"change_poll_ms"`
	Changes      int     `json:"changes"`
	// QuietSeconds is the quiet phase's length (0: none).
	QuietSeconds float64 `json:"quiet_seconds,omitempty"`
	// ForksPerChange is the VM's fork counter (processes and threads
	// created, VM-wide) per change window: kube-proxy's iptables/ipset
	// commands plus any thread either process started.
	ForksPerChange float64 `json:"vm_forks_per_change"`
	// VsplaneSentMS and VsplaneAckMS are, per change, the update's answer
	// -> the control plane sent the Delta, and -> the agent's Ack arrived.
	VsplaneSentMS []float64 `json:"vsplane_delta_sent_ms"`
	VsplaneAckMS  []float64 `json:"vsplane_ack_ms"`
	// VsplaneAlone are the agent's changes measured while kube-proxy was
	// stopped (SIGSTOP), so its full syncs did not share the VM's CPUs
	// with the agent; polled every AlonePollMS.
	VsplaneAlone AloneChanges `json:"vsplane_alone"`
	AlonePollMS  float64      `json:"alone_poll_ms"`
	KubeProxy    Side         `json:"kube_proxy"`
	// KubeProxyNFT (runs from 2026-12-07) is kube-proxy in nftables mode,
	// in node3 of the same VM: its "IPVS complete" times are its first
	// sync's end (one nftables transaction), its change times the new
	// endpoint's chain in its table, polled like IPVS.
	KubeProxyNFT *Side `json:"kube_proxy_nftables,omitempty"`
	Vsplane      Side  `json:"vsplane"`
	// KernelFloor (runs from 2026-12-06): the agent's cold-start state
	// written again into an empty namespace by kernelfloor, the kernel
	// layer alone; ColdOverFloor is the agent's cold start (process start
	// -> last Ack) over its time, ApplyOverFloor the part after the first
	// Delta was sent over it (#27 item 2 asks <= 1.5).
	KernelFloor        *wire.FloorResult  `json:"kernel_floor,omitempty"`
	ColdOverFloor      float64            `json:"cold_start_over_kernel_floor,omitempty"`
	ApplyOverFloor     float64            `json:"cold_apply_over_kernel_floor,omitempty"`
	ParityAfterCold    Parity             `json:"parity_after_cold_start"`
	ParityAfterChanges Parity             `json:"parity_after_changes"`
	Ratios             map[string]float64 `json:"ratios_kube_proxy_over_vsplane"`
	RatiosNFT          map[string]float64 `json:"ratios_kube_proxy_nftables_over_vsplane,omitempty"`
}

// sides are the run's implementations by node.
func (r *KubeProxyRun) sides() map[string]*Side {
	out := map[string]*Side{r.KubeProxy.Node: &r.KubeProxy, r.Vsplane.Node: &r.Vsplane}
	if r.KubeProxyNFT != nil {
		out[r.KubeProxyNFT.Node] = r.KubeProxyNFT
	}
	return out
}

// AloneChanges are one side's changes measured without the other side
// running: update answered -> new real server in IPVS (ipvsprobe), and
// the control plane's view of the same (Delta sent, Ack received) and the
// agent's own apply time.
type AloneChanges struct {
	ChangeMS       []float64 `json:"change_ms"`
	ChangeMedianMS float64   `json:"change_median_ms"`
	ChangeP90MS    float64   `json:"change_p90_ms"`
	AckMS          []float64 `json:"ack_ms"`
	AckMedianMS    float64   `json:"ack_median_ms"`
	ApplyMedianMS  float64   `json:"apply_median_ms"`
}

// Side is one implementation's numbers in a run.
type Side struct {
	Node string `json:"node"`
	PID  int    `json:"pid"`
	// ColdIPVSSeconds: process start -> its IPVS holds every virtual and
	// real server (kube-proxy: polled with ipvsprobe; vsplane: its last
	// cold-start Ack received, which it sends after every write returned);
	// ColdSyncedSeconds -> it finished everything (kube-proxy: its first
	// sync ended, ipsets and iptables included; vsplane: every Delta
	// acknowledged, the same time).
	ColdIPVSSeconds   float64 `json:"cold_ipvs_complete_seconds"`
	ColdSyncedSeconds float64 `json:"cold_synced_seconds"`
	// ColdConnectedSeconds and ColdFirstDeltaSeconds (vsplane only):
	// process start -> its stream to the control plane open, -> the first
	// Delta of the cold start sent (host clock).
	ColdConnectedSeconds  float64 `json:"cold_connected_seconds,omitempty"`
	ColdFirstDeltaSeconds float64 `json:"cold_first_delta_sent_seconds,omitempty"`
	// ColdTimeline (vsplane only, runs from 2026-12-05): the agent's own
	// "cold start" log line, each step's share from its process start to
	// its first Delta applied.
	ColdTimeline []TimelineStep `json:"cold_timeline,omitempty"`
	// ChangeMS: EndpointSlice update answered -> the new real server in
	// both of the Service's virtual servers (ipvsprobe, 10 ms polls).
	ChangeMS       []float64 `json:"change_ms"`
	ChangeMedianMS float64   `json:"change_median_ms"`
	ChangeP90MS    float64   `json:"change_p90_ms"`
	ChangeMinMS    float64   `json:"change_min_ms"`
	ChangeMaxMS    float64   `json:"change_max_ms"`
	// Its own kubeproxy_sync_proxy_rules_duration_seconds over the change
	// phase (kube-proxy: full syncs, periodic ones included; the agent: one
	// per Delta applied).
	SyncsPerChange float64 `json:"syncs_per_change"`
	SyncMeanMS     float64 `json:"sync_mean_ms"`
	// FullReconciles is the agent's periodic full reconciles (every 30 s)
	// during the changes: a Delta that arrives during one waits for it.
	FullReconciles int `json:"full_reconciles_during_changes,omitempty"`
	// vsplane only: the Acks of the changes.
	AckApplyMedianMS   float64            `json:"ack_apply_median_ms,omitempty"`
	KernelOpsPerChange map[string]float64 `json:"kernel_operations_per_change,omitempty"`
	// Over the whole run (from the process's start): VmHWM, VmRSS at the
	// end, CPU (utime+stime) and its children's (iptables, ipset...).
	PeakRSSMB float64 `json:"peak_rss_mb"`
	RSSMB     float64 `json:"rss_mb_at_end"`
	// VmRSS at the end split (runs from 2026-12-07): anonymous pages (heap,
	// stacks) and the executable's pages it touched (file-backed, or
	// shared memory for an executable in the VM's initramfs).
	RSSAnonMB         float64 `json:"rss_anon_mb_at_end,omitempty"`
	RSSFileMB         float64 `json:"rss_file_mb_at_end,omitempty"`
	RSSShmemMB        float64 `json:"rss_shmem_mb_at_end,omitempty"`
	CPUSeconds        float64 `json:"cpu_seconds"`
	ChildCPUSeconds   float64 `json:"children_cpu_seconds"`
	ColdCPUSeconds    float64 `json:"cpu_seconds_until_after_cold_start"`
	ChangesCPUSeconds float64 `json:"cpu_seconds_during_changes"`
	// QuietCPUSeconds: CPU (incl. children) over QuietSeconds after the
	// changes in which nothing changed (runs from 2026-12-05): periodic
	// full syncs and reconciles only.
	QuietCPUSeconds float64 `json:"cpu_seconds_quiet,omitempty"`
	// QuietAloneCPUSeconds (vsplane, runs from 2026-12-06): the same quiet
	// window again after kube-proxy was stopped and its IPVS table flushed.
	// Beside another namespace's IPVS servers Linux 6.1's /proc/net/ip_vs
	// skips some of the agent's, which it then reads one by one
	// (dataplane/kernel/linux/ipvs_proc.go); a node's other namespaces
	// seldom hold any.
	QuietAloneCPUSeconds float64 `json:"cpu_seconds_quiet_alone,omitempty"`
}

// Parity is ipvsprobe's comparison of the two kernels' IPVS in the Service range.
type Parity struct {
	Same          bool     `json:"same"`
	KubeProxyVS   int      `json:"kube_proxy_virtual_servers"`
	KubeProxyRS   int      `json:"kube_proxy_real_servers"`
	VsplaneVS     int      `json:"vsplane_virtual_servers"`
	VsplaneRS     int      `json:"vsplane_real_servers"`
	OnlyKubeProxy []string `json:"only_kube_proxy,omitempty"`
	OnlyVsplane   []string `json:"only_vsplane,omitempty"`
	// kube-proxy in nftables mode: its service-port and endpoint chains
	// for the benchmark's Services (as many as vsplane's virtual and real
	// servers, or the run failed).
	NFTServiceChains  int `json:"kube_proxy_nft_service_chains,omitempty"`
	NFTEndpointChains int `json:"kube_proxy_nft_endpoint_chains,omitempty"`
}

// ratioKeys are the headline ratios, kube-proxy (either mode) / vsplane.
var ratioKeys = []string{"cold_ipvs_complete", "cold_synced", "change_median_alone", "change_median", "change_p90", "peak_rss", "cpu_total", "cpu_cold_start", "cpu_during_changes", "cpu_quiet", "cpu_quiet_agent_alone"}

func ratios(k Side, r KubeProxyRun) map[string]float64 {
	kv, vv := kubeProxyValues(k), vsplaneValues(r)
	out := map[string]float64{}
	for _, key := range ratioKeys {
		if vv[key] != 0 {
			out[key] = kv[key] / vv[key]
		}
	}
	return out
}

// kubeProxyValues are a kube-proxy's numbers under the ratio keys. Its
// changes are measured with the agent running in every key (its share of
// the CPU during one is one apply, milliseconds), and its quiet CPU does
// not depend on another namespace's table (it reads its own).
func kubeProxyValues(k Side) map[string]float64 {
	return map[string]float64{
		"cold_ipvs_complete":    k.ColdIPVSSeconds,
		"cold_synced":           k.ColdSyncedSeconds,
		"change_median":         k.ChangeMedianMS,
		"change_median_alone":   k.ChangeMedianMS,
		"change_p90":            k.ChangeP90MS,
		"peak_rss":              k.PeakRSSMB,
		"cpu_total":             k.CPUSeconds + k.ChildCPUSeconds,
		"cpu_cold_start":        k.ColdCPUSeconds,
		"cpu_during_changes":    k.ChangesCPUSeconds,
		"cpu_quiet":             k.QuietCPUSeconds,
		"cpu_quiet_agent_alone": k.QuietCPUSeconds,
	}
}

// vsplaneValues are the agent's numbers under the ratio keys.
func vsplaneValues(r KubeProxyRun) map[string]float64 {
	v := r.Vsplane
	return map[string]float64{
		"cold_ipvs_complete":    v.ColdIPVSSeconds,
		"cold_synced":           v.ColdSyncedSeconds,
		"change_median":         v.ChangeMedianMS,
		"change_median_alone":   r.VsplaneAlone.ChangeMedianMS,
		"change_p90":            v.ChangeP90MS,
		"peak_rss":              v.PeakRSSMB,
		"cpu_total":             v.CPUSeconds + v.ChildCPUSeconds,
		"cpu_cold_start":        v.ColdCPUSeconds,
		"cpu_during_changes":    v.ChangesCPUSeconds,
		"cpu_quiet":             v.QuietCPUSeconds,
		"cpu_quiet_agent_alone": v.QuietAloneCPUSeconds,
	}
}

// syncMetrics is a process's kubeproxy_sync_proxy_rules_duration_seconds.
type syncMetrics struct {
	syncs int
	sum   float64
	// fullReconciles is the agent's vsplane_agent_full_reconciles_total.
	fullReconciles int
}

// kpMetrics reads node's kubeproxy_sync_proxy_rules_duration_seconds
// (kube-proxy and the agent both serve it on 127.0.0.1:10249).
func kpMetrics(ctx context.Context, probe *vm.Probe, node string) (syncMetrics, error) {
	const name, full = "kubeproxy_sync_proxy_rules_duration_seconds", "vsplane_agent_full_reconciles_total"
	text, err := probe.Metrics(ctx, node, "http://127.0.0.1:10249/metrics", name+"_count", name+"_sum", full)
	if err != nil {
		return syncMetrics{}, err
	}
	var m syncMetrics
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return m, fmt.Errorf("metrics line %q: %w", l, err)
		}
		metric, _, _ := strings.Cut(f[0], "{") // kube-proxy labels it per IP family
		switch metric {
		case name + "_count":
			m.syncs += int(v)
		case name + "_sum":
			m.sum += v
		case full:
			m.fullReconciles += int(v)
		}
	}
	return m, nil
}

// measureChanges replaces one endpoint of a different Service `changes`
// times and records, per implementation, the time from the update's answer
// to the new real server in both virtual servers of the Service.
func measureChanges(t *testing.T, ctx context.Context, c *cluster.Cluster, probe *vm.Probe, acks <-chan stream.AckEvent, r *KubeProxyRun, changes int) {
	t.Helper()
	const poll = 10 * time.Millisecond
	r.Changes, r.ChangePollMS = changes, float64(poll.Milliseconds())
	before := map[string]syncMetrics{}
	for _, node := range []string{kpNode, nftNode, vsNode} {
		m, err := kpMetrics(ctx, probe, node)
		if err != nil {
			t.Fatal(err)
		}
		before[node] = m
	}
	measureAgentAlone(t, ctx, c, probe, acks, r, changes)
	var kpLat, nftLat, vsLat, apply []time.Duration
	ops := map[string]float64{}
	var forks uint64
	for k := range changes {
		i, j := (k*7919)%r.Services, k%kpEndpoints
		name, ip := kpName(i), kpChangeIP(k)
		es, targets, nftTargets := kpChange(t, ctx, c, name, j, ip)
		for len(acks) > 0 {
			<-acks
		}
		kp0 := kubeProxySyncs(t, ctx, probe)
		f0, err := probe.Forks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The probe polls from before the write, so a fast apply is not
		// missed; its events are timestamped here as they arrive.
		id, err := probe.Send(wire.ProbeRequest{Op: wire.ProbeAwaitRS, Netns: []string{kpNode, vsNode}, Targets: targets,
			NFTNetns: []string{nftNode}, NFTTargets: nftTargets, IntervalMS: int(poll.Milliseconds()), TimeoutMS: int(time.Until(deadline(ctx)).Milliseconds())})
		if err != nil {
			t.Fatal(err)
		}
		polling := awaitEvent(t, ctx, probe, id, "polling")
		if _, err := c.Kube.DiscoveryV1().EndpointSlices(kpNamespace).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		written := time.Now()
		for done := false; !done; {
			ev := awaitEvent(t, ctx, probe, id, "")
			switch {
			case ev.Kind == "seen" && ev.Netns == kpNode:
				kpLat = append(kpLat, vm.SinceWrite(polling, ev, written))
			case ev.Kind == "seen" && ev.Netns == nftNode:
				nftLat = append(nftLat, vm.SinceWrite(polling, ev, written))
			case ev.Kind == "seen" && ev.Netns == vsNode:
				vsLat = append(vsLat, vm.SinceWrite(polling, ev, written))
			}
			done = ev.Final
		}
		// kube-proxy writes IPVS first in a sync: let the sync end (its
		// count grows) before counting forks and going on.
		awaitKubeProxySyncs(t, ctx, probe, kp0)
		ack := awaitAck(t, ctx, acks, "service/"+kpNamespace+"/"+name)
		apply = append(apply, ack.ApplyDuration)
		r.VsplaneSentMS = append(r.VsplaneSentMS, msOf(ack.SentAt.Sub(written)))
		r.VsplaneAckMS = append(r.VsplaneAckMS, msOf(ack.ReceivedAt.Sub(written)))
		for op, n := range ack.KernelOperations {
			ops[op] += float64(n) / float64(changes)
		}
		f1, err := probe.Forks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		forks += f1 - f0
		t.Logf("change %d (%s endpoint %d -> %s): kube-proxy IPVS %v, nftables %v, vsplane %v (Delta sent after %v, apply %v, Ack after %v, kernel ops %v), VM forks %d",
			k, name, j, ip, kpLat[len(kpLat)-1].Round(time.Millisecond), nftLat[len(nftLat)-1].Round(time.Millisecond), vsLat[len(vsLat)-1].Round(time.Millisecond),
			ack.SentAt.Sub(written).Round(time.Millisecond), ack.ApplyDuration.Round(10*time.Microsecond),
			ack.ReceivedAt.Sub(written).Round(time.Millisecond), ack.KernelOperations, f1-f0)
		// Past kube-proxy's minimum sync interval (1 s): each change is
		// measured on its own, not rate-limited by the previous one.
		time.Sleep(time.Second)
	}
	r.ForksPerChange = float64(forks) / float64(changes)
	for _, s := range []struct {
		side *Side
		lat  []time.Duration
	}{{&r.KubeProxy, kpLat}, {r.KubeProxyNFT, nftLat}, {&r.Vsplane, vsLat}} {
		s.side.ChangeMS = nil
		for _, d := range s.lat {
			s.side.ChangeMS = append(s.side.ChangeMS, msOf(d))
		}
		s.side.ChangeMedianMS, s.side.ChangeP90MS = msOf(Quantile(s.lat, 0.5)), msOf(Quantile(s.lat, 0.9))
		s.side.ChangeMinMS, s.side.ChangeMaxMS = msOf(slices.Min(s.lat)), msOf(slices.Max(s.lat))
		after, err := kpMetrics(ctx, probe, s.side.Node)
		if err != nil {
			t.Fatal(err)
		}
		b := before[s.side.Node]
		s.side.FullReconciles = after.fullReconciles - b.fullReconciles
		if n := after.syncs - b.syncs; n > 0 {
			s.side.SyncsPerChange = float64(n) / float64(changes)
			s.side.SyncMeanMS = (after.sum - b.sum) / float64(n) * 1000
		}
	}
	r.Vsplane.AckApplyMedianMS = msOf(Quantile(apply, 0.5))
	r.Vsplane.KernelOpsPerChange = ops
}

// measureAgentAlone measures `changes` one-endpoint changes on the agent
// alone: kube-proxy is stopped (SIGSTOP) for the block and continued
// after it, then its catch-up sync is awaited. Different Services from the
// simultaneous changes; polled every 2 ms.
func measureAgentAlone(t *testing.T, ctx context.Context, c *cluster.Cluster, probe *vm.Probe, acks <-chan stream.AckEvent, r *KubeProxyRun, changes int) {
	t.Helper()
	const poll = 5 * time.Millisecond
	r.AlonePollMS = float64(poll.Milliseconds())
	kps := kubeProxyPIDs(t, ctx, probe)
	kp0 := kubeProxySyncs(t, ctx, probe)
	if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -STOP %d %d", kps[0], kps[1])); err != nil {
		t.Fatal(err)
	}
	var lat, hostLat, ackLat, apply []time.Duration
	for k := range changes {
		// Services and addresses the simultaneous changes do not use.
		i, j := (k*7919+r.Services/2)%r.Services, k%kpEndpoints
		name, ip := kpName(i), kpChangeIP(changes+k)
		es, targets, _ := kpChange(t, ctx, c, name, j, ip)
		for len(acks) > 0 {
			<-acks
		}
		id, err := probe.Send(wire.ProbeRequest{Op: wire.ProbeAwaitRS, Netns: []string{vsNode}, Targets: targets,
			IntervalMS: int(poll.Milliseconds()), TimeoutMS: int(time.Until(deadline(ctx)).Milliseconds())})
		if err != nil {
			t.Fatal(err)
		}
		polling := awaitEvent(t, ctx, probe, id, "polling")
		if _, err := c.Kube.DiscoveryV1().EndpointSlices(kpNamespace).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		written := time.Now()
		polls := 0
		for done := false; !done; {
			ev := awaitEvent(t, ctx, probe, id, "")
			if ev.Kind == "seen" {
				lat, polls = append(lat, vm.SinceWrite(polling, ev, written)), ev.Polls
				hostLat = append(hostLat, ev.At.Sub(written))
			}
			done = ev.Final
		}
		ack := awaitAck(t, ctx, acks, "service/"+kpNamespace+"/"+name)
		ackLat, apply = append(ackLat, ack.ReceivedAt.Sub(written)), append(apply, ack.ApplyDuration)
		t.Logf("alone change %d (%s endpoint %d -> %s): vsplane %v (seen event arrived after %v, at poll %d; Ack after %v, apply %v)", k, name, j, ip,
			lat[len(lat)-1].Round(100*time.Microsecond), hostLat[len(hostLat)-1].Round(100*time.Microsecond), polls,
			ackLat[len(ackLat)-1].Round(100*time.Microsecond), ack.ApplyDuration.Round(10*time.Microsecond))
	}
	if _, err := c.VM.RunOK(ctx, fmt.Sprintf("kill -CONT %d %d", kps[0], kps[1])); err != nil {
		t.Fatal(err)
	}
	// Each kube-proxy catches up on the block in one sync: await it, so it
	// does not run into the simultaneous changes.
	awaitKubeProxySyncs(t, ctx, probe, kp0)
	a := &r.VsplaneAlone
	for i := range lat {
		a.ChangeMS, a.AckMS = append(a.ChangeMS, msOf(lat[i])), append(a.AckMS, msOf(ackLat[i]))
	}
	a.ChangeMedianMS, a.ChangeP90MS = msOf(Quantile(lat, 0.5)), msOf(Quantile(lat, 0.9))
	a.AckMedianMS, a.ApplyMedianMS = msOf(Quantile(ackLat, 0.5)), msOf(Quantile(apply, 0.5))
}

// kubeProxySyncs reads both kube-proxies' sync metrics, by node.
func kubeProxySyncs(t *testing.T, ctx context.Context, probe *vm.Probe) map[string]syncMetrics {
	t.Helper()
	out := map[string]syncMetrics{}
	for _, node := range []string{kpNode, nftNode} {
		m, err := kpMetrics(ctx, probe, node)
		if err != nil {
			t.Fatal(err)
		}
		out[node] = m
	}
	return out
}

// awaitKubeProxySyncs waits until each kube-proxy (by node) has ended a
// sync more than before says (10 minutes at most each).
func awaitKubeProxySyncs(t *testing.T, ctx context.Context, probe *vm.Probe, before map[string]syncMetrics) {
	t.Helper()
	for node, b := range before {
		if err := awaitSyncsAbove(ctx, probe, node, b.syncs, 10*time.Minute, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}

// awaitSyncsAbove polls the metrics of kube-proxy on node every interval,
// for bound at most, until it has ended more than syncs syncs.
func awaitSyncsAbove(ctx context.Context, probe *vm.Probe, node string, syncs int, bound, interval time.Duration) error {
	return cluster.Await(ctx, bound, interval, func(ctx context.Context) error {
		m, err := kpMetrics(ctx, probe, node)
		if err == nil && m.syncs <= syncs {
			err = fmt.Errorf("kube-proxy on %s: %d syncs ended, waiting for more than %d", node, m.syncs, syncs)
		}
		return err
	})
}

// kpChange reads Service name and its slice, replaces endpoint j's address
// with ip in the slice (not yet written) and returns it with what shows
// the change: ip in each of the Service's ports, as IPVS probe targets and
// as nftables ones (kube-proxy's service-port chains).
func kpChange(t *testing.T, ctx context.Context, c *cluster.Cluster, name string, j int, ip string) (*discoveryv1.EndpointSlice, []wire.ProbeTarget, []wire.ProbeTarget) {
	t.Helper()
	svc, err := c.Kube.CoreV1().Services(kpNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es, err := c.Kube.DiscoveryV1().EndpointSlices(kpNamespace).Get(ctx, name+"-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints[j].Addresses = []string{ip}
	var targets, nftTargets []wire.ProbeTarget
	ep := netip.AddrPortFrom(netip.MustParseAddr(ip), kpTargetPort).String()
	for _, p := range kpPorts {
		targets = append(targets, wire.ProbeTarget{VS: net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(p.Port)), RS: ep})
		nftTargets = append(nftTargets, wire.ProbeTarget{VS: vm.KubeProxyServiceChain(kpNamespace+"/"+name, string(p.Protocol), p.Name), RS: ep})
	}
	return es, targets, nftTargets
}

// awaitEvent returns probe request id's next event (of kind, if set).
func awaitEvent(t *testing.T, ctx context.Context, probe *vm.Probe, id int, kind string) vm.TimedEvent {
	t.Helper()
	for {
		ev, err := probe.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.ID == id && (kind == "" || ev.Kind == kind) {
			return ev
		}
	}
}

// awaitAck returns the agent's Ack that carried resource.
func awaitAck(t *testing.T, ctx context.Context, acks <-chan stream.AckEvent, resource string) stream.AckEvent {
	t.Helper()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	for {
		select {
		case ev := <-acks:
			if _, ok := ev.TriggerTimes[resource]; ok && ev.Node == vsNode {
				if ev.Status.String() != "ACK_STATUS_ACK" {
					t.Fatalf("change NACKed: %v", ev.Errors)
				}
				return ev
			}
		case <-timeout.C:
			t.Fatalf("no Ack carrying %s within 2 minutes", resource)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// writeKubeProxyReport stores kubeproxy.{json,md} in bench/results at the
// repository root, or in VSPLANE_VMBENCH_KP_REPORT (relative to the root;
// CI's tiny run writes to _out).
func writeKubeProxyReport(rep KubeProxyReport) error {
	root, err := measure.RepoRoot(".")
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "bench", "results")
	if d := os.Getenv("VSPLANE_VMBENCH_KP_REPORT"); d != "" {
		dir = filepath.Join(root, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "kubeproxy.json")
	rep.Runs = slices.Clone(rep.Runs) // merged below: not the caller's
	var old KubeProxyReport
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &old) == nil &&
		old.KubeProxy == rep.KubeProxy && old.DualStack == rep.DualStack && old.AgentArgs == rep.AgentArgs {
		for _, r := range old.Runs {
			if !slices.ContainsFunc(rep.Runs, func(n KubeProxyRun) bool { return n.Services == r.Services }) {
				rep.Runs = append(rep.Runs, r)
			}
		}
	}
	slices.SortFunc(rep.Runs, func(a, b KubeProxyRun) int { return a.Services - b.Services })
	return measure.WriteReport(dir, "kubeproxy", rep, kubeProxyMarkdown(rep))
}

func kubeProxyMarkdown(rep KubeProxyReport) string {
	var b strings.Builder
	stack := "single-stack IPv4 (IPv6 disabled in its namespace)"
	if rep.DualStack {
		stack = "dual-stack (its default on a kernel with IPv6)"
	}
	fmt.Fprintf(&b, "# Node apply: kube-proxy vs vsplane, side by side (%s)\n\n", rep.Time)
	fmt.Fprintf(&b, "One QEMU TCG VM (2 vCPUs), one kernel: kube-proxy %s, %s, in node1; since 2026-12-07 the same kube-proxy in nftables mode "+
		"(`--proxy-mode=nftables`, Debian's nft 1.0.6) in node3; the vsplane agent in node2, "+
		"fed by the control plane on the host. Same apiserver and objects (ClusterIP Services, 2 TCP ports x 10 endpoints each). "+
		"Each cold start runs alone (kube-proxy IPVS first, then nftables while the first is SIGSTOPped, then the agent while both are); "+
		"the changes are measured twice: the agent alone while both kube-proxies are SIGSTOPped (a block of changes; they catch up after it), "+
		"then all at once (one EndpointSlice update each, a different Service each time, 1 s after each kube-proxy's previous sync ended), "+
		"where kube-proxy's syncs and the agent share the VM's two vCPUs. kube-proxy's change time is the all-at-once one in both rows. "+
		"Change times: ipvsprobe polls the kernels over netlink the same way (IPVS; for nftables mode, the new endpoint in the dnat map "+
		"of each of the Service's port chains in kube-proxy's table) and timestamps each poll on its own clock, mapped to the host's "+
		"through its \"polling\" event (an upper bound: too long by that event's guest-to-host delay; see vm.SinceWrite); other times are host-clock differences. "+
		"The host has 2 cores shared with other work: absolute times are inflated (each run gives the host's load average), compare the ratios. "+
		"Written by `TestVMBenchKubeProxy` (e2e/vmbench).\n",
		rep.KubeProxy, stack)
	if rep.AgentArgs != "" {
		fmt.Fprintf(&b, "\nThe agent ran with the extra flags `%s`.\n", rep.AgentArgs)
	}
	for _, r := range rep.Runs {
		k, v := r.KubeProxy, r.Vsplane
		fmt.Fprintf(&b, "\n## %d Services (%d virtual servers, %d real servers)\n\n", r.Services, r.VirtualServers, r.RealServers)
		fmt.Fprintf(&b, "Measured %s; host load average at start `%s`, at end `%s`; VM boot %.0f s; objects created in %.0f s; %d changes.\n\n",
			r.Time, r.LoadAvg, r.LoadAvgAfter, r.VMBootSeconds, r.CreateSeconds, r.Changes)
		nft := r.KubeProxyNFT
		if nft == nil { // runs before 2026-12-07: IPVS mode only
			b.WriteString("| | kube-proxy | vsplane agent | kube-proxy / vsplane |\n|---|---:|---:|---:|\n")
		} else {
			b.WriteString("| | kube-proxy IPVS | kube-proxy nftables | vsplane agent | IPVS / vsplane | nftables / vsplane |\n|---|---:|---:|---:|---:|---:|\n")
		}
		// row prints kube-proxy's a (IPVS mode; its nftables mode's value
		// is the same field of nft), vsplane's c and the ratios.
		row := func(name, format string, a, c float64, key string) {
			if nft == nil {
				fmt.Fprintf(&b, "| %s | "+format+" | "+format+" | %.1f |\n", name, a, c, r.Ratios[key])
				return
			}
			fmt.Fprintf(&b, "| %s | "+format+" | "+format+" | "+format+" | %.1f | %.1f |\n", name, a, kubeProxyValues(*nft)[key], c, r.Ratios[key], r.RatiosNFT[key])
		}
		row(fmt.Sprintf("cold start: process start → IPVS complete (s; kube-proxy polled every %.0f ms or 4× the poll's duration, nftables mode: its first sync's end, vsplane its last Ack received)", r.ColdPollMS), "%.1f", k.ColdIPVSSeconds, v.ColdIPVSSeconds, "cold_ipvs_complete")
		row("cold start: → fully synced (s; kube-proxy first sync incl. ipsets+iptables, vsplane all Deltas acked)", "%.1f", k.ColdSyncedSeconds, v.ColdSyncedSeconds, "cold_synced")
		row(fmt.Sprintf("one endpoint replaced, the agent alone (kube-proxy stopped): slice update answered → new real server in IPVS, median (ms; vsplane polled every %.0f ms)", r.AlonePollMS),
			"%.1f", k.ChangeMedianMS, r.VsplaneAlone.ChangeMedianMS, "change_median_alone")
		row(fmt.Sprintf("one endpoint replaced, all running: slice update answered → new real server in IPVS (nftables mode: in the Service port's dnat map), median (ms, polled every %.0f ms)", r.ChangePollMS), "%.0f", k.ChangeMedianMS, v.ChangeMedianMS, "change_median")
		row("… p90 (ms)", "%.0f", k.ChangeP90MS, v.ChangeP90MS, "change_p90")
		row("peak RSS, VmHWM (MB)", "%.0f", k.PeakRSSMB, v.PeakRSSMB, "peak_rss")
		row("CPU over the run incl. children (s)", "%.1f", k.CPUSeconds+k.ChildCPUSeconds, v.CPUSeconds+v.ChildCPUSeconds, "cpu_total")
		row("CPU until after cold start (s)", "%.1f", k.ColdCPUSeconds, v.ColdCPUSeconds, "cpu_cold_start")
		row("CPU during the changes (s)", "%.1f", k.ChangesCPUSeconds, v.ChangesCPUSeconds, "cpu_during_changes")
		if r.QuietSeconds > 0 {
			row(fmt.Sprintf("CPU over %.0f quiet seconds after the changes, nothing changing (s; periodic syncs and full reconciles)", r.QuietSeconds),
				"%.2f", k.QuietCPUSeconds, v.QuietCPUSeconds, "cpu_quiet")
		}
		if v.QuietAloneCPUSeconds > 0 {
			row(fmt.Sprintf("… the same %.0f s again, the agent alone in IPVS (kube-proxy stopped, its table flushed: Linux 6.1's one-read dump of /proc/net/ip_vs skips some of the agent's servers while another namespace holds IPVS servers, and the agent reads those one by one; kube-proxy's column is its quiet CPU above)", r.QuietSeconds),
				"%.2f", k.QuietCPUSeconds, v.QuietAloneCPUSeconds, "cpu_quiet_agent_alone")
		}
		if v.RSSAnonMB > 0 { // runs from 2026-12-07
			fmt.Fprintf(&b, "\nResident memory at the end of the run (VmRSS = anonymous: heap, stacks + the executable's pages it touched: "+
				"file-backed, or shared memory since the VM's root is an initramfs), MB: kube-proxy IPVS %.1f = %.1f + %.1f, ",
				k.RSSMB, k.RSSAnonMB, k.RSSFileMB+k.RSSShmemMB)
			if n := r.KubeProxyNFT; n != nil {
				fmt.Fprintf(&b, "nftables %.1f = %.1f + %.1f, ", n.RSSMB, n.RSSAnonMB, n.RSSFileMB+n.RSSShmemMB)
			}
			fmt.Fprintf(&b, "the agent %.1f = %.1f + %.1f (its peak VmHWM %.1f).\n", v.RSSMB, v.RSSAnonMB, v.RSSFileMB+v.RSSShmemMB, v.PeakRSSMB)
		}
		if v.ColdConnectedSeconds > 0 { // runs before 2026-12-01 polled instead
			fmt.Fprintf(&b, "\nThe agent's cold start: stream to the control plane open after %.2f s, first Delta sent after %.2f s, last Ack received after %.2f s (host clock, from the test's call to start it: its credentials written and the process started in the VM come first).\n",
				v.ColdConnectedSeconds, v.ColdFirstDeltaSeconds, v.ColdSyncedSeconds)
		}
		if f := r.KernelFloor; f != nil {
			fmt.Fprintf(&b, "\nThe floor under that cold start (kernelfloor, run next in the same VM with the agent stopped): the same state "+
				"(%d virtual servers, %d real servers, %d addresses, %d set entries: %d netlink writes) written again into an empty namespace "+
				"by the kernel layer alone took %.2f s (IPVS %.2f, addresses %.2f, set entries %.2f; %.0f writes/s). "+
				"The agent's cold start is **%.1f×** that floor (process start → last Ack), its part after the first Delta was sent %.1f×.\n",
				f.VirtualServers, f.RealServers, f.Addresses, f.SetEntries, f.Writes, f.Seconds, f.IPVSSeconds, f.AddrSeconds, f.SetSeconds,
				f.WritesPerSec, r.ColdOverFloor, r.ApplyOverFloor)
		}
		if len(v.ColdTimeline) > 0 {
			var steps []string
			for _, s := range v.ColdTimeline {
				steps = append(steps, fmt.Sprintf("%s %.0f", s.Step, s.MS))
			}
			fmt.Fprintf(&b, "\nIts own timeline, from its process start to the first Delta applied (ms, each step's share; the agent's \"cold start\" log line): %s.\n", strings.Join(steps, ", "))
		}
		fmt.Fprintf(&b, "\nOwn metrics over the changes (`kubeproxy_sync_proxy_rules_duration_seconds`): kube-proxy %.2f syncs per change, mean %.0f ms each "+
			"(a full sync: every Service's virtual server and real servers read back over netlink, iptables commands); "+
			"vsplane %.2f Delta applies per change, mean %.1f ms, Ack apply median %.1f ms, kernel operations per change %s, "+
			"%d periodic full reconciles during the changes (a Delta arriving during one waits for it). "+
			"VM-wide forks+threads per change window: %.1f (kube-proxy's iptables/ipset commands, and since 2026-12-07 its nftables mode's nft runs too; the agent runs none for an endpoint change).\n",
			k.SyncsPerChange, k.SyncMeanMS, v.SyncsPerChange, v.SyncMeanMS, v.AckApplyMedianMS, opsString(v.KernelOpsPerChange), v.FullReconciles, r.ForksPerChange)
		fmt.Fprintf(&b, "\nIPVS parity (Service range, scheduler, flags, weights): after cold start %s, after the changes %s.\n",
			parityString(r.ParityAfterCold), parityString(r.ParityAfterChanges))
		if nft != nil {
			fmt.Fprintf(&b, "\nkube-proxy in nftables mode: %.2f syncs per change, mean %.0f ms each (partial syncs: only the changed Services' chains, one `nft` transaction). "+
				"Its service-port chains for the benchmark's Services and the endpoints in their dnat maps after the cold start: %d, %d; after the changes: %d, %d (as many as vsplane's virtual and real servers).\n",
				nft.SyncsPerChange, nft.SyncMeanMS, r.ParityAfterCold.NFTServiceChains, r.ParityAfterCold.NFTEndpointChains,
				r.ParityAfterChanges.NFTServiceChains, r.ParityAfterChanges.NFTEndpointChains)
			fmt.Fprintf(&b, "\nPer change (ms): kube-proxy IPVS %v; kube-proxy nftables %v; vsplane %v (its Delta sent after %v, Ack received after %v)\n",
				k.ChangeMS, nft.ChangeMS, v.ChangeMS, r.VsplaneSentMS, r.VsplaneAckMS)
		} else {
			fmt.Fprintf(&b, "\nPer change (ms): kube-proxy %v; vsplane %v (its Delta sent after %v, Ack received after %v)\n",
				k.ChangeMS, v.ChangeMS, r.VsplaneSentMS, r.VsplaneAckMS)
		}
		a := r.VsplaneAlone
		fmt.Fprintf(&b, "\nThe agent alone (ms): in IPVS after %v (p90 %.1f); Ack at the control plane after %v (median %.1f); agent apply median %.2f\n",
			a.ChangeMS, a.ChangeP90MS, a.AckMS, a.AckMedianMS, a.ApplyMedianMS)
	}
	return b.String()
}

func opsString(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%.1f", k, m[k]))
	}
	return "`" + strings.Join(parts, " ") + "`"
}

func parityString(p Parity) string {
	if p.Same {
		return fmt.Sprintf("identical (%d virtual, %d real servers)", p.KubeProxyVS, p.KubeProxyRS)
	}
	return fmt.Sprintf("DIFFERENT (kube-proxy %d/%d, vsplane %d/%d; only kube-proxy e.g. %q, only vsplane e.g. %q)",
		p.KubeProxyVS, p.KubeProxyRS, p.VsplaneVS, p.VsplaneRS, p.OnlyKubeProxy, p.OnlyVsplane)
}
