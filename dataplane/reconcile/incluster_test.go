package reconcile

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// localLBRes is a LoadBalancer Service of externalTrafficPolicy Local and
// ClientIP session affinity as
// the control plane sends it to a node without a local endpoint: the LB IP
// and the NodePort reject external clients, and in-cluster clients get
// inCluster (none: nothing for them either).
func localLBRes(name, lbIP string, nodePort uint32, inCluster ...string) *vsplanev1.Resource {
	var in []*vsplanev1.RealServer
	for _, a := range inCluster {
		in = append(in, &vsplanev1.RealServer{Address: a, Port: 8080, Weight: 1, Ready: true})
	}
	v4 := vsplanev1.IPFamily_IP_FAMILY_IPV4
	tcp := vsplanev1.Protocol_PROTOCOL_TCP
	svc := &vsplanev1.ServiceState{Namespace: "default", Name: name,
		VirtualServers: []*vsplanev1.VirtualServer{
			{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_LOAD_BALANCER, Address: lbIP, Family: v4, Port: 80, Protocol: tcp,
				Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL, Reject: true, InClusterRealServers: in,
				Flags:                     []vsplanev1.VirtualServerFlag{vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT},
				PersistenceTimeoutSeconds: 10800},
			{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT, NodePortAddresses: true, Family: v4, Port: nodePort, Protocol: tcp,
				Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_NONE, Reject: true, InClusterRealServers: in,
				Flags:                     []vsplanev1.VirtualServerFlag{vsplanev1.VirtualServerFlag_VIRTUAL_SERVER_FLAG_PERSISTENT},
				PersistenceTimeoutSeconds: 10800},
		},
		IpsetEntries: []*vsplanev1.IPSetEntry{
			{Set: vsplanev1.IPSet_IP_SET_LOAD_BALANCER, Family: v4, Ip: lbIP, Port: 80, Protocol: tcp},
			{Set: vsplanev1.IPSet_IP_SET_LOAD_BALANCER_LOCAL, Family: v4, Ip: lbIP, Port: 80, Protocol: tcp},
			{Set: vsplanev1.IPSet_IP_SET_NODE_PORT_TCP, Family: v4, Port: nodePort},
			{Set: vsplanev1.IPSet_IP_SET_NODE_PORT_LOCAL_TCP, Family: v4, Port: nodePort},
		},
	}
	return &vsplanev1.Resource{Name: "service/default/" + name, Version: fmt.Sprint(name, lbIP, nodePort, inCluster),
		Body: &vsplanev1.Resource_Service{Service: svc}}
}

// fwmarkServers returns the IPVS fwmark servers: mark -> real servers.
func fwmarkServers(t *testing.T, mk *memory.Kernel) map[uint32][]string {
	t.Helper()
	vss, err := mk.Kernel().IPVS.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32][]string{}
	for _, vs := range vss {
		if vs.Key.FWMark == 0 {
			continue
		}
		ds, err := mk.Kernel().IPVS.ListDestinations(vs.Key)
		if err != nil {
			t.Fatal(err)
		}
		list := []string{}
		for _, d := range ds {
			list = append(list, d.Key().String())
		}
		slices.Sort(list)
		out[vs.Key.FWMark] = list
		if vs.Key.FWMark < 0x10000 && (vs.Flags&kernel.FlagPersistent == 0 || vs.Timeout != 10800) {
			t.Errorf("fwmark server %v: flags %v timeout %d, want the LB's persistence (10800 s)", vs.Key, vs.Flags, vs.Timeout)
		}
	}
	return out
}

// inClusterChain returns the rules of VSPLANE-IN-CLUSTER and the jumps to it.
func inClusterChain(t *testing.T, mk *memory.Kernel) (marks, jumps []string) {
	t.Helper()
	for _, r := range natRules(t, mk, rules.ChainServices) {
		if strings.HasSuffix(r, "-j "+rules.ChainInCluster) {
			jumps = append(jumps, r)
		}
	}
	return natRules(t, mk, rules.ChainInCluster), jumps
}

func TestInClusterClientsOfLocalPolicy(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	settings := defaultNodeSettings()
	mustAck(t, apply(t, r, full(settingsRes(settings), localLBRes("web", "198.18.200.2", 30080, "198.19.2.5", "198.19.3.5"))))

	// One fwmark server for the port's LB IP and its NodePort addresses?
	// No: the LB port (80) and the NodePort (30080) are two ports of the
	// resource, so two marks, each with the in-cluster real servers.
	fw := fwmarkServers(t, mk)
	if len(fw) != 2 {
		t.Fatalf("fwmark servers %v, want 2 (LB port 80 and NodePort 30080)", fw)
	}
	for mark, rs := range fw {
		if mark&^rules.InClusterMarkMask != 0x4000 || mark&rules.InClusterMarkMask == 0 {
			t.Errorf("fwmark %#x: want a value of %#x with the masquerade bit 0x4000", mark, rules.InClusterMarkMask)
		}
		if fmt.Sprint(rs) != "[198.19.2.5:8080 198.19.3.5:8080]" {
			t.Errorf("fwmark %#x real servers %v, want the in-cluster ones", mark, rs)
		}
	}
	marks, jumps := inClusterChain(t, mk)
	if want := []string{"-s 198.19.0.0/16 -j VSPLANE-IN-CLUSTER", "-m addrtype --src-type LOCAL -j VSPLANE-IN-CLUSTER"}; !slices.Equal(jumps, want) {
		t.Errorf("jumps %q, want %q", jumps, want)
	}
	// The LB IP, and the NodePort on each NodePort address (same mark).
	if len(marks) != 3 {
		t.Fatalf("VSPLANE-IN-CLUSTER %q, want 3 rules", marks)
	}
	markOf := func(rule string) uint32 {
		var v, m uint32
		if _, err := fmt.Sscanf(rule[strings.Index(rule, "--set-xmark ")+len("--set-xmark "):], "0x%x/0x%x", &v, &m); err != nil || m != 0x4fff {
			t.Fatalf("rule %q: %v, mask %#x", rule, err, m)
		}
		return v
	}
	for i, dst := range []string{"-d 198.18.200.2/32 -p tcp -m tcp --dport 80 ", "-d 198.19.0.11/32 -p tcp -m tcp --dport 30080 ",
		"-d 198.19.0.21/32 -p tcp -m tcp --dport 30080 "} {
		if !strings.HasPrefix(marks[i], dst) || fw[markOf(marks[i])] == nil {
			t.Errorf("rule %d %q: want %q… with the mark of a fwmark server", i, marks[i], dst)
		}
	}
	if markOf(marks[1]) != markOf(marks[2]) || markOf(marks[0]) == markOf(marks[1]) {
		t.Errorf("marks %q: want one per port, shared by the NodePort addresses", marks)
	}
	before := fw

	// An endpoint change touches the real servers only: same marks.
	mk.ResetCalls()
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{localLBRes("web", "198.18.200.2", 30080, "198.19.2.5", "198.19.4.5")}}))
	fw = fwmarkServers(t, mk)
	for mark := range before {
		if fmt.Sprint(fw[mark]) != "[198.19.2.5:8080 198.19.4.5:8080]" {
			t.Errorf("after the endpoint change fwmark %#x has %v", mark, fw[mark])
		}
	}
	for op := range writes(mk) {
		if strings.Contains(strings.ToLower(op), "restore") {
			t.Errorf("an endpoint change rewrote iptables: %v", writes(mk))
		}
	}

	// The masquerade bit moves: every mark moves with it, nothing is left.
	settings.MasqueradeBit = 15
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "3", Resources: []*vsplanev1.Resource{settingsRes(settings)}}))
	fw = fwmarkServers(t, mk)
	for mark := range before {
		if fw[mark] != nil || fw[mark&^0x4000|0x8000] == nil {
			t.Errorf("masquerade bit 15: fwmark servers %v, want %#x moved to %#x", fw, mark, mark&^0x4000|0x8000)
		}
	}
	if marks, _ := inClusterChain(t, mk); len(marks) != 3 || !strings.HasSuffix(marks[0], "/0x8fff") {
		t.Errorf("masquerade bit 15: rules %q", marks)
	}

	// No endpoint anywhere: nothing for in-cluster clients either.
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "4", Resources: []*vsplanev1.Resource{localLBRes("web", "198.18.200.2", 30080)}}))
	if fw := fwmarkServers(t, mk); len(fw) != 0 {
		t.Errorf("without in-cluster real servers: fwmark servers %v remain", fw)
	}
	if marks, jumps := inClusterChain(t, mk); len(marks)+len(jumps) != 0 {
		t.Errorf("without in-cluster real servers: rules %q, jumps %q remain", marks, jumps)
	}
	if len(r.marks.byKey)+len(r.marks.used)+len(r.marks.owned) != 0 {
		t.Errorf("marks not released: %+v", r.marks)
	}
}

// A restarted agent deletes the in-cluster fwmark servers nobody wants
// (left with other marks) and leaves other fwmark servers alone.
func TestInClusterStaleFWMarkServersPruned(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	k := mk.Kernel()
	stale := kernel.VirtualServer{Key: kernel.FWMarkKey(kernel.FamilyIPv4, 0x4abc), Scheduler: "rr"}
	foreign := kernel.VirtualServer{Key: kernel.FWMarkKey(kernel.FamilyIPv4, 0x10000), Scheduler: "rr"}
	for _, vs := range []kernel.VirtualServer{stale, foreign} {
		if err := addVS(k, vs); err != nil {
			t.Fatal(err)
		}
	}
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), localLBRes("web", "198.18.200.2", 30080, "198.19.2.5"))))
	fw := fwmarkServers(t, mk)
	if _, ok := fw[0x4abc]; ok {
		t.Errorf("stale in-cluster fwmark server 0x4abc kept: %v", fw)
	}
	if _, err := k.IPVS.GetVirtualServer(foreign.Key); err != nil {
		t.Errorf("foreign fwmark server 0x10000: %v", err)
	}
}

// A masquerade bit inside the mark field turns the feature off, and says so.
func TestInClusterMasqueradeBitInMarkField(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	settings := defaultNodeSettings()
	settings.MasqueradeBit = 3
	ack := apply(t, r, full(settingsRes(settings), localLBRes("web", "198.18.200.2", 30080, "198.19.2.5")))
	var msgs []string
	for _, e := range ack.GetErrors() {
		msgs = append(msgs, e.GetName()+": "+e.GetMessage())
	}
	if len(msgs) != 1 || !strings.Contains(msgs[0], SettingsResource) || !strings.Contains(msgs[0], "in-cluster mark field") {
		t.Errorf("NACKs %q, want one on node settings about the mark field", msgs)
	}
	if fw := fwmarkServers(t, mk); len(fw) != 0 {
		t.Errorf("fwmark servers %v with the feature off", fw)
	}
	if marks, jumps := inClusterChain(t, mk); len(marks)+len(jumps) != 0 {
		t.Errorf("rules %q, jumps %q with the feature off", marks, jumps)
	}
}

// in_cluster_real_servers only on external kinds, and well-formed.
func TestInClusterBadInput(t *testing.T) {
	c := &compiler{families: familySet{kernel.FamilyIPv4}}
	for _, tc := range []struct {
		name string
		mut  func(*vsplanev1.VirtualServer)
		want string
	}{
		{"on a ClusterIP", func(v *vsplanev1.VirtualServer) { v.Kind = vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP },
			"only for load-balancer"},
		{"IPv6 server of an IPv4 one", func(v *vsplanev1.VirtualServer) { v.InClusterRealServers[0].Address = "2001:2::5" }, "in_cluster_real_servers[0]"},
		{"duplicate", func(v *vsplanev1.VirtualServer) {
			v.InClusterRealServers = append(v.InClusterRealServers, v.InClusterRealServers[0])
		}, "duplicate real server"},
	} {
		res := localLBRes("web", "198.18.200.2", 30080, "198.19.2.5")
		tc.mut(res.GetService().VirtualServers[0])
		rs := c.compile(res)
		if !slices.ContainsFunc(rs.problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: problems %q, want %q", tc.name, rs.problems, tc.want)
		}
	}
}

// local_detect_mode decides what tells Pod traffic: the rules' ClusterIP
// masquerade and in-cluster jumps follow it; a bad interface is NACKed on
// node settings and detection falls back to the cluster CIDRs.
func TestLocalDetectModes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mode       vsplanev1.LocalDetectMode
		iface      string
		nodeCIDRs  []string
		wantJumps  []string
		wantMasq   string // the ClusterIP masquerade rule's start
		wantProblm string
	}{
		{"cluster CIDR", vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_CLUSTER_CIDR, "", nil,
			[]string{"-s 198.19.0.0/16 -j VSPLANE-IN-CLUSTER"}, "! -s 198.19.0.0/16 ", ""},
		// The node's pod CIDRs tell its own Pods among in-cluster clients;
		// the ClusterIP masquerade stays on the cluster CIDRs.
		{"unspecified reads as cluster CIDR; in-cluster by node pod CIDRs", vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_UNSPECIFIED, "cbr0", []string{"198.19.1.0/24"},
			[]string{"-s 198.19.1.0/24 -j VSPLANE-IN-CLUSTER"}, "! -s 198.19.0.0/16 ", ""},
		{"interface mode ignores node pod CIDRs", vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_BRIDGE_INTERFACE, "cbr0", []string{"198.19.1.0/24"},
			[]string{"-i cbr0 -j VSPLANE-IN-CLUSTER"}, "! -i cbr0 ", ""},
		{"node CIDR", vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_NODE_CIDR, "", []string{"198.19.1.0/24", "2001:2:0:101::/64"},
			[]string{"-s 198.19.1.0/24 -j VSPLANE-IN-CLUSTER"}, "! -s 198.19.1.0/24 ", ""},
		{"bridge", vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_BRIDGE_INTERFACE, "cbr0", nil,
			[]string{"-i cbr0 -j VSPLANE-IN-CLUSTER"}, "! -i cbr0 ", ""},
		{"interface prefix", vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_INTERFACE_NAME_PREFIX, "veth", nil,
			[]string{"-i veth+ -j VSPLANE-IN-CLUSTER"}, "! -i veth+ ", ""},
		{"bad bridge", vsplanev1.LocalDetectMode_LOCAL_DETECT_MODE_BRIDGE_INTERFACE, "cbr0 -j ACCEPT", nil,
			[]string{"-s 198.19.0.0/16 -j VSPLANE-IN-CLUSTER"}, "! -s 198.19.0.0/16 ", "local_interface"},
		{"unknown mode", vsplanev1.LocalDetectMode(9), "", nil,
			[]string{"-s 198.19.0.0/16 -j VSPLANE-IN-CLUSTER"}, "! -s 198.19.0.0/16 ", "local_detect_mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := memory.New()
			nodeInterfaces(mk)
			r := newReconciler(t, mk, Config{})
			ns := defaultNodeSettings()
			ns.LocalDetectMode, ns.LocalInterface, ns.NodePodCidrs = tc.mode, tc.iface, tc.nodeCIDRs
			ack := apply(t, r, full(settingsRes(ns), svcA.resource(), localLBRes("web", "198.18.200.2", 30080, "198.19.2.5")))
			var msgs []string
			for _, e := range ack.GetErrors() {
				msgs = append(msgs, e.GetMessage())
			}
			if tc.wantProblm == "" && len(msgs) > 0 || tc.wantProblm != "" && (len(msgs) != 1 || !strings.Contains(msgs[0], tc.wantProblm)) {
				t.Errorf("NACKs %q, want %q", msgs, tc.wantProblm)
			}
			_, jumps := inClusterChain(t, mk)
			if want := append(tc.wantJumps, "-m addrtype --src-type LOCAL -j VSPLANE-IN-CLUSTER"); !slices.Equal(jumps, want) {
				t.Errorf("jumps %q, want %q", jumps, want)
			}
			b, err := mk.Kernel().IPTables.Save(context.Background(), kernel.FamilyIPv4, kernel.TableNAT)
			if err != nil {
				t.Fatal(err)
			}
			want := "-A KUBE-SERVICES " + tc.wantMasq + `-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose"`
			if !strings.Contains(string(b), want) {
				t.Errorf("no %q in\n%s", want, b)
			}
		})
	}
}

// The Services counted in kubeproxy_sync_proxy_rules_no_local_endpoints_total
// are those the control plane marks, templated (NodePort) or not, until
// they go.
func TestNoLocalEndpointsCounted(t *testing.T) {
	mk := memory.New()
	nodeInterfaces(mk)
	r := newReconciler(t, mk, Config{})
	lb := localLBRes("web", "198.18.200.2", 30080, "198.19.2.5")
	lb.GetService().NoLocalEndpointsExternal = true
	itp := svcB.resource()
	itp.GetService().NoLocalEndpointsInternal = true
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), lb, itp, svcA.resource())))
	if s := r.Stats(); s.NoLocalEndpointsInternal != 1 || s.NoLocalEndpointsExternal != 1 {
		t.Errorf("internal %d, external %d, want 1 and 1", s.NoLocalEndpointsInternal, s.NoLocalEndpointsExternal)
	}
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "2", Removed: []string{lb.GetName()}}))
	if s := r.Stats(); s.NoLocalEndpointsInternal != 1 || s.NoLocalEndpointsExternal != 0 {
		t.Errorf("after removing web: internal %d, external %d, want 1 and 0", s.NoLocalEndpointsInternal, s.NoLocalEndpointsExternal)
	}
}
