// Package pipeline_test runs the whole per-node pipeline without I/O: the
// control plane's translator turns a fixed cluster model into one node's
// resources, the agent's reconciler applies them to the in-memory kernel,
// and what the kernel then holds — IPVS, kube-ipvs0, every ipset, the
// iptables rules of both families — is compared with a golden file.
//
// The golden file is the reviewable answer to "what does vsplane program
// for these Services on this node": a change anywhere in translate, the
// reconciler or the rules shows up there as a diff. Regenerate with
//
//	go test ./e2e/pipeline -update
package pipeline_test

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var (
	ip  = netip.MustParseAddr
	pfx = netip.MustParsePrefix
)

func key(name string) model.ServiceKey { return model.ServiceKey{Namespace: "default", Name: name} }

// ep is a ready endpoint on a node.
func ep(addr, node string) model.Endpoint {
	return model.Endpoint{Address: ip(addr), NodeName: node, Ready: true, Serving: true}
}

func slice(svc string, fam model.Family, ports []model.EndpointPort, eps ...model.Endpoint) *model.EndpointSlice {
	return &model.EndpointSlice{Key: model.SliceKey{Namespace: "default", Name: svc + "-" + fam.String()}, Service: key(svc),
		Family: fam, Ports: ports, Endpoints: eps}
}

func tcp(name string, port uint16) model.EndpointPort {
	return model.EndpointPort{Name: name, Protocol: model.TCP, Port: port}
}

// cluster is the fixture: every kind of Service kube-proxy programs, once.
func cluster() []translate.Input {
	return []translate.Input{
		{ // dual-stack ClusterIP with ClientIP affinity
			Service: &model.Service{Key: key("web"), ClusterIPs: []netip.Addr{ip("198.18.0.10"), ip("2001:2:0:1::10")},
				Ports:  []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}},
				Sticky: true, StickyTimeoutSeconds: 600},
			Slices: []*model.EndpointSlice{
				slice("web", model.IPv4, []model.EndpointPort{tcp("http", 8080)}, ep("198.19.1.10", "node1"), ep("198.19.2.10", "node2")),
				slice("web", model.IPv6, []model.EndpointPort{tcp("http", 8080)}, ep("2001:2:0:101::10", "node1")),
			},
		},
		{ // NodePort TCP + UDP, cluster policy
			Service: &model.Service{Key: key("np"), Type: model.ServiceTypeNodePort, ClusterIPs: []netip.Addr{ip("198.18.0.11")},
				Ports: []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080},
					{Name: "dns", Protocol: model.UDP, Port: 53, NodePort: 30053}}},
			Slices: []*model.EndpointSlice{slice("np", model.IPv4,
				[]model.EndpointPort{tcp("http", 8080), {Name: "dns", Protocol: model.UDP, Port: 5353}},
				ep("198.19.2.11", "node2"))},
		},
		{ // LoadBalancer, ETP Local, source ranges that include the node, health check
			Service: &model.Service{Key: key("lb"), Type: model.ServiceTypeLoadBalancer, ClusterIPs: []netip.Addr{ip("198.18.0.12")},
				Ports:                    []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30081}},
				LoadBalancerIPs:          []netip.Addr{ip("198.18.200.1")},
				LoadBalancerSourceRanges: []netip.Prefix{pfx("198.19.0.0/24"), pfx("198.19.255.0/24")},
				ExternalTrafficPolicy:    model.PolicyLocal, HealthCheckNodePort: 30999},
			Slices: []*model.EndpointSlice{slice("lb", model.IPv4, []model.EndpointPort{tcp("http", 8080)},
				ep("198.19.1.12", "node1"), ep("198.19.2.12", "node2"))},
		},
		{ // external IP, ETP Local, no endpoint on this node: rejected here
			Service: &model.Service{Key: key("ext"), ClusterIPs: []netip.Addr{ip("198.18.0.13")},
				Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80}},
				ExternalIPs:           []netip.Addr{ip("198.18.100.1")},
				ExternalTrafficPolicy: model.PolicyLocal},
			Slices: []*model.EndpointSlice{slice("ext", model.IPv4, []model.EndpointPort{tcp("http", 8080)}, ep("198.19.2.13", "node2"))},
		},
		{ // SCTP NodePort: hash sets expanded over the node's addresses
			Service: &model.Service{Key: key("sctp"), Type: model.ServiceTypeNodePort, ClusterIPs: []netip.Addr{ip("198.18.0.14")},
				Ports: []model.ServicePort{{Name: "s", Protocol: model.SCTP, Port: 9, NodePort: 30132}}},
			Slices: []*model.EndpointSlice{slice("sctp", model.IPv4, []model.EndpointPort{{Name: "s", Protocol: model.SCTP, Port: 9999}},
				ep("198.19.1.14", "node1"))},
		},
	}
}

func TestNodeGolden(t *testing.T) {
	node := &model.Node{Name: "node1", Zone: "z1", Addresses: []netip.Addr{ip("198.19.0.11"), ip("2001:2:0:100::11")}}
	cfg := translate.Config{ClusterCIDRs: []netip.Prefix{pfx("198.19.0.0/16"), pfx("2001:2:0:100::/56")}}

	settings, err := snapshot.NewNodeSettingsResource(translate.NodeSettings(node, cfg))
	if err != nil {
		t.Fatal(err)
	}
	resources := []*vsplanev1.Resource{settings}
	for _, in := range cluster() {
		st := translate.Service(in, node, cfg)
		if len(st.GetProblems()) > 0 {
			t.Fatalf("%s: fixture has problems: %q", in.Service.Key, st.GetProblems())
		}
		r, err := snapshot.NewServiceResource(st)
		if err != nil {
			t.Fatal(err)
		}
		resources = append(resources, r)
	}

	mk := memory.New()
	mk.AddInterface("eth0", "veth", pfx("198.19.0.11/24"), pfx("2001:2:0:100::11/64"))
	mk.AddInterface("lo", "loopback", pfx("127.0.0.1/8"), pfx("::1/128"))
	r, err := reconcile.New(mk.Kernel(), reconcile.Config{Families: []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6}}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: resources})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	got := dump(t, mk)

	path := filepath.Join("testdata", "node1.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("node1 kernel state differs from %s (-want +got):\n%s", path, d)
	}

	// A second identical apply writes nothing: the golden state is stable.
	mk.ResetCalls()
	ack = r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "2", ReplaceAll: true, Resources: resources})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("re-apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	for op, n := range mk.Calls() {
		if n > 0 && isWrite(op) {
			t.Errorf("re-applying the same state wrote %s x%d", op, n)
		}
	}
}

func isWrite(op string) bool {
	for _, read := range []string{"List", "Get", "Save", "Bound", "Local", "Timeouts", "Info", "KernelVersion"} {
		if strings.Contains(op, read) {
			return false
		}
	}
	return true
}

// dump renders the kernel like ipvsadm -Ln, ip addr show kube-ipvs0,
// ipset save and iptables-save would, in a stable order.
func dump(t *testing.T, mk *memory.Kernel) string {
	t.Helper()
	k := mk.Kernel()
	var b strings.Builder
	b.WriteString("# IPVS (ipvsadm -Ln)\n")
	vss, err := k.IPVS.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(vss, func(a, b kernel.VirtualServer) int { return a.Key.Compare(b.Key) })
	for _, vs := range vss {
		fmt.Fprintf(&b, "%v %s flags=%#x timeout=%d\n", vs.Key, vs.Scheduler, uint32(vs.Flags), vs.Timeout)
		ds, err := k.IPVS.ListDestinations(vs.Key)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			b.WriteString("  (no real servers)\n")
		}
		slices.SortFunc(ds, func(a, b kernel.Destination) int { return a.Key().Compare(b.Key()) })
		for _, d := range ds {
			fmt.Fprintf(&b, "  -> %v weight %d\n", d.Key(), d.Weight)
		}
	}
	b.WriteString("\n# kube-ipvs0\n")
	bound, err := k.Links.BoundAddresses(kernel.DummyDevice)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(bound, netip.Addr.Compare)
	for _, a := range bound {
		fmt.Fprintf(&b, "%v\n", a)
	}
	b.WriteString("\n# ipsets (non-empty)\n")
	sets, err := k.IPSets.ListSets()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(sets, func(a, b kernel.IPSet) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sets {
		es, err := k.IPSets.ListEntries(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			continue
		}
		lines := make([]string, 0, len(es))
		for _, e := range es {
			lines = append(lines, "add "+s.Name+" "+e.Format(s.Type))
		}
		slices.Sort(lines)
		fmt.Fprintf(&b, "create %s %s\n%s\n", s.Name, s.Type, strings.Join(lines, "\n"))
	}
	for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
		for _, tbl := range []kernel.Table{kernel.TableFilter, kernel.TableNAT} {
			out, err := k.IPTables.Save(context.Background(), fam, tbl)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "\n# iptables-save %v %s\n%s", fam, tbl, out)
		}
	}
	return b.String()
}
