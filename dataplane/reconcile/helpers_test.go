package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

type backend struct {
	ip     string
	port   uint32
	weight uint32
}

type svcSpec struct {
	name      string
	vip       string
	port      uint32
	proto     vsplanev1.Protocol
	scheduler string
	backends  []backend
}

func tcp(name, vip string, port uint32, backends ...backend) svcSpec {
	return svcSpec{name: name, vip: vip, port: port, proto: vsplanev1.Protocol_PROTOCOL_TCP, backends: backends}
}

func be(ip string, port uint32) backend { return backend{ip: ip, port: port, weight: 1} }

// resource builds a ClusterIP Service resource like the control plane
// would: one virtual server, its KUBE-CLUSTER-IP entry.
func (s svcSpec) resource() *vsplanev1.Resource {
	vs := &vsplanev1.VirtualServer{
		Kind:      vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP,
		Address:   s.vip,
		Family:    vsplanev1.IPFamily_IP_FAMILY_IPV4,
		Port:      s.port,
		Protocol:  s.proto,
		Scheduler: s.scheduler,
		Binding:   vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS,
	}
	for _, b := range s.backends {
		vs.RealServers = append(vs.RealServers, &vsplanev1.RealServer{Address: b.ip, Port: b.port, Weight: b.weight, Ready: true})
	}
	body := &vsplanev1.ServiceState{
		Namespace:      "default",
		Name:           s.name,
		VirtualServers: []*vsplanev1.VirtualServer{vs},
		IpsetEntries: []*vsplanev1.IPSetEntry{{
			Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP, Family: vsplanev1.IPFamily_IP_FAMILY_IPV4,
			Ip: s.vip, Port: s.port, Protocol: s.proto,
		}},
	}
	return &vsplanev1.Resource{
		Name:    "service/default/" + s.name,
		Version: fmt.Sprintf("%x", fmt.Sprint(s)),
		Body:    &vsplanev1.Resource_Service{Service: body},
	}
}

func settingsRes(ns *vsplanev1.NodeSettings) *vsplanev1.Resource {
	return &vsplanev1.Resource{Name: SettingsResource, Version: fmt.Sprintf("%x", ns.String()),
		Body: &vsplanev1.Resource_NodeSettings{NodeSettings: ns}}
}

func defaultNodeSettings() *vsplanev1.NodeSettings {
	return &vsplanev1.NodeSettings{DefaultScheduler: "rr", MasqueradeBit: 14, ClusterCidrs: []string{"198.19.0.0/16"}}
}

var (
	svcA = tcp("a", "198.18.0.10", 80, be("198.19.1.2", 8080), be("198.19.2.3", 8080))
	svcB = svcSpec{name: "b", vip: "198.18.0.11", port: 53, proto: vsplanev1.Protocol_PROTOCOL_UDP,
		backends: []backend{be("198.19.1.5", 5353)}}
)

func newReconciler(t *testing.T, mk *memory.Kernel, cfg Config) *Reconciler {
	t.Helper()
	r, err := New(mk.Kernel(), cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func apply(t *testing.T, r *Reconciler, d *vsplanev1.Delta) *vsplanev1.Ack {
	t.Helper()
	return r.Apply(context.Background(), d)
}

func mustAck(t *testing.T, ack *vsplanev1.Ack) {
	t.Helper()
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("want ACK, got %v: %v", ack.GetStatus(), ack.GetErrors())
	}
}

func full(res ...*vsplanev1.Resource) *vsplanev1.Delta {
	return &vsplanev1.Delta{Nonce: "n", Resources: res, ReplaceAll: true}
}

// kernelState is a comparable summary of what the memory kernel holds.
type kernelState struct {
	Services map[string][]string // "tcp/198.18.0.10:80 rr" -> ["198.19.1.2:8080 w1"]
	Bound    []string
	Sets     map[string][]string // non-empty sets only
}

func readState(t *testing.T, mk *memory.Kernel) kernelState {
	t.Helper()
	k := mk.Kernel()
	st := kernelState{Services: map[string][]string{}, Sets: map[string][]string{}}
	vss, err := k.IPVS.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	for _, vs := range vss {
		ds, err := k.IPVS.ListDestinations(vs.Key)
		if err != nil {
			t.Fatal(err)
		}
		dl := []string{}
		for _, d := range ds {
			dl = append(dl, fmt.Sprintf("%v w%d", d.Key(), d.Weight))
		}
		st.Services[fmt.Sprintf("%v %s", vs.Key, vs.Scheduler)] = dl
	}
	bound, err := k.Links.BoundAddresses(kernel.DummyDevice)
	if err == nil {
		for _, a := range bound {
			st.Bound = append(st.Bound, a.String())
		}
	}
	sets, err := k.IPSets.ListSets()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		es, err := k.IPSets.ListEntries(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			continue
		}
		var l []string
		for _, e := range es {
			l = append(l, e.Format(s.Type))
		}
		sort.Strings(l)
		st.Sets[s.Name] = l
	}
	return st
}

func wantState(t *testing.T, mk *memory.Kernel, want kernelState) {
	t.Helper()
	if d := cmp.Diff(want, readState(t, mk)); d != "" {
		t.Fatalf("kernel state (-want +got):\n%s", d)
	}
}

func natRules(t *testing.T, mk *memory.Kernel, chain string) []string {
	t.Helper()
	return chainRules(t, mk, kernel.TableNAT, chain)
}

// chainRules returns the IPv4 rules of chain in table, as iptables-save
// prints them.
func chainRules(t *testing.T, mk *memory.Kernel, table kernel.Table, chain string) []string {
	t.Helper()
	b, err := mk.Kernel().IPTables.Save(context.Background(), kernel.FamilyIPv4, table)
	if err != nil {
		t.Fatal(err)
	}
	d, err := kernel.ParseSave(b)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := d[0].Chain(chain)
	return c.Rules
}

// writes returns the mutating kernel calls since the last reset.
func writes(mk *memory.Kernel) map[string]int {
	out := map[string]int{}
	for op, n := range mk.Calls() {
		if n > 0 {
			out[op] = n
		}
	}
	return out
}

func ops(m map[string]uint32) map[string]uint32 {
	if m == nil {
		return map[string]uint32{}
	}
	return m
}

// Drift: what someone else does to the kernel behind the agent's back,
// written straight into the memory kernel, not through the reconciler
// (callers pass mk.Kernel()). The kernel interfaces write only in batches:
// these are one-op batches, and the memory kernel's test-only FlushSet and
// DeleteDummy.

func addVS(k kernel.Kernel, vs kernel.VirtualServer) error {
	return k.IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.AddVirtualServer, Server: vs}})[0]
}

func deleteVS(k kernel.Kernel, key kernel.VirtualServerKey) error {
	return k.IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.DeleteVirtualServer, Server: kernel.VirtualServer{Key: key}}})[0]
}

func updateDest(k kernel.Kernel, key kernel.VirtualServerKey, d kernel.Destination) error {
	return k.IPVS.Apply([]kernel.IPVSOp{{Kind: kernel.UpdateDestination, Server: kernel.VirtualServer{Key: key}, Destination: d}})[0]
}

func bindAddr(k kernel.Kernel, dev string, a netip.Addr) error {
	return k.Links.ApplyAddresses(dev, []kernel.AddressOp{{Kind: kernel.BindAddress, Addr: a}})[0]
}

func unbindAddr(k kernel.Kernel, dev string, a netip.Addr) error {
	return k.Links.ApplyAddresses(dev, []kernel.AddressOp{{Kind: kernel.UnbindAddress, Addr: a}})[0]
}

func delEntry(k kernel.Kernel, set kernel.IPSet, e kernel.Entry) error {
	return k.IPSets.ApplyEntries([]kernel.EntryOp{{Kind: kernel.DelEntry, Set: set, Entry: e}})[0]
}

func flushSet(k kernel.Kernel, name string) error { return k.IPSets.(*memory.IPSets).FlushSet(name) }

func deleteDummy(k kernel.Kernel, name string) error {
	return k.Links.(*memory.Links).DeleteDummy(name)
}
