package reconcile

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// extRes is a Service with one ExternalIP virtual server per address and
// their KUBE-EXTERNAL-IP entries.
func extRes(name string, addrs ...string) *vsplanev1.Resource {
	svc := &vsplanev1.ServiceState{Namespace: "default", Name: name}
	for _, a := range addrs {
		svc.VirtualServers = append(svc.VirtualServers, &vsplanev1.VirtualServer{
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP, Address: a, Port: 80,
			Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL,
			RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.2", Port: 80, Weight: 1}},
		})
		svc.IpsetEntries = append(svc.IpsetEntries, &vsplanev1.IPSetEntry{Set: vsplanev1.IPSet_IP_SET_EXTERNAL_IP,
			Ip: a, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP})
	}
	return &vsplanev1.Resource{Name: "service/default/" + name, Version: fmt.Sprint(addrs),
		Body: &vsplanev1.Resource_Service{Service: svc}}
}

func nackedNames(ack *vsplanev1.Ack) map[string]string {
	out := map[string]string{}
	for _, e := range ack.GetErrors() {
		out[e.GetName()] = e.GetMessage()
	}
	return out
}

// More entries than maxelem: whole resources are admitted in name order,
// the others are NACKed with the reason, and everything else is right.
func TestSetCapacity(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{maxElem: 3})
	a := extRes("e1", "198.18.100.1", "198.18.100.2")
	b := extRes("e2", "198.18.100.3", "198.18.100.4")
	c := extRes("e3", "198.18.100.5")
	ack := apply(t, r, full(settingsRes(defaultNodeSettings()), a, b, c, svcA.resource()))
	nacked := nackedNames(ack)
	if len(nacked) != 1 || !strings.Contains(nacked["service/default/e2"], "ipset KUBE-EXTERNAL-IP is full: maxelem 3, 5 distinct entries wanted") {
		t.Fatalf("errors = %v", nacked)
	}
	st := readState(t, mk)
	if d := cmp.Diff([]string{"198.18.100.1,tcp:80", "198.18.100.2,tcp:80", "198.18.100.5,tcp:80"}, st.Sets["KUBE-EXTERNAL-IP"]); d != "" {
		t.Errorf("KUBE-EXTERNAL-IP (-want +got):\n%s", d)
	}
	// The refused Service's virtual servers are still programmed; other
	// sets are unaffected.
	if len(st.Services) != 6 || len(st.Sets["KUBE-CLUSTER-IP"]) != 1 {
		t.Errorf("state = %+v", st)
	}
	// A full reconcile keeps the same decision (no flapping, no writes).
	mk.ResetCalls()
	r.Reconcile(context.Background())
	if w := writes(mk); len(w) != 0 {
		t.Errorf("full reconcile wrote %v", w)
	}
	if _, ok := r.Failed()["service/default/e2"]; !ok {
		t.Errorf("e2 no longer failed: %v", r.Failed())
	}

	// Room appears: e2 is admitted and ACKed in the same Apply.
	ack = apply(t, r, &vsplanev1.Delta{Nonce: "rm", Removed: []string{"service/default/e1"}})
	mustAck(t, ack)
	if d := cmp.Diff([]string{"198.18.100.3,tcp:80", "198.18.100.4,tcp:80", "198.18.100.5,tcp:80"}, readState(t, mk).Sets["KUBE-EXTERNAL-IP"]); d != "" {
		t.Errorf("KUBE-EXTERNAL-IP after e1 left (-want +got):\n%s", d)
	}
	if len(r.Failed()) != 0 {
		t.Errorf("failed: %v", r.Failed())
	}

	// A Service sorting first takes the room: the last one in name order
	// no longer fits; a restarted agent decides the same.
	first := extRes("e0", "198.18.100.9")
	ack = apply(t, r, &vsplanev1.Delta{Nonce: "0", Resources: []*vsplanev1.Resource{first}})
	if n := nackedNames(ack); len(n) != 1 || n["service/default/e3"] == "" {
		t.Errorf("errors = %v", n)
	}
	want := []string{"198.18.100.3,tcp:80", "198.18.100.4,tcp:80", "198.18.100.9,tcp:80"}
	if d := cmp.Diff(want, readState(t, mk).Sets["KUBE-EXTERNAL-IP"]); d != "" {
		t.Errorf("KUBE-EXTERNAL-IP (-want +got):\n%s", d)
	}
	mk.ResetCalls()
	r2 := newReconciler(t, mk, Config{maxElem: 3})
	ack = apply(t, r2, full(settingsRes(defaultNodeSettings()), first, b, c, svcA.resource()))
	if n := nackedNames(ack); len(n) != 1 || n["service/default/e3"] == "" {
		t.Errorf("restart errors = %v", n)
	}
	if w := writes(mk); len(w) != 0 {
		t.Errorf("restart wrote %v", w)
	}
}

// The kernel's own limit (a set created smaller by someone else, or full
// of foreign entries) is a per-resource kernel error, retried.
func TestSetFullInKernel(t *testing.T) {
	mk := memory.New()
	k := mk.Kernel()
	small := kernel.IPSet{Name: "KUBE-EXTERNAL-IP", Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
	if err := k.IPSets.CreateSet(small); err != nil {
		t.Fatal(err)
	}
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), extRes("e1", "198.18.100.1"))))
	mk.SetFault(func(op string) error {
		if op == "ipset.AddEntry" {
			return fmt.Errorf("add to ipset KUBE-EXTERNAL-IP: set is full (maxelem 65536)")
		}
		return nil
	})
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "b", Resources: []*vsplanev1.Resource{extRes("e2", "198.18.100.2")}})
	if n := nackedNames(ack); len(n) != 1 || !strings.Contains(n["service/default/e2"], "set is full") {
		t.Errorf("errors = %v", n)
	}
	if _, ok := r.Versions()["service/default/e1"]; !ok {
		t.Error("e1 lost its applied state")
	}
	mk.SetFault(nil)
	r.Reconcile(context.Background())
	if len(r.Failed()) != 0 {
		t.Errorf("retry did not recover: %v", r.Failed())
	}
}
