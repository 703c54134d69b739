package reconcile

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestStorePutKeepsIndexesOfUnchangedKeys: put skips unindex and index when
// a resource's new state indexes like its old one (an endpoint change);
// the indexes must end as if it had not, over random replacements,
// additions and removals (the order of an entry's owners aside).
func TestStorePutKeepsIndexesOfUnchangedKeys(t *testing.T) {
	comp := &compiler{families: familySet{kernel.FamilyIPv4}}
	variants := func(name string) []*vsplanev1.Resource {
		var out []*vsplanev1.Resource
		for _, vip := range []string{"198.18.0.1", "198.18.0.2"} {
			for _, port := range []uint32{80, 81} {
				out = append(out,
					tcp(name, vip, port, be("198.19.1.1", 8080)).resource(),
					tcp(name, vip, port, be("198.19.1.2", 8080), be("198.19.1.3", 8080)).resource())
			}
		}
		// The same virtual server with other entries: a firewalled load
		// balancer's, or none.
		fw := tcp(name, "198.18.0.1", 80, be("198.19.1.1", 8080)).resource()
		fw.GetService().IpsetEntries = append(fw.GetService().IpsetEntries, &vsplanev1.IPSetEntry{
			Set: vsplanev1.IPSet_IP_SET_LOAD_BALANCER_FW, Family: vsplanev1.IPFamily_IP_FAMILY_IPV4,
			Ip: "203.0.113.9", Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP})
		bare := tcp(name, "198.18.0.1", 80, be("198.19.1.2", 8080)).resource()
		bare.GetService().IpsetEntries = nil
		// The same virtual server and entries with a health check, or
		// with a NodePort template beside them.
		hc := tcp(name, "198.18.0.1", 80, be("198.19.1.1", 8080)).resource()
		hc.GetService().HealthCheckNodePort = 30000
		np := tcp(name, "198.18.0.1", 80, be("198.19.1.2", 8080)).resource()
		np.GetService().VirtualServers = append(np.GetService().VirtualServers, &vsplanev1.VirtualServer{
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT, Family: vsplanev1.IPFamily_IP_FAMILY_IPV4,
			Port: 30080, Protocol: vsplanev1.Protocol_PROTOCOL_TCP, NodePortAddresses: true,
			RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.2", Port: 8080, Weight: 1, Ready: true}}})
		if rs := comp.compile(hc); rs.health == nil {
			t.Fatalf("no health check compiled: %v", rs.problems)
		}
		if rs := comp.compile(np); rs.tmpl == nil {
			t.Fatalf("no NodePort template compiled: %v", rs.problems)
		}
		return append(out, fw, bare, hc, np,
			extRes(name, "203.0.113.1"), extRes(name, "203.0.113.1", "203.0.113.2"), extRes(name, "203.0.113.2"))
	}
	fast, ref := newStore(), newStore()
	refPut := func(name string, rs *resourceState) {
		if old := ref.res[name]; old != nil {
			ref.unindex(old)
			delete(ref.res, name)
		}
		if rs != nil {
			ref.res[name] = rs
			ref.index(rs)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	skipped := 0
	for i := range 5000 {
		name := fmt.Sprintf("service/default/s%d", rng.IntN(5))
		var rs *resourceState
		if rng.IntN(8) != 0 {
			vs := variants(name[len("service/default/"):])
			rs = comp.compile(vs[rng.IntN(len(vs))])
		}
		if old := fast.res[name]; old != nil && rs != nil && sameIndexing(old, rs) {
			skipped++
		}
		if got, want := fast.put(name, rs), ref.res[name]; got != want {
			t.Fatalf("step %d: put returned %p, want the previous state %p", i, got, want)
		}
		refPut(name, rs)
		if d := cmp.Diff(indexes(ref), indexes(fast)); d != "" {
			t.Fatalf("step %d (%s): indexes differ (-unindex and index +put):\n%s", i, name, d)
		}
	}
	if skipped == 0 {
		t.Fatal("no put kept the indexes: the test does not cover it")
	}
}

// indexes summarizes s's indexes, each entry's owners sorted.
func indexes(s *store) map[string]string {
	out := map[string]string{}
	for name, rs := range s.res {
		out["res "+name] = fmt.Sprintf("%p", rs)
	}
	for k, v := range s.vsOwners {
		out["vsOwners "+k.String()] = fmt.Sprint(v)
	}
	for a, m := range s.addrVS {
		for _, c := range m {
			out["addrVS "+a.String()+" "+c.key.String()] = fmt.Sprint(c.n)
		}
	}
	for e, owners := range s.entryRefs {
		out["entryRefs "+e.String()] = fmt.Sprint(slices.Sorted(slices.Values(owners)))
	}
	for r, n := range s.setRefs {
		out["setRefs "+r.name()] = fmt.Sprint(n)
	}
	for r, n := range s.setSize {
		out["setSize "+r.name()] = fmt.Sprint(n)
	}
	for kind, m := range map[string]map[string]bool{"templated": s.templated, "checks": s.checks, "firewalled": s.firewalled} {
		for n, v := range m {
			out[kind+" "+n] = fmt.Sprint(v)
		}
	}
	return out
}
