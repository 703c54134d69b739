package inspect

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// TestSetsAndRulesCompared: the managed ipsets and the agent's iptables
// chains and jumps are compared with the desired state. In sync after an
// Apply; each kind of drift (an entry deleted, one added, a chain flushed,
// a jump deleted) is reported where it is and counted, without a write.
func TestSetsAndRulesCompared(t *testing.T) {
	mk, r, _ := setup(t)
	a := service("a", "198.18.0.10", 80, "198.19.1.2")
	a.GetService().IpsetEntries = []*vsplanev1.IPSetEntry{{Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP,
		Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Ip: "198.18.0.10", Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP}}
	if ack := r.Apply(context.Background(), &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{a}}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v", ack.GetErrors())
	}
	c := serve(t, r, mk)
	get := func() *vsplanev1.GetKernelStateResponse {
		t.Helper()
		mk.ResetCalls()
		resp, err := c.GetKernelState(context.Background(), &vsplanev1.GetKernelStateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		requireNoWrites(t, mk)
		return resp
	}
	resp := get()
	if resp.GetDifferences() != 0 || len(resp.GetReadErrors()) != 0 {
		t.Fatalf("in sync: differences %d, read errors %v\n%v", resp.GetDifferences(), resp.GetReadErrors(), resp)
	}
	if want := len(rules.AllSets()); len(resp.GetIpsets()) != want {
		t.Fatalf("%d ipsets listed, want every managed one (%d)", len(resp.GetIpsets()), want)
	}
	sets := map[string]*vsplanev1.IPSetState{}
	for _, s := range resp.GetIpsets() {
		sets[s.GetName()] = s
	}
	if n := sets["KUBE-CLUSTER-IP"].GetEntriesInSync(); n != 1 {
		t.Fatalf("KUBE-CLUSTER-IP: %d entries in sync, want 1", n)
	}
	if n := sets["KUBE-IPVS-IPS"].GetEntriesInSync(); n != 2 {
		t.Fatalf("KUBE-IPVS-IPS: %d entries in sync, want the 2 bound addresses", n)
	}
	chains := map[string]*vsplanev1.ChainState{}
	for _, ch := range resp.GetChains() {
		chains[ch.GetTable()+"/"+ch.GetChain()] = ch
	}
	if ch := chains["nat/KUBE-SERVICES"]; ch.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC || ch.GetDesiredRules() == 0 {
		t.Fatalf("nat KUBE-SERVICES: %v", ch)
	}
	if len(resp.GetJumps()) == 0 {
		t.Fatal("no jumps compared")
	}

	// Drift, each kind once.
	k := mk.Kernel()
	clusterIP := kernel.IPSet{Name: "KUBE-CLUSTER-IP", Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
	ipvsIPs := kernel.IPSet{Name: "KUBE-IPVS-IPS", Type: kernel.HashIP, Family: kernel.FamilyIPv4}
	stray := kernel.Entry{IP: netip.MustParseAddr("198.18.0.99"), Protocol: kernel.ProtocolTCP, Port: 8080}
	if errs := k.IPSets.ApplyEntries([]kernel.EntryOp{
		{Kind: kernel.DelEntry, Set: ipvsIPs, Entry: kernel.Entry{IP: netip.MustParseAddr("198.18.0.11")}},
		{Kind: kernel.AddEntry, Set: clusterIP, Entry: stray},
	}); slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		t.Fatalf("ipset drift: %v", errs)
	}
	portals := `-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
	if err := k.IPTables.Restore(context.Background(), kernel.FamilyIPv4, []byte("*nat\n-F KUBE-SERVICES\n-D PREROUTING "+portals+"\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	resp = get()
	for _, s := range resp.GetIpsets() {
		sets[s.GetName()] = s
	}
	if s := sets["KUBE-IPVS-IPS"]; s.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS ||
		!slices.Equal(s.GetMissingEntries(), []string{"198.18.0.11"}) || len(s.GetExtraEntries()) != 0 || s.GetEntriesInSync() != 1 {
		t.Errorf("KUBE-IPVS-IPS after an entry was deleted: %v", s)
	}
	if s := sets["KUBE-CLUSTER-IP"]; s.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS ||
		!slices.Equal(s.GetExtraEntries(), []string{"198.18.0.99,tcp:8080"}) || len(s.GetMissingEntries()) != 0 {
		t.Errorf("KUBE-CLUSTER-IP after an entry was added: %v", s)
	}
	for _, ch := range resp.GetChains() {
		chains[ch.GetTable()+"/"+ch.GetChain()] = ch
	}
	svc := chains["nat/KUBE-SERVICES"]
	if svc.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS || svc.GetKernelRules() != 0 ||
		len(svc.GetMissingRules()) != int(svc.GetDesiredRules()) || len(svc.GetExtraRules()) != 0 {
		t.Errorf("nat KUBE-SERVICES after a flush: %v", svc)
	}
	var missingJumps []string
	for _, j := range resp.GetJumps() {
		if j.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			missingJumps = append(missingJumps, j.GetTable()+" "+j.GetChain()+" "+j.GetRule()+" "+j.GetStatus().String())
		}
	}
	if want := []string{"nat PREROUTING " + portals + " ITEM_STATUS_MISSING_IN_KERNEL"}; !slices.Equal(missingJumps, want) {
		t.Errorf("jumps not in sync %q, want %q", missingJumps, want)
	}
	// One missing entry, one extra entry, one chain, one jump.
	if resp.GetDifferences() != 4 {
		t.Errorf("differences = %d, want 4\n%v", resp.GetDifferences(), resp)
	}

	// A full reconcile repairs it all, and inspection agrees.
	r.Reconcile(context.Background())
	if resp := get(); resp.GetDifferences() != 0 {
		t.Fatalf("after a full reconcile: differences %d\n%v", resp.GetDifferences(), resp)
	}
}

// TestRuleDifference: rules are matched as a multiset, in the first list's
// order.
func TestRuleDifference(t *testing.T) {
	got := ruleDifference([]string{"a", "b", "a", "c"}, []string{"a", "c", "d"})
	if want := []string{"b", "a"}; !slices.Equal(got, want) {
		t.Fatalf("ruleDifference = %q, want %q", got, want)
	}
	if got := ruleDifference([]string{"x", "y"}, []string{"y", "x"}); got != nil {
		t.Fatalf("same rules in another order: %q, want none", got)
	}
}
