package reconcile

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func kernelVSOf(t *testing.T, mk *memory.Kernel, key string) kernel.VirtualServer {
	t.Helper()
	list, err := mk.Kernel().IPVS.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	for _, vs := range list {
		if vs.Key.String() == key {
			return vs
		}
	}
	t.Fatalf("no virtual server %s in %v", key, list)
	return kernel.VirtualServer{}
}

// Session affinity with mh: kube-proxy adds the mh-port flag whenever the
// scheduler is mh, whether it is the node default or the Service's own.
func TestMHPortFlag(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	sticky := tcp("sticky", "198.18.0.20", 80, be("198.19.1.2", 8080)).resource()
	vs := sticky.GetService().GetVirtualServers()[0]
	vs.Flags = []vsplanev1.VirtualServerFlag{vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT}
	vs.PersistenceTimeoutSeconds = 10800
	own := tcp("own", "198.18.0.21", 80, be("198.19.1.2", 8080))
	own.scheduler = "mh"
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), sticky, own.resource())))
	got := kernelVSOf(t, mk, "tcp/198.18.0.20:80")
	if got.Scheduler != "rr" || got.Flags != kernel.FlagPersistent || got.Timeout != 10800 {
		t.Errorf("rr sticky VS = %+v", got)
	}
	if got := kernelVSOf(t, mk, "tcp/198.18.0.21:80"); got.Scheduler != "mh" || got.Flags != kernel.FlagMHPort {
		t.Errorf("own mh VS = %+v, want mh with the mh-port flag", got)
	}
	// The node default becomes mh: the sticky VS is updated in place
	// (persistent + mh-port), without any resend of the Service.
	ns := defaultNodeSettings()
	ns.DefaultScheduler = "mh"
	mk.ResetCalls()
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "mh", Resources: []*vsplanev1.Resource{settingsRes(ns)}})
	mustAck(t, ack)
	got = kernelVSOf(t, mk, "tcp/198.18.0.20:80")
	if got.Scheduler != "mh" || got.Flags != kernel.FlagPersistent|kernel.FlagMHPort || got.Timeout != 10800 {
		t.Errorf("sticky VS under default mh = %+v", got)
	}
	if d := cmp.Diff(map[string]int{"ipvs.UpdateVirtualServer": 1}, writes(mk)); d != "" {
		t.Errorf("writes (-want +got):\n%s", d)
	}
	vss, _ := r.Desired()
	if i := slices.IndexFunc(vss, func(d DesiredVirtualServer) bool { return d.VirtualServer.Key.Port == 80 }); i < 0 ||
		vss[i].VirtualServer.Flags&kernel.FlagMHPort == 0 {
		t.Errorf("Desired() does not show the mh-port flag: %+v", vss)
	}
	// A full reconcile agrees with the kernel: no repair.
	mk.ResetCalls()
	r.Reconcile(context.Background())
	if w := writes(mk); len(w) != 0 {
		t.Errorf("full reconcile rewrote %v", w)
	}
}

// A Local policy without local endpoints: the VS is programmed with no
// destinations (IPVS then answers ICMP port unreachable); that is a
// success, not an error, and a later endpoint is added normally.
func TestRejectVirtualServer(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	rej := func(withBackend bool) *vsplanev1.Resource {
		v := &vsplanev1.VirtualServer{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER, Address: "198.18.200.1",
			Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL,
			TrafficPolicy: vsplanev1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, Reject: !withBackend}
		np := nodePortRes("lb", 30090, 0, "198.19.1.9").GetService().GetVirtualServers()[0]
		np.RealServers, np.Reject = nil, !withBackend
		if withBackend {
			rs := []*vsplanev1.RealServer{{Address: "198.19.1.4", Port: 80, Weight: 1, Local: true}}
			v.RealServers, np.RealServers = rs, rs
		}
		return &vsplanev1.Resource{Name: "service/default/lb", Version: map[bool]string{true: "2", false: "1"}[withBackend],
			Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{VirtualServers: []*vsplanev1.VirtualServer{v, np}}}}
	}
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), rej(false))))
	wantState(t, mk, kernelState{
		Services: map[string][]string{
			"tcp/198.18.200.1:80 rr":   {},
			"tcp/198.19.0.11:30090 rr": {},
			"tcp/198.19.0.21:30090 rr": {},
		},
		Bound: []string{"198.18.200.1"},
		Sets:  map[string][]string{"KUBE-IPVS-IPS": {"198.18.200.1"}},
	})
	vss, _ := r.Desired()
	for _, d := range vss {
		if !d.Reject || len(d.Destinations) != 0 {
			t.Errorf("Desired() = %+v, want reject without destinations", d)
		}
	}
	mk.ResetCalls()
	r.Reconcile(context.Background())
	if w := writes(mk); len(w) != 0 || len(r.Failed()) != 0 || len(r.Stats().KernelErrors) != 0 {
		t.Errorf("full reconcile of a rejecting VS: writes %v, failed %v, errors %v", w, r.Failed(), r.Stats().KernelErrors)
	}
	mk.ResetCalls()
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "ep", Resources: []*vsplanev1.Resource{rej(true)}}))
	if d := cmp.Diff(map[string]int{"ipvs.AddDestination": 3}, writes(mk)); d != "" {
		t.Errorf("local endpoint appears (-want +got):\n%s", d)
	}
	// Contradictory input: reject with real servers is refused.
	bad := rej(true)
	bad.Version = "3"
	bad.GetService().GetVirtualServers()[0].Reject = true
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "bad", Resources: []*vsplanev1.Resource{bad}})
	if len(ack.GetErrors()) != 1 || !strings.Contains(ack.GetErrors()[0].GetMessage(), "reject with 1 real servers") {
		t.Errorf("ack = %v", ack)
	}
}

// ExternalIPs / LB IPs bind to kube-ipvs0 (and enter KUBE-IPVS-IPS) only
// while no other interface holds them; the state follows the interfaces.
func TestUnlessLocalFollowsInterfaces(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	ext := func(name, addr string) *vsplanev1.Resource {
		return &vsplanev1.Resource{Name: "service/default/" + name, Version: "1", Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
			VirtualServers: []*vsplanev1.VirtualServer{{
				Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP, Address: addr, Port: 80,
				Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL,
				RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.2", Port: 80, Weight: 1}},
			}},
			IpsetEntries: []*vsplanev1.IPSetEntry{{Set: vsplanev1.IPSet_IP_SET_EXTERNAL_IP, Ip: addr, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP}},
		}}}
	}
	// A ClusterIP on the same address as a node's would still be bound:
	// ALWAYS wins. Here: one external IP is the node's, one is not.
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), ext("node", "198.19.0.21"), ext("far", "198.18.100.1"))))
	st := readState(t, mk)
	if d := cmp.Diff([]string{"198.18.100.1"}, st.Bound); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.100.1"}, st.Sets["KUBE-IPVS-IPS"]); d != "" {
		t.Errorf("KUBE-IPVS-IPS (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.100.1,tcp:80", "198.19.0.21,tcp:80"}, st.Sets["KUBE-EXTERNAL-IP"]); d != "" {
		t.Errorf("KUBE-EXTERNAL-IP (-want +got):\n%s", d)
	}
	// The node loses the address: the next full reconcile binds it.
	if err := unbindAddr(mk.Kernel(), "eth1", netip.MustParseAddr("198.19.0.21")); err != nil {
		t.Fatal(err)
	}
	r.Reconcile(context.Background())
	st = readState(t, mk)
	if d := cmp.Diff([]string{"198.18.100.1", "198.19.0.21"}, st.Sets["KUBE-IPVS-IPS"]); d != "" {
		t.Errorf("KUBE-IPVS-IPS after the node lost the address (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.100.1", "198.19.0.21"}, st.Bound); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
	// And gets it back: unbound again, out of KUBE-IPVS-IPS.
	mk.AddInterface("eth1", "veth", netip.MustParsePrefix("198.19.0.21/24"))
	r.Reconcile(context.Background())
	st = readState(t, mk)
	if d := cmp.Diff([]string{"198.18.100.1"}, st.Sets["KUBE-IPVS-IPS"]); d != "" {
		t.Errorf("KUBE-IPVS-IPS after the address came back (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.100.1"}, st.Bound); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
}
