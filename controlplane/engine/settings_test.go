package engine

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
)

// versions returns every node's resource versions.
func versions(st *snapshot.Store, nodes ...string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, n := range nodes {
		rs, _, _ := st.List(n)
		out[n] = map[string]string{}
		for _, e := range rs {
			out[n][e.Resource.Name] = e.Resource.Version
		}
	}
	return out
}

// changedSince lists "node name" of the resources whose version differs.
func changedSince(before, after map[string]map[string]string) []string {
	var out []string
	for n, rs := range after {
		for name, v := range rs {
			if before[n][name] != v {
				out = append(out, n+" "+name)
			}
		}
		for name := range before[n] {
			if _, ok := rs[name]; !ok {
				out = append(out, n+" -"+name)
			}
		}
	}
	return out
}

func TestSetTranslateAppliesOnNextApply(t *testing.T) {
	e, st, reg := newEngine(t)
	c := changes()
	for i, n := range []string{"n1", "n2"} {
		ip := netip.AddrFrom4([4]byte{198, 19, 0, byte(11 + i)})
		c.Nodes[n] = watch.Change[model.Node]{Current: &watch.Observed[model.Node]{Value: &model.Node{Name: n, Addresses: []netip.Addr{ip}}}}
	}
	setService(c, "web", "198.18.0.10", time.Time{})
	// np's load-balancer IP is n1's address on the port that is its
	// NodePort: the only kind of Service whose translation reads
	// NodePortAddresses (an external IP there is dropped before, by
	// conflicts.go, whatever NodePortAddresses say).
	npKey := model.ServiceKey{Namespace: "ns", Name: "np"}
	c.Services[npKey] = watch.Change[model.Service]{Current: &watch.Observed[model.Service]{Value: &model.Service{
		Key: npKey, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.0.11")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("198.19.0.11")},
		Ports:           []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 30080, NodePort: 30080}},
	}}}
	apply(t, e, c)
	if !translate.UsesNodePortAddresses(c.Services[npKey].Current.Value) {
		t.Fatal("fixture: np should read NodePortAddresses")
	}
	nodes := []string{"n1", "n2"}
	const settings, np = snapshot.NodeSettingsName, "service/ns/np" // and service/ns/web, which must never change
	if e.Pending() {
		t.Fatal("pending before SetTranslate")
	}

	// 1. A new default scheduler: node settings only, nothing recomputed.
	before, translations := versions(st, nodes...), gathered(t, reg, metricTranslations, nil)
	cfg := e.cfg.Translate
	cfg.DefaultScheduler = "wlc"
	e.SetTranslate(cfg)
	if !e.Pending() {
		t.Fatal("SetTranslate does not make the engine pending (the watcher would not run an Apply)")
	}
	if got := get(t, st, "n1", settings).GetNodeSettings().GetDefaultScheduler(); got != "rr" {
		t.Fatalf("applied before the next Apply: %q", got)
	}
	apply(t, e, changes())
	if e.Pending() {
		t.Error("still pending after Apply")
	}
	for _, n := range nodes {
		if got := get(t, st, n, settings).GetNodeSettings().GetDefaultScheduler(); got != "wlc" {
			t.Errorf("%s default scheduler %q, want wlc", n, got)
		}
	}
	if got := strings.Join(sorted(changedSince(before, versions(st, nodes...))), ","); got != "n1 "+settings+",n2 "+settings {
		t.Errorf("changed %s; want only both nodes' settings", got)
	}
	if got := gathered(t, reg, metricTranslations, nil); got != translations {
		t.Errorf("a scheduler change translated %v Services, want 0", got-translations)
	}

	// 2. NodePortAddresses that leave n1's address out: settings and np on
	// n1 (its load-balancer IP no longer collides with a NodePort address).
	before = versions(st, nodes...)
	npOnN1 := get(t, st, "n1", np).GetService().GetProblems()
	cfg.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("198.19.9.0/24")}
	e.SetTranslate(cfg)
	apply(t, e, changes())
	if got := strings.Join(sorted(changedSince(before, versions(st, nodes...))), ","); got != "n1 "+settings+",n1 "+np+",n2 "+settings {
		t.Errorf("changed %s; want both nodes' settings and np on n1", got)
	}
	if len(npOnN1) == 0 || len(get(t, st, "n1", np).GetService().GetProblems()) != 0 {
		t.Errorf("np on n1: problems before %v, after %v; want the NodePort collision gone", npOnN1, get(t, st, "n1", np).GetService().GetProblems())
	}
	if got := get(t, st, "n2", settings).GetNodeSettings().GetNodePortAddresses(); strings.Join(got, ",") != "198.19.9.0/24" {
		t.Errorf("n2 node_port_addresses %v", got)
	}

	// 3. The same settings again: nothing changes.
	before = versions(st, nodes...)
	e.SetTranslate(cfg)
	apply(t, e, changes())
	if got := changedSince(before, versions(st, nodes...)); len(got) != 0 {
		t.Errorf("unchanged settings changed %v", got)
	}

	// 4. A node joining after the change gets the new settings.
	c = changes()
	addNode(c, "n3")
	apply(t, e, c)
	if got := get(t, st, "n3", settings).GetNodeSettings().GetDefaultScheduler(); got != "wlc" {
		t.Errorf("new node's default scheduler %q", got)
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
