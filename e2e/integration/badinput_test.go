package integration_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/engine"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// runControlPlane runs a replica with cfg on ln until the returned stop is
// called.
func runControlPlane(t *testing.T, ctx context.Context, kube kubernetes.Interface, ln net.Listener, cfg translate.Config) (stop func()) {
	t.Helper()
	_, stop = runReplica(t, ctx, app.Config{Kube: kube, GRPCListener: ln, Translate: cfg})
	return stop
}

// TestBadInputAndSettingsAgainstRealAPIServer: a Service whose external IP
// would take over another Service's NodePort on a node is told why (problem
// in ExplainService, counter) while everything else stays programmed; and a
// changed control-plane configuration reaches a running agent without
// restarting it.
func TestBadInputAndSettingsAgainstRealAPIServer(t *testing.T) {
	kube, ctx := startKube(t, "node-a")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	stopCP := runControlPlane(t, ctx, kube, ln, translate.Config{TCPTimeout: 900 * time.Second})
	mem := memory.New()
	a := startAgent(t, ctx, addr, "node-a", mem, t.TempDir())
	t.Cleanup(func() { a.stop(t) })

	const ns = "default"
	np := clusterIPService(ns, "np", 80)
	np.Spec.Type = corev1.ServiceTypeNodePort
	np.Spec.Ports[0].NodePort = 30080
	mustCreateService(t, ctx, kube, np)
	hijack := clusterIPService(ns, "hijack", 30080)
	hijack.Spec.ExternalIPs = []string{"198.19.0.11", "198.18.100.1"}
	hijackIP := mustCreateService(t, ctx, kube, hijack)
	fine := mustCreateService(t, ctx, kube, clusterIPService(ns, "fine", 80))
	mustCreateSlice(t, ctx, kube, endpointSlice(ns, "hijack", []int32{30080}, endpoint{"198.19.1.10", "node-a"}))
	mustCreateSlice(t, ctx, kube, endpointSlice(ns, "fine", []int32{80}, endpoint{"198.19.1.11", "node-a"}))

	k := mem.Kernel()
	eventually(t, converge, func() string {
		st := ipvsState(t, k.IPVS)
		for _, want := range []string{vsKey(hijackIP, 30080), vsKey("198.18.100.1", 30080), vsKey(fine, 80)} {
			if _, ok := st[want]; !ok {
				return "missing " + want + " in " + strings.Join(slicesOfKeys(st), " ")
			}
		}
		return ""
	})
	// The external IP equal to node-a's address is not programmed for
	// hijack: on node-a that virtual server is np's NodePort.
	if dests, ok := ipvsState(t, k.IPVS)[vsKey("198.19.0.11", 30080)]; ok && slices.Contains(dests, "198.19.1.10:8080 w=1") {
		t.Errorf("hijack's backend serves node-a's NodePort 30080: %v", dests)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	inspect := vsplanev1.NewInspectServiceClient(conn)
	resp, err := inspect.ExplainService(ctx, &vsplanev1.ExplainServiceRequest{NodeName: "node-a", Namespace: ns, Name: "hijack"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(resp.GetProblems(), func(p string) bool {
		return strings.Contains(p, string(engine.ReasonExternalIPConflict)) && strings.Contains(p, "198.19.0.11") && strings.Contains(p, "default/np")
	}) {
		t.Errorf("ExplainService(hijack) problems do not explain the conflict: %q", resp.GetProblems())
	}
	resp, err = inspect.ExplainService(ctx, &vsplanev1.ExplainServiceRequest{NodeName: "node-a", Namespace: ns, Name: "fine"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetProblems()) != 0 {
		t.Errorf("an unrelated Service shows problems: %q", resp.GetProblems())
	}

	if got, err := k.IPVS.Timeouts(); err != nil || got.TCP != 900*time.Second {
		t.Fatalf("timeouts %+v (%v), want tcp 900s from the control plane", got, err)
	}

	// New configuration, same agent process: the node settings resource
	// changes and the agent applies it on reconnect.
	stopCP()
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	runControlPlane(t, ctx, kube, ln2, translate.Config{TCPTimeout: 1000 * time.Second, UDPTimeout: 30 * time.Second, StrictARP: true})
	eventually(t, converge, func() string {
		got, err := k.IPVS.Timeouts()
		if err != nil {
			return err.Error()
		}
		if got.TCP != 1000*time.Second || got.UDP != 30*time.Second {
			return "timeouts not updated: " + got.TCP.String() + " " + got.UDP.String()
		}
		for _, name := range []string{kernel.SysctlArpIgnoreAll, kernel.SysctlArpAnnounceAll} {
			if v, err := k.Sysctl.Get(name); err != nil || v == 0 {
				return "strict ARP sysctl " + name + " not set"
			}
		}
		return ""
	})
}

func slicesOfKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// failFirstAdd is a kernel.IPVS whose first add of key's server fails,
// like a netlink ENOMEM; everything else goes to the wrapped IPVS. Other
// virtual servers (the apiserver's default/kubernetes, created in the
// background) cannot use the fault up.
type failFirstAdd struct {
	kernel.IPVS
	key   kernel.VirtualServerKey
	fired atomic.Bool
}

func (f *failFirstAdd) Apply(ops []kernel.IPVSOp) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		if op.Kind == kernel.AddVirtualServer && op.Server.Key.Normalize() == f.key && f.fired.CompareAndSwap(false, true) {
			errs[i] = errors.New("netlink: simulated ENOMEM")
			continue
		}
		errs[i] = f.IPVS.Apply([]kernel.IPVSOp{op})[0]
	}
	return errs
}

// TestTransientKernelErrorHeals: a kernel error NACKs a Service; the
// agent's own retry applies it a moment later, and the control plane learns
// that from the agent's status (nothing is resent, nothing stays pending).
func TestTransientKernelErrorHeals(t *testing.T) {
	kube, ctx := startKube(t, "node-a")
	log := &deltaLog{}
	r, addr := startControlPlane(t, ctx, kube, log)
	mem := memory.New()
	// web's ClusterIP is fixed (inside the Service CIDR) so the fault can
	// name its virtual server before the Service exists.
	const webIP = "198.18.200.80"
	fault := &failFirstAdd{key: kernel.AddrKey(netip.MustParseAddr(webIP), kernel.ProtocolTCP, 80)}
	k := mem.Kernel()
	fault.IPVS = k.IPVS
	k.IPVS = fault
	a := startAgentCfg(t, ctx, agent.Config{ControlPlane: []string{addr}, NodeName: "node-a", Kernel: &k, StateDir: t.TempDir()})
	t.Cleanup(func() { a.stop(t) })
	pending := func() string {
		info, ok := r.Streams.Registry().Agent("node-a")
		if !ok {
			return "agent not connected"
		}
		if p := info.GetPendingResources(); p != 0 {
			return fmt.Sprintf("%d resources pending", p)
		}
		return ""
	}
	eventually(t, converge, pending)

	svc := clusterIPService("default", "web", 80)
	svc.Spec.ClusterIP = webIP
	if ip := mustCreateService(t, ctx, kube, svc); ip != webIP {
		t.Fatalf("web got ClusterIP %s, want %s", ip, webIP)
	}
	webName := snapshot.ServiceName("default", "web")
	var nacked string // the version of web the agent NACKed
	eventually(t, converge, func() string {
		for _, ev := range log.acksFor("node-a") {
			for _, e := range ev.Errors {
				if ev.Status == vsplanev1.AckStatus_ACK_STATUS_NACK && e.GetName() == webName {
					nacked = e.GetVersion()
					return ""
				}
			}
		}
		return "no NACK of " + webName + " yet"
	})
	if !fault.fired.Load() {
		t.Fatal("web was NACKed but not by the injected fault")
	}
	eventually(t, converge, func() string {
		if _, ok := ipvsState(t, k.IPVS)[vsKey(webIP, 80)]; !ok {
			return "retry has not programmed " + vsKey(webIP, 80)
		}
		if msg := pending(); msg != "" {
			return msg
		}
		// Healed from the agent's status: web is acknowledged at the version
		// it NACKed.
		info, _ := r.Streams.Registry().Agent("node-a")
		if v := info.GetAcknowledgedVersions()[webName]; v != nacked {
			return fmt.Sprintf("%s acknowledged at %q, want the NACKed version %s", webName, v, nacked)
		}
		return ""
	})
	if n := countSent(log, "node-a", webName); n != 1 {
		t.Errorf("%s was sent %d times, want once (the retry is the agent's, nothing is resent)", webName, n)
	}
}

// countSent is how many Deltas to node carried name.
func countSent(log *deltaLog, node, name string) int {
	n := 0
	for _, d := range log.since(0) {
		if d.node == node && d.resources[name] != "" {
			n++
		}
	}
	return n
}
