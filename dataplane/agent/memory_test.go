package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestAgentMemory measures what the agent process holds after a cold start
// of the side-by-side benchmark's shape (bench/results/kubeproxy.md):
// ClusterIP Services with 2 TCP ports and 10 endpoints each, sent as the
// control plane sends them (whole resources, in name order, in Deltas of
// about stream.InitialDeltaOps estimated kernel writes, each decoded from
// its wire bytes like a gRPC receive), applied through the agent's own
// Applier chain (metrics, state file, reconciler) into the in-memory
// kernel, with a full reconcile halfway and one at the end (the VM's 30 s
// period falls twice into a 10k cold start).
//
// The memory kernel's storage is not the agent's (Linux keeps IPVS, ipsets
// and addresses in kernel memory): it is measured after the agent is
// dropped and subtracted. It is a measurement, not a check of a figure:
// `go test` runs it at 200 Services so it cannot rot (it checks that every
// Delta was acknowledged and every Service held); measure with
//
//	VSPLANE_AGENT_MEMORY=10000 go test ./dataplane/agent -run TestAgentMemory -v
//
// (the value is the number of Services); VSPLANE_AGENT_MEMORY_PROFILE=DIR
// writes DIR/heap.pb.gz (after the cold start, for go tool pprof
// -sample_index=inuse_space or alloc_space).
func TestAgentMemory(t *testing.T) {
	n := 200
	if v := os.Getenv("VSPLANE_AGENT_MEMORY"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 || n > maxMemServices {
			t.Fatalf("VSPLANE_AGENT_MEMORY=%q: want a number of Services, 1..%d", v, maxMemServices)
		}
	}
	profileDir := os.Getenv("VSPLANE_AGENT_MEMORY_PROFILE")
	if profileDir != "" {
		runtime.MemProfileRate = 16 << 10
	}
	const budget = 4096 // stream.InitialDeltaOps

	base := liveHeap()
	peak := startPeakSampler()

	mem := memory.New()
	k := mem.Kernel()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := New(ctx, Config{NodeName: "node1", ControlPlane: []string{"127.0.0.1:1"}, Kernel: &k, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var saver sync.WaitGroup
	saver.Go(func() { a.state.run(ctx) })
	applier := a.Metrics.Wrap(a.state) // the chain New hands the client

	start := time.Now()
	var deltas, sent int
	apply := func(d *vsplanev1.Delta) {
		b, err := proto.Marshal(d) // what the control plane sends...
		if err != nil {
			t.Fatal(err)
		}
		in := &vsplanev1.Delta{} // ...and the agent's gRPC receive decodes
		if err := proto.Unmarshal(b, in); err != nil {
			t.Fatal(err)
		}
		if ack := applier.Apply(ctx, in); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
			t.Fatalf("delta %d: %v", deltas, ack.GetErrors())
		}
		deltas++
	}
	// Resource names sort as the control plane sends them; the first Delta
	// (replace_all) carries node/settings too.
	d := &vsplanev1.Delta{Nonce: "0", ReplaceAll: true, Resources: []*vsplanev1.Resource{memSettings()}}
	cost := 1
	for i := range n {
		res := memService(i)
		c := resourceCost(res)
		if len(d.Resources) > 0 && cost+c > budget {
			apply(d)
			d, cost = &vsplanev1.Delta{Nonce: strconv.Itoa(deltas)}, 0
		}
		d.Resources = append(d.Resources, res)
		cost += c
		if sent++; sent == n/2 {
			apply(d)
			d, cost = &vsplanev1.Delta{Nonce: strconv.Itoa(deltas)}, 0
			a.Reconciler.Reconcile(ctx)
		}
	}
	if len(d.Resources) > 0 {
		apply(d)
	}
	applied := time.Since(start)
	a.state.save()
	a.Reconciler.Reconcile(ctx)
	peakAll := peak.stop()

	// Everything the agent holds, then without the agent, then without the
	// kernel either.
	withAgent := liveHeap()
	if profileDir != "" {
		writeHeapProfile(t, filepath.Join(profileDir, "heap.pb.gz"))
	}
	stats := a.Reconciler.Stats()
	if held := len(a.Reconciler.Versions()); held != n+1 {
		t.Fatalf("the reconciler holds %d resources, want %d Services and the node settings", held, n)
	}
	cancel()
	saver.Wait()
	a, applier = nil, nil
	withKernel := liveHeap()
	runtime.KeepAlive(mem)
	mem, k = nil, kernel.Kernel{}
	without := liveHeap()

	agentLive, kernelLive := withAgent.alloc-withKernel.alloc, withKernel.alloc-without.alloc
	t.Logf("%d Services (%d virtual servers, %d real servers) in %d Deltas, applied in %v, %d full reconciles",
		n, 2*n, 20*n, deltas, applied.Round(time.Millisecond), stats.FullReconciles)
	t.Logf("agent live heap after cold start: %.1f MB (HeapAlloc after GC; heap in use %.1f MB incl. kernel and %.1f MB before start)",
		mb(agentLive), mb(withAgent.inuse), mb(base.inuse))
	t.Logf("memory kernel's storage (excluded): %.1f MB", mb(kernelLive))
	t.Logf("peak during the cold start: heap in use %.1f MB, heap objects %.1f MB, process memory (runtime total - released) %.1f MB; "+
		"minus the kernel's final storage: heap in use %.1f MB",
		mb(peakAll.inuse), mb(peakAll.objects), mb(peakAll.total), mb(peakAll.inuse)-mb(kernelLive))
	t.Logf("allocated during the cold start: %.1f MB in %d GCs", mb(peakAll.allocated-base.allocated), peakAll.gcs-base.gcs)
}

// maxMemServices: the cluster IPs are 198.18.0.0 up to below the node's
// address 198.18.255.250 (test addresses stay in 198.18.0.0/15).
const maxMemServices = 65000

// memService is Service i as translate.Service emits it for the benchmark's
// objects: 2 TCP ports (http 80, https 8443) of one cluster IP, 10 ready
// endpoints on no node (target port 8080), their KUBE-CLUSTER-IP entries,
// versioned by a content hash like snapshot.NewServiceResource.
func memService(i int) *vsplanev1.Resource {
	name := fmt.Sprintf("kp-%05d", i)
	vip := fmt.Sprintf("198.18.%d.%d", i>>8, i&0xff) // i < maxMemServices
	st := &vsplanev1.ServiceState{Namespace: "kp", Name: name}
	for _, p := range []struct {
		name string
		port uint32
	}{{"http", 80}, {"https", 8443}} {
		vs := &vsplanev1.VirtualServer{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP,
			Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Address: vip, Port: p.port, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
			PortName: p.name, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS,
			TrafficPolicy: vsplanev1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER}
		for j := range 10 {
			vs.RealServers = append(vs.RealServers, &vsplanev1.RealServer{Address: fmt.Sprintf("198.19.%d.%d", 100+j, i%250+1),
				Port: 8080, Weight: 1, Ready: true, Serving: true, Reason: "ready"})
		}
		st.VirtualServers = append(st.VirtualServers, vs)
		st.IpsetEntries = append(st.IpsetEntries, &vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP,
			Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Ip: vip, Port: p.port, Protocol: vsplanev1.Protocol_PROTOCOL_TCP})
	}
	return &vsplanev1.Resource{Name: wire.ServiceResource("kp", name), Version: contentVersion(st),
		Body: &vsplanev1.Resource_Service{Service: st}}
}

func memSettings() *vsplanev1.Resource {
	ns := &vsplanev1.NodeSettings{DefaultScheduler: "rr", ClusterCidrs: []string{"198.19.0.0/16"}, NodeIps: []string{"198.18.255.250"}}
	return &vsplanev1.Resource{Name: wire.NodeSettingsResource, Version: contentVersion(ns),
		Body: &vsplanev1.Resource_NodeSettings{NodeSettings: ns}}
}

func contentVersion(m proto.Message) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// resourceCost is the control plane's estimate (stream.ResourceCost).
func resourceCost(r *vsplanev1.Resource) int {
	s := r.GetService()
	if s == nil {
		return 1
	}
	n := 1 + len(s.GetIpsetEntries())
	for _, vs := range s.GetVirtualServers() {
		n += 1 + len(vs.GetRealServers())
	}
	return n
}

type heapSample struct {
	alloc, inuse uint64 // HeapAlloc, HeapInuse
	allocated    uint64 // TotalAlloc
	gcs          uint32
}

// liveHeap collects garbage (twice: finalizers) and reads the heap.
func liveHeap() heapSample {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return heapSample{alloc: ms.HeapAlloc, inuse: ms.HeapInuse, allocated: ms.TotalAlloc, gcs: ms.NumGC}
}

// peakSampler reads the heap every few milliseconds (runtime/metrics, no
// stop-the-world) and keeps the maxima.
type peakSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	max  atomic.Pointer[peakValues]
}

type peakValues struct {
	inuse, objects, total uint64 // heap in use, heap objects, runtime total minus released
	allocated             uint64
	gcs                   uint32
}

func startPeakSampler() *peakSampler {
	p := &peakSampler{done: make(chan struct{})}
	names := []string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes",
		"/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}
	samples := make([]metrics.Sample, len(names))
	for i, n := range names {
		samples[i].Name = n
	}
	var m peakValues
	p.wg.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(samples)
			objects, unused, total, released := samples[0].Value.Uint64(), samples[1].Value.Uint64(),
				samples[2].Value.Uint64(), samples[3].Value.Uint64()
			m.objects = max(m.objects, objects)
			m.inuse = max(m.inuse, objects+unused)
			m.total = max(m.total, total-released)
			select {
			case <-p.done:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				m.allocated, m.gcs = ms.TotalAlloc, ms.NumGC
				p.max.Store(&m)
				return
			case <-tick.C:
			}
		}
	})
	return p
}

func (p *peakSampler) stop() peakValues {
	close(p.done)
	p.wg.Wait()
	return *p.max.Load()
}

func writeHeapProfile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
	t.Logf("heap profile: %s", path)
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }
