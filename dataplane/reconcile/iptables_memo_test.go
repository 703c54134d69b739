package reconcile

import (
	"bytes"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func TestRenderMemo(t *testing.T) {
	m := renderMemo{}
	in := rules.Input{Family: kernel.FamilyIPv4, MasqueradeBit: 14}
	direct := func(in rules.Input) []byte {
		t.Helper()
		rs, err := rules.Render(in)
		if err != nil {
			t.Fatal(err)
		}
		return rs.Payload(rs.Jumps)
	}

	rs1, full1, err := m.render(in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(full1, direct(in)) || !slices.Equal(rs1.TableNames(), []kernel.Table{kernel.TableFilter, kernel.TableNAT}) {
		t.Fatalf("first rendering differs from rules.Render")
	}
	_, full2, err := m.render(in)
	if err != nil {
		t.Fatal(err)
	}
	if &full2[0] != &full1[0] {
		t.Fatal("an equal Input was rendered again")
	}

	// Any difference renders again, and the result is Render's.
	in2 := in
	in2.NonEmpty = in2.NonEmpty.With(rules.SetExternalIP)
	_, full3, err := m.render(in2)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(full3, full1) || !bytes.Equal(full3, direct(in2)) {
		t.Fatal("a changed Input did not render its own rules")
	}

	// The memo keeps its own copy of the load-balancer list: a caller
	// reusing its slice does not change what the memo compares with.
	lb := []rules.VirtualPort{{IP: netip.MustParseAddr("198.18.0.1"), Port: 80, Protocol: kernel.ProtocolTCP}}
	in3 := in
	in3.LoadBalancerNoNodeAccess = lb
	_, full4, err := m.render(in3)
	if err != nil {
		t.Fatal(err)
	}
	lb[0].Port = 81
	_, full5, err := m.render(in3)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(full4, full5) || !bytes.Equal(full5, direct(in3)) {
		t.Fatal("a load-balancer list changed in place was not rendered again")
	}

	// An error is returned every time, and forgets the family's rendering.
	bad := in
	bad.MasqueradeBit = 40
	for range 2 {
		if _, _, err := m.render(bad); err == nil {
			t.Fatal("want an error for masquerade bit 40")
		}
	}
	if _, ok := m[kernel.FamilyIPv4]; ok {
		t.Fatal("the memo kept a rendering after an error")
	}
	// Families are remembered separately.
	v6 := rules.Input{Family: kernel.FamilyIPv6, MasqueradeBit: 14}
	_, f6, err := m.render(v6)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f6, direct(v6)) {
		t.Fatal("IPv6 rendering differs from rules.Render")
	}
}

// TestSameRulesInputComparesEveryField changes each field of rules.Input
// in turn: sameRulesInput must notice. A new field fails here until both
// this test and sameRulesInput know it.
func TestSameRulesInputComparesEveryField(t *testing.T) {
	base := rules.Input{Family: kernel.FamilyIPv4, MasqueradeBit: 14}
	if !sameRulesInput(base, base) {
		t.Fatal("an Input differs from itself")
	}
	typ := reflect.TypeFor[rules.Input]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		changed := base
		switch f.Name {
		case "Family":
			changed.Family = kernel.FamilyIPv6
		case "MasqueradeAll":
			changed.MasqueradeAll = true
		case "MasqueradeBit":
			changed.MasqueradeBit = 15
		case "ClusterCIDRs":
			changed.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}
		case "RandomFully":
			changed.RandomFully = true
		case "ConntrackTCPLiberal":
			changed.ConntrackTCPLiberal = true
		case "NonEmpty":
			changed.NonEmpty = changed.NonEmpty.With(rules.SetClusterIP)
		case "LoadBalancerNoNodeAccess":
			changed.LoadBalancerNoNodeAccess = []rules.VirtualPort{{IP: netip.MustParseAddr("198.18.0.1"), Port: 80, Protocol: kernel.ProtocolTCP}}
		case "NodePodCIDRs":
			changed.NodePodCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.1.0/24")}
		case "LocalInterface":
			changed.LocalInterface = "cbr0"
		case "InClusterMarks":
			changed.InClusterMarks = []rules.InClusterMark{{Dest: rules.VirtualPort{IP: netip.MustParseAddr("198.18.0.1"), Port: 80, Protocol: kernel.ProtocolTCP}, Mark: 0x4001}}
		default:
			t.Fatalf("rules.Input.%s is new: compare it in sameRulesInput and change it here", f.Name)
		}
		if sameRulesInput(base, changed) || sameRulesInput(changed, base) {
			t.Errorf("sameRulesInput ignores rules.Input.%s", f.Name)
		}
	}
}

// TestApplyRendersRulesOnlyWhenTheirInputChanges: an endpoint change
// reuses the rendering; a Service that makes a set non-empty changes the
// rules in the kernel, as without the memo.
func TestApplyRendersRulesOnlyWhenTheirInputChanges(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), tcp("a", "198.18.0.1", 80, be("198.19.1.1", 8080)).resource())))
	before := r.rendered[kernel.FamilyIPv4].full
	if len(before) == 0 {
		t.Fatal("no rendering remembered after the first Apply")
	}
	restores := mk.Calls()["iptables.Restore"]

	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{
		tcp("a", "198.18.0.1", 80, be("198.19.1.2", 8080)).resource()}}))
	if got := r.rendered[kernel.FamilyIPv4].full; &got[0] != &before[0] {
		t.Fatal("an endpoint change rendered the rules again")
	}
	if got := mk.Calls()["iptables.Restore"]; got != restores {
		t.Fatalf("an endpoint change restored iptables (%d restores, want %d)", got, restores)
	}

	// An external IP makes KUBE-EXTERNAL-IP non-empty: its rule appears.
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "3", Resources: []*vsplanev1.Resource{extRes("x", "203.0.113.7")}}))
	if got := mk.Calls()["iptables.Restore"]; got != restores+1 {
		t.Fatalf("a new non-empty set: %d restores, want %d", got, restores+1)
	}
	if !slices.ContainsFunc(natRules(t, mk, "KUBE-SERVICES"), func(rule string) bool {
		return bytes.Contains([]byte(rule), []byte("KUBE-EXTERNAL-IP"))
	}) {
		t.Fatalf("KUBE-SERVICES lacks the external-IP rule: %q", natRules(t, mk, "KUBE-SERVICES"))
	}
}
