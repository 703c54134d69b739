package engine

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
)

func setNodePortService(c *watch.Changes, name string, created int64, nodePort uint16, extIPs ...string) {
	k := model.ServiceKey{Namespace: "ns", Name: name}
	svc := &model.Service{
		Key: k, Type: model.ServiceTypeNodePort, Created: created,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10")},
		Ports:      []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: nodePort}},
	}
	if nodePort == 0 {
		svc.Type = model.ServiceTypeClusterIP
	}
	for _, ip := range extIPs {
		svc.ExternalIPs = append(svc.ExternalIPs, netip.MustParseAddr(ip))
	}
	c.Services[k] = watch.Change[model.Service]{Trigger: time.Unix(created, 0), Current: &watch.Observed[model.Service]{Value: svc}}
}

func deleteService(c *watch.Changes, name string) {
	k := model.ServiceKey{Namespace: "ns", Name: name}
	c.Services[k] = watch.Change[model.Service]{Trigger: time.Unix(900, 0)}
}

// translated is what the translator was last given for a Service.
func translated(t *testing.T, e *Engine, name string) translate.Input {
	t.Helper()
	se := e.services[model.ServiceKey{Namespace: "ns", Name: name}]
	if se == nil || se.in.Service == nil {
		t.Fatalf("service %s not translated", name)
	}
	return se.in
}

// nodePortOf is the NodePort of a Service's first port as the translator
// programs it: 0 when the conflicts it was given say another Service owns it.
func nodePortOf(t *testing.T, e *Engine, name string) uint16 {
	t.Helper()
	in := translated(t, e, name)
	sp := in.Service.Ports[0]
	if _, lost := in.Conflicts.NodePorts[translate.NodePort{Protocol: sp.Protocol, Port: sp.NodePort}]; lost {
		return 0
	}
	return sp.NodePort
}

// externalIPsOf are a Service's external IPs the translator programs: those
// the conflicts it was given do not drop.
func externalIPsOf(t *testing.T, e *Engine, name string) []netip.Addr {
	t.Helper()
	in := translated(t, e, name)
	return slices.DeleteFunc(slices.Clone(in.Service.ExternalIPs), func(ip netip.Addr) bool {
		_, dropped := in.Conflicts.ExternalIPs[ip]
		return dropped
	})
}

func hasProblem(e *Engine, name string, r model.Reason) bool {
	for _, p := range e.Problems(model.ServiceKey{Namespace: "ns", Name: name}) {
		if p.Reason == r {
			return true
		}
	}
	return false
}

func TestDuplicateNodePortGoesToTheOlderService(t *testing.T) {
	e, _, _ := newEngine(t)
	c := changes()
	addNode(c, "n1")
	setNodePortService(c, "old", 100, 30080)
	apply(t, e, c)

	// A newer Service claiming the same port must not take it.
	c = changes()
	setNodePortService(c, "new", 200, 30080)
	apply(t, e, c)
	if got := nodePortOf(t, e, "old"); got != 30080 {
		t.Errorf("older service lost its NodePort: %d", got)
	}
	if got := nodePortOf(t, e, "new"); got != 0 {
		t.Errorf("newer service kept the conflicting NodePort %d", got)
	}
	if got := translated(t, e, "new").Service.Ports[0].NodePort; got != 30080 {
		t.Errorf("the translator got a changed Service (nodePort %d), not the one as read", got)
	}
	if !hasProblem(e, "new", ReasonNodePortConflict) || hasProblem(e, "old", ReasonNodePortConflict) {
		t.Errorf("problems: old %v new %v", e.Problems(model.ServiceKey{Namespace: "ns", Name: "old"}),
			e.Problems(model.ServiceKey{Namespace: "ns", Name: "new"}))
	}
	if p := e.Problems(model.ServiceKey{Namespace: "ns", Name: "new"}); len(p) != 1 || !strings.Contains(p[0].Detail, "ns/old") {
		t.Errorf("problem does not name the owner: %v", p)
	}
	if got := counter(e.invalid.WithLabelValues("Service", string(ReasonNodePortConflict))); got != 1 {
		t.Errorf("conflict counted %v times, want 1", got)
	}

	// A periodic resync neither changes the outcome nor counts it again.
	c = changes()
	c.Periodic = true
	apply(t, e, c)
	if got := counter(e.invalid.WithLabelValues("Service", string(ReasonNodePortConflict))); got != 1 {
		t.Errorf("conflict counted %v times after resync, want 1", got)
	}

	// The same number on another protocol is no conflict.
	c = changes()
	k := model.ServiceKey{Namespace: "ns", Name: "udp"}
	c.Services[k] = watch.Change[model.Service]{Current: &watch.Observed[model.Service]{Value: &model.Service{
		Key: k, Type: model.ServiceTypeNodePort, Created: 300, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.11")},
		Ports: []model.ServicePort{{Name: "dns", Protocol: model.UDP, Port: 53, NodePort: 30080}},
	}}}
	apply(t, e, c)
	if got := nodePortOf(t, e, "udp"); got != 30080 || hasProblem(e, "udp", ReasonNodePortConflict) {
		t.Errorf("UDP NodePort with a TCP namesake: nodePort %d, problems %v", got, e.Problems(k))
	}

	// When the owner goes, the waiting Service gets the port, in the same
	// batch, without being changed itself.
	c = changes()
	deleteService(c, "old")
	apply(t, e, c)
	if got := nodePortOf(t, e, "new"); got != 30080 {
		t.Errorf("remaining service did not get the NodePort: %d", got)
	}
	if hasProblem(e, "new", ReasonNodePortConflict) {
		t.Errorf("stale conflict problem: %v", e.Problems(model.ServiceKey{Namespace: "ns", Name: "new"}))
	}
}

func TestExternalIPOnANodesNodePortIsDropped(t *testing.T) {
	e, _, _ := newEngine(t)
	c := changes()
	c.Nodes["n1"] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{
		Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("198.19.0.11")}}}}
	setNodePortService(c, "np", 100, 30080)
	// Port 80 on a node address is no NodePort: kept, like kube-proxy.
	setNodePortService(c, "fine", 150, 0, "198.19.0.11")
	apply(t, e, c)
	if got := externalIPsOf(t, e, "fine"); len(got) != 1 {
		t.Errorf("external IP on a non-NodePort port dropped: %v", got)
	}

	// An external IP equal to the node's address on port 30080/TCP would be
	// the same IPVS virtual server as np's NodePort on that node.
	c = changes()
	k := model.ServiceKey{Namespace: "ns", Name: "hijack"}
	c.Services[k] = watch.Change[model.Service]{Current: &watch.Observed[model.Service]{Value: &model.Service{
		Key: k, Created: 200, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.12")},
		Ports:       []model.ServicePort{{Name: "x", Protocol: model.TCP, Port: 30080}},
		ExternalIPs: []netip.Addr{netip.MustParseAddr("198.19.0.11"), netip.MustParseAddr("198.18.100.1")},
	}}}
	apply(t, e, c)
	got := externalIPsOf(t, e, "hijack")
	if len(got) != 1 || got[0] != netip.MustParseAddr("198.18.100.1") {
		t.Errorf("external IPs = %v, want only 198.18.100.1", got)
	}
	if !hasProblem(e, "hijack", ReasonExternalIPConflict) {
		t.Errorf("no conflict problem: %v", e.Problems(k))
	}
	if got := nodePortOf(t, e, "np"); got != 30080 {
		t.Errorf("NodePort owner disturbed: %d", got)
	}

	// The NodePort goes away: the external IP comes back.
	c = changes()
	deleteService(c, "np")
	apply(t, e, c)
	if got := externalIPsOf(t, e, "hijack"); len(got) != 2 || hasProblem(e, "hijack", ReasonExternalIPConflict) {
		t.Errorf("after the NodePort left: external IPs %v, problems %v", got, e.Problems(k))
	}

	// The node's address changes away from the external IP: still fine; and
	// when a node takes that address with a NodePort present, it is dropped.
	c = changes()
	setNodePortService(c, "np", 100, 30080)
	c.Nodes["n1"] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{
		Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("198.19.0.12")}}}}
	apply(t, e, c)
	if got := externalIPsOf(t, e, "hijack"); len(got) != 2 {
		t.Errorf("external IPs %v after the node moved away", got)
	}
	c = changes()
	c.Nodes["n2"] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{
		Name: "n2", Addresses: []netip.Addr{netip.MustParseAddr("198.19.0.11")}}}}
	apply(t, e, c)
	if got := externalIPsOf(t, e, "hijack"); len(got) != 1 || !hasProblem(e, "hijack", ReasonExternalIPConflict) {
		t.Errorf("node n2 took the address: external IPs %v, problems %v", got, e.Problems(k))
	}
}

// Two Services on one external IP, port and protocol, or sharing a
// load-balancer IP on one port: the older one keeps the virtual server on
// every node, the newer leaves it out with a problem; different ports on a
// shared IP are no conflict; the newer takes over when the older goes.
func TestSharedExternalAndLoadBalancerVirtualServersGoToTheOlderService(t *testing.T) {
	e, st, _ := newEngine(t)
	c := changes()
	addNode(c, "n1")
	addNode(c, "n2")
	setNodePortService(c, "old", 100, 0, "198.18.100.1")
	setNodePortService(c, "new", 200, 0, "198.18.100.1")
	// LB sharing: same IP, one on port 80 (conflict with lb-old), one on 443.
	lb := func(name string, created int64, port uint16) {
		k := model.ServiceKey{Namespace: "ns", Name: name}
		c.Services[k] = watch.Change[model.Service]{Current: &watch.Observed[model.Service]{Value: &model.Service{
			Key: k, Type: model.ServiceTypeLoadBalancer, Created: created,
			ClusterIPs:      []netip.Addr{netip.MustParseAddr("198.18.0.20")},
			Ports:           []model.ServicePort{{Name: "p", Protocol: model.TCP, Port: port}},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.18.200.5")},
		}}}
	}
	lb("lb-old", 100, 80)
	lb("lb-new", 300, 80)
	lb("lb-https", 400, 443)
	apply(t, e, c)

	vsOn := func(node, name, addr string) bool {
		for _, vs := range get(t, st, node, "service/ns/"+name).GetService().GetVirtualServers() {
			if vs.GetAddress() == addr {
				return true
			}
		}
		return false
	}
	for _, n := range []string{"n1", "n2"} {
		for _, c := range []struct {
			svc, addr string
			want      bool
		}{{"old", "198.18.100.1", true}, {"new", "198.18.100.1", false},
			{"lb-old", "198.18.200.5", true}, {"lb-new", "198.18.200.5", false}, {"lb-https", "198.18.200.5", true}} {
			if got := vsOn(n, c.svc, c.addr); got != c.want {
				t.Errorf("%s: %s has a virtual server on %s: %v, want %v", n, c.svc, c.addr, got, c.want)
			}
		}
	}
	for name, want := range map[string]bool{"old": false, "new": true, "lb-old": false, "lb-new": true, "lb-https": false} {
		if got := hasProblem(e, name, ReasonVIPConflict); got != want {
			t.Errorf("%s has a %s problem: %v, want %v", name, ReasonVIPConflict, got, want)
		}
	}
	if p := e.Problems(model.ServiceKey{Namespace: "ns", Name: "new"}); len(p) == 0 || !strings.Contains(p[0].Detail, "ns/old") {
		t.Errorf("the loser's problem does not name the owner: %v", p)
	}
	// The owner goes: the newer Service gets the virtual server.
	c = changes()
	deleteService(c, "old")
	apply(t, e, c)
	if !vsOn("n1", "new", "198.18.100.1") || hasProblem(e, "new", ReasonVIPConflict) {
		t.Error("the remaining Service did not take the external IP over")
	}
}

// Three Services claim one NodePort (or one external IP's port); the owner
// goes. The third still loses, now to the second, and its state (with the
// problem naming its owner) must be what a replica computing from scratch
// holds: every claimant is rechecked when the owner changes, not only the
// old and new owners (found by review, 2026-12-07).
func TestThirdClaimantFollowsAnOwnerChange(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodePort uint16
		extIPs   []string
	}{{"nodeport", 30080, nil}, {"external IP", 0, []string{"198.18.100.1"}}} {
		t.Run(tc.name, func(t *testing.T) {
			build := func(withOwner bool) (*Engine, map[string]map[string]string) {
				e, st, _ := newEngine(t)
				c := changes()
				addNode(c, "n1")
				addNode(c, "n2")
				if withOwner {
					setNodePortService(c, "a", 1, tc.nodePort, tc.extIPs...)
				}
				setNodePortService(c, "b", 2, tc.nodePort, tc.extIPs...)
				setNodePortService(c, "c", 3, tc.nodePort, tc.extIPs...)
				apply(t, e, c)
				return e, versions(st, "n1", "n2")
			}
			e, _ := build(true)
			c := changes()
			deleteService(c, "a")
			apply(t, e, c)
			_, want := build(false)
			got := versions(e.store, "n1", "n2")
			if !maps.EqualFunc(got, want, maps.Equal) {
				t.Errorf("after the owner went:\n got %v\nwant %v", got, want)
			}
			if p := e.Problems(model.ServiceKey{Namespace: "ns", Name: "c"}); len(p) == 0 || !strings.Contains(p[0].Detail, "ns/b") {
				t.Errorf("c's problem does not name its new owner b: %v", p)
			}
		})
	}
}
