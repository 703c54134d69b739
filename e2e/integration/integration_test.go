// Package integration_test runs the control plane against a real
// kube-apiserver + etcd (built by scripts/kube/build.sh) with three agents on
// in-memory kernels, all over real gRPC sockets on loopback.
package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

const converge = 20 * time.Second

func TestControlPlaneAgainstRealAPIServer(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	kube, ctx := startKube(t, nodes...)
	log := &deltaLog{}
	_, cpAddr := startControlPlane(t, ctx, kube, log)

	stateDir := t.TempDir()
	kernels := map[string]*memory.Kernel{}
	agents := map[string]*testAgent{}
	for _, n := range nodes {
		kernels[n] = memory.New()
		agents[n] = startAgent(t, ctx, cpAddr, n, kernels[n], filepath.Join(stateDir, n))
	}
	t.Cleanup(func() {
		for _, a := range agents {
			a.stop(t)
		}
	})

	// Two ClusterIP Services; web has an endpoint on node-a.
	const ns = "default"
	web := mustCreateService(t, ctx, kube, clusterIPService(ns, "web", 80, 443))
	api := mustCreateService(t, ctx, kube, clusterIPService(ns, "api", 8000))
	mustCreateSlice(t, ctx, kube, endpointSlice(ns, "web", []int32{80, 443}, endpoint{"198.19.1.10", "node-a"}, endpoint{"198.19.2.10", "node-b"}))
	mustCreateSlice(t, ctx, kube, endpointSlice(ns, "api", []int32{8000}, endpoint{"198.19.2.20", ""}))
	// Skipped like kube-proxy: headless and labelled with a service-proxy-name.
	headless := clusterIPService(ns, "headless", 80)
	headless.Spec.ClusterIP = "None"
	mustCreateService(t, ctx, kube, headless)
	other := clusterIPService(ns, "other-proxy", 80)
	other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
	otherIP := mustCreateService(t, ctx, kube, other)

	// The apiserver's own default/kubernetes Service has no endpoints here
	// (--endpoint-reconciler-type=none): a virtual server without real servers.
	// The apiserver creates it in the background after it is ready.
	var kubeSvc *corev1.Service
	eventually(t, converge, func() string {
		var err error
		if kubeSvc, err = kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
	want := map[string][]string{
		vsKey(kubeSvc.Spec.ClusterIP, 443): {},
		vsKey(web, 80):                     expectedDests("198.19.1.10", "198.19.2.10"),
		vsKey(web, 443):                    expectedDests("198.19.1.10", "198.19.2.10"),
		vsKey(api, 8000):                   expectedDests("198.19.2.20"),
	}
	for _, n := range nodes {
		k := kernels[n].Kernel()
		eventually(t, converge, func() string { return diffState(ipvsState(t, k.IPVS), want) })
		eventually(t, converge, func() string { return boundMismatch(t, k, kubeSvc.Spec.ClusterIP, web, api) })
	}
	if slices.ContainsFunc(slices.Collect(maps.Keys(ipvsState(t, kernels["node-a"].Kernel().IPVS))), func(k string) bool { return strings.Contains(k, otherIP+":") }) {
		t.Fatalf("service labelled with another service-proxy-name was programmed")
	}

	t.Run("one endpoint change is sent only as that Service, to the nodes that see it", func(t *testing.T) {
		mark := log.mark()
		es, err := kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, "api-abc", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		es.Endpoints[0].Addresses = []string{"198.19.2.21"}
		if _, err := kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		want[vsKey(api, 8000)] = expectedDests("198.19.2.21")
		for _, n := range nodes {
			k := kernels[n].Kernel()
			eventually(t, converge, func() string { return diffState(ipvsState(t, k.IPVS), want) })
		}
		apiName := snapshot.ServiceName(ns, "api")
		got := map[string]int{}
		for _, d := range log.since(mark) {
			if len(d.removed) > 0 || len(d.resources) != 1 || d.resources[apiName] == "" {
				t.Errorf("delta to %s carried %v removed %v; want only %s", d.node, d.resources, d.removed, apiName)
			}
			got[d.node]++
		}
		for _, n := range nodes {
			if got[n] != 1 {
				t.Errorf("node %s got %d deltas for the change, want 1", n, got[n])
			}
		}
	})

	t.Run("deleting a Service removes it everywhere", func(t *testing.T) {
		mark := log.mark()
		if err := kube.CoreV1().Services(ns).Delete(ctx, "api", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		delete(want, vsKey(api, 8000))
		for _, n := range nodes {
			k := kernels[n].Kernel()
			eventually(t, converge, func() string { return diffState(ipvsState(t, k.IPVS), want) })
			eventually(t, converge, func() string { return boundMismatch(t, k, kubeSvc.Spec.ClusterIP, web) })
		}
		for _, d := range log.since(mark) {
			if !slices.Equal(d.removed, []string{snapshot.ServiceName(ns, "api")}) || len(d.resources) != 0 {
				t.Errorf("delta to %s: resources %v removed %v; want only the removal of api", d.node, d.resources, d.removed)
			}
		}
	})

	t.Run("a restarted agent resumes and receives zero resources", func(t *testing.T) {
		a := agents["node-b"]
		before := ipvsState(t, kernels["node-b"].Kernel().IPVS)
		a.stop(t)
		kernels["node-b"].ResetCalls()
		// Only what the control plane logs from here on can be the restarted
		// agent's: its Deltas, and the Acks of Deltas sent after restartAt
		// (the old agent, stopped, acknowledges nothing sent after that).
		mark, ackMark, restartAt := log.mark(), log.ackMark(), time.Now()
		agents["node-b"] = startAgent(t, ctx, cpAddr, "node-b", kernels["node-b"], filepath.Join(stateDir, "node-b"))
		var first sentDelta
		eventually(t, converge, func() string {
			for _, d := range log.since(mark) {
				if d.node == "node-b" {
					first = d
					return ""
				}
			}
			return "no delta sent to the restarted agent"
		})
		if len(first.resources) != 0 || len(first.removed) != 0 {
			t.Fatalf("restarted agent received %d resources and %d removals, want none", len(first.resources), len(first.removed))
		}
		// The restarted agent has applied that first Delta when its Ack is in.
		eventually(t, converge, func() string {
			for _, ack := range log.acksSince(ackMark) {
				if ack.Node == "node-b" && ack.Nonce == first.nonce && !ack.SentAt.Before(restartAt) {
					if ack.Status != vsplanev1.AckStatus_ACK_STATUS_ACK {
						t.Fatalf("restarted agent answered its first Delta with %v %v", ack.Status, ack.Errors)
					}
					return ""
				}
			}
			return fmt.Sprintf("restarted agent has not acknowledged its first Delta (nonce %s)", first.nonce)
		})
		if got := ipvsState(t, kernels["node-b"].Kernel().IPVS); diffState(got, before) != "" {
			t.Fatalf("IPVS changed across the restart: %s", diffState(got, before))
		}
		if calls := kernels["node-b"].Calls(); len(calls) != 0 {
			t.Fatalf("restart wrote to the kernel: %v", calls)
		}
	})

	t.Run("a NACKed version is not resent until its content changes", func(t *testing.T) {
		mem := kernels["node-c"]
		mem.SetFault(func(op string) error {
			if op == "ipvs.AddVirtualServer" {
				return fmt.Errorf("injected: %w", kernel.ErrBusy)
			}
			return nil
		})
		t.Cleanup(func() { mem.SetFault(nil) })
		db := mustCreateService(t, ctx, kube, clusterIPService(ns, "db", 5432))
		mustCreateSlice(t, ctx, kube, endpointSlice(ns, "db", []int32{5432}, endpoint{"198.19.3.30", ""}))
		dbName := snapshot.ServiceName(ns, "db")
		var nacked string
		eventually(t, converge, func() string {
			for _, a := range log.acksFor("node-c") {
				for _, e := range a.Errors {
					if e.GetName() == dbName {
						nacked = e.GetVersion()
						return ""
					}
				}
			}
			return "node-c has not NACKed db"
		})
		// Another change reaches node-c; the NACKed db version must not ride along.
		mark := log.mark()
		es, err := kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, "web-abc", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		es.Endpoints = es.Endpoints[:1]
		if _, err := kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		webName := snapshot.ServiceName(ns, "web")
		eventually(t, converge, func() string {
			for _, d := range log.since(mark) {
				if d.node == "node-c" && d.resources[webName] != "" {
					return ""
				}
			}
			return "web change not sent to node-c"
		})
		for _, d := range log.since(mark) {
			if d.node == "node-c" && d.resources[dbName] == nacked {
				t.Fatalf("NACKed version %s of %s was resent", nacked, dbName)
			}
		}
		// Content changes: the new version is sent and, with the fault gone, applied.
		mem.SetFault(nil)
		es2, err := kube.DiscoveryV1().EndpointSlices(ns).Get(ctx, "db-abc", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		es2.Endpoints[0].Addresses = []string{"198.19.3.31"}
		if _, err := kube.DiscoveryV1().EndpointSlices(ns).Update(ctx, es2, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		k := mem.Kernel()
		eventually(t, converge, func() string {
			st := ipvsState(t, k.IPVS)
			if got := st[vsKey(db, 5432)]; !slices.Equal(got, expectedDests("198.19.3.31")) {
				return fmt.Sprintf("db on node-c: %v", got)
			}
			return ""
		})
	})

	t.Run("grpcurl lists the services and fetches a node snapshot", func(t *testing.T) {
		grpcurl := grpcurlPath(t)
		out := run(t, grpcurl, "-plaintext", cpAddr, "list")
		for _, svc := range []string{"vsplane.v1.AgentService", "vsplane.v1.InspectService", "grpc.health.v1.Health"} {
			if !strings.Contains(out, svc) {
				t.Errorf("grpcurl list: %q missing in\n%s", svc, out)
			}
		}
		out = run(t, grpcurl, "-plaintext", "-d", `{"node_name":"node-a"}`, cpAddr, "vsplane.v1.InspectService/GetNodeSnapshot")
		var snap struct {
			NodeName  string `json:"nodeName"`
			Resources []struct {
				Name    string          `json:"name"`
				Version string          `json:"version"`
				Service json.RawMessage `json:"service"`
			} `json:"resources"`
		}
		if err := json.Unmarshal([]byte(out), &snap); err != nil {
			t.Fatalf("grpcurl output is not JSON: %v\n%s", err, out)
		}
		var names []string
		for _, r := range snap.Resources {
			names = append(names, r.Name)
			if r.Name == snapshot.ServiceName(ns, "web") && !strings.Contains(string(r.Service), web) {
				t.Errorf("web resource does not carry its ClusterIP %s: %s", web, r.Service)
			}
		}
		for _, n := range []string{"node/settings", snapshot.ServiceName(ns, "web"), snapshot.ServiceName(ns, "db")} {
			if !slices.Contains(names, n) {
				t.Errorf("snapshot of node-a lacks %s (has %v)", n, names)
			}
		}
		out = run(t, grpcurl, "-plaintext", cpAddr, "vsplane.v1.InspectService/ListAgents")
		var list struct {
			Agents []struct {
				NodeName          string `json:"nodeName"`
				LastApplyDuration string `json:"lastApplyDuration"`
			} `json:"agents"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("ListAgents output is not JSON: %v\n%s", err, out)
		}
		seen := map[string]bool{}
		for _, a := range list.Agents {
			seen[a.NodeName] = true
			// The apply duration the agent put in its Ack, e.g. "0.000412s".
			if d, err := time.ParseDuration(a.LastApplyDuration); err != nil || d <= 0 {
				t.Errorf("agent %s: lastApplyDuration %q is not a positive duration (%v)", a.NodeName, a.LastApplyDuration, err)
			}
		}
		for _, n := range nodes {
			if !seen[n] {
				t.Errorf("ListAgents lacks %s:\n%s", n, out)
			}
		}
		cmd := exec.Command(grpcurl, "-plaintext", "-d", `{"node_name":"no-such-node"}`, cpAddr, "vsplane.v1.InspectService/GetNodeSnapshot")
		b, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(b), "NotFound") {
			t.Errorf("unknown node: want NotFound, got err=%v\n%s", err, b)
		}
	})
}

func boundMismatch(t *testing.T, k kernel.Kernel, ips ...string) string {
	t.Helper()
	got, err := k.Links.BoundAddresses(kernel.DummyDevice)
	if err != nil {
		return err.Error()
	}
	var want []netip.Addr
	for _, ip := range ips {
		want = append(want, netip.MustParseAddr(ip))
	}
	slices.SortFunc(got, netip.Addr.Compare)
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(got, want) {
		return fmt.Sprintf("kube-ipvs0 holds %v, want %v", got, want)
	}
	return ""
}

func mustCreateService(t *testing.T, ctx context.Context, kube kubernetes.Interface, svc *corev1.Service) string {
	t.Helper()
	got, err := kube.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Spec.ClusterIP
}

func mustCreateSlice(t *testing.T, ctx context.Context, kube kubernetes.Interface, es *discoveryv1.EndpointSlice) {
	t.Helper()
	if _, err := kube.DiscoveryV1().EndpointSlices(es.Namespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func grpcurlPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("VSPLANE_GRPCURL"); p != "" {
		return p
	}
	p, err := filepath.Abs("../../bin/grpcurl")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("grpcurl not found at %s: run `make tools` (or set VSPLANE_GRPCURL)", p)
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, b)
	}
	return string(b)
}
