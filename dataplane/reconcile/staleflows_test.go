package reconcile

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// udpFlow is a conntrack entry of a client of orig whose replies come from
// replySrc (the endpoint IPVS chose, or orig itself when nothing answered).
func udpFlow(client, orig, replySrc string) kernel.ConntrackEntry {
	c, o, r := netip.MustParseAddrPort(client), netip.MustParseAddrPort(orig), netip.MustParseAddrPort(replySrc)
	return kernel.ConntrackEntry{Protocol: kernel.ProtocolUDP,
		Orig: kernel.ConntrackTuple{Src: c, Dst: o}, Reply: kernel.ConntrackTuple{Src: r, Dst: c}}
}

// After a write to a UDP virtual server, its entries whose reply source is
// none of its real servers go (those made while nothing served it, those of
// a replaced endpoint); healthy flows, other servers' and TCP entries stay.
// Nothing is swept when no UDP server was written; the first Delta
// (entries left by whatever ran before) and the periodic full reconcile
// sweep every UDP server.
func TestStaleUDPFlowsDeleted(t *testing.T) {
	ctx := context.Background()
	dns := svcSpec{name: "dns", vip: "198.18.0.20", port: 53, proto: vsplanev1.Protocol_PROTOCOL_UDP,
		backends: []backend{be("198.19.1.5", 5353)}}
	other := svcSpec{name: "other", vip: "198.18.0.21", port: 53, proto: vsplanev1.Protocol_PROTOCOL_UDP,
		backends: []backend{be("198.19.1.6", 5353)}}
	healthy := udpFlow("198.19.3.1:40000", "198.18.0.20:53", "198.19.1.5:5353")
	unanswered := udpFlow("198.19.3.2:40000", "198.18.0.20:53", "198.18.0.20:53")
	leftover := udpFlow("198.19.3.3:40000", "198.18.0.21:53", "198.18.0.21:53") // other's: first Delta only
	otherPort := udpFlow("198.19.3.4:40000", "198.18.0.20:54", "198.18.0.20:54")
	tcpFlow := udpFlow("198.19.3.5:40000", "198.18.0.20:53", "198.18.0.20:53")
	tcpFlow.Protocol = kernel.ProtocolTCP

	mk := memory.New()
	for _, e := range []kernel.ConntrackEntry{healthy, unanswered, leftover, otherPort, tcpFlow} {
		if err := mk.AddConntrackEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), dns.resource(), other.resource(), tcp("web", "198.18.0.22", 80).resource())))
	if diff := cmp.Diff([]kernel.ConntrackEntry{tcpFlow, healthy, otherPort}, mk.ConntrackEntries(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Fatalf("first Delta (-want +got):\n%s", diff)
	}
	if got := r.Stats().StaleFlowsDeleted; got != 2 {
		t.Errorf("StaleFlowsDeleted %d, want 2", got)
	}

	// A Delta writing no UDP server does not dump the table.
	for _, e := range []kernel.ConntrackEntry{unanswered, leftover} {
		if err := mk.AddConntrackEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	mk.SetFault(func(op string) error {
		if op == "conntrack.DeleteEntries" {
			t.Errorf("conntrack dumped for a TCP change")
		}
		return nil
	})
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "tcp", Resources: []*vsplanev1.Resource{tcp("web", "198.18.0.22", 80, be("198.19.1.7", 80)).resource()}}))
	mk.SetFault(nil)

	// The endpoint replaced: the healthy flow's endpoint is gone, so is its
	// entry, and the unanswered one's; other's server was not written, its
	// entry stays.
	dns.backends = []backend{be("198.19.1.9", 5353)}
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "replace", Resources: []*vsplanev1.Resource{dns.resource()}}))
	if diff := cmp.Diff([]kernel.ConntrackEntry{tcpFlow, leftover, otherPort}, mk.ConntrackEntries(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Fatalf("after the endpoint change (-want +got):\n%s", diff)
	}

	// A failed sweep is counted and logged, never a NACK.
	if err := mk.AddConntrackEntry(unanswered); err != nil {
		t.Fatal(err)
	}
	mk.SetFault(func(op string) error {
		if op == "conntrack.DeleteEntries" {
			return errors.New("ctnetlink: boom")
		}
		return nil
	})
	dns.backends = []backend{be("198.19.1.10", 5353)}
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "fail", Resources: []*vsplanev1.Resource{dns.resource()}}))
	mk.SetFault(nil)
	if got := r.Stats().StaleFlowSweepErrors; got != 1 {
		t.Errorf("StaleFlowSweepErrors %d, want 1", got)
	}

	// The periodic full reconcile sweeps every UDP server (other's stale
	// entry goes now), drift repaired or not.
	if err := deleteVS(mk.Kernel(), kernel.VirtualServerKey{Family: kernel.FamilyIPv4,
		Address: netip.MustParseAddr("198.18.0.20"), Protocol: kernel.ProtocolUDP, Port: 53}); err != nil {
		t.Fatal(err)
	}
	r.Reconcile(ctx)
	if diff := cmp.Diff([]kernel.ConntrackEntry{tcpFlow, otherPort}, mk.ConntrackEntries(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Fatalf("after a full reconcile (-want +got):\n%s", diff)
	}
}

// SCTP virtual servers are swept like UDP ones (kube-proxy sweeps UDP
// only): by their own protocol, address and port.
func TestStaleSCTPFlowsDeleted(t *testing.T) {
	assoc := svcSpec{name: "assoc", vip: "198.18.0.30", port: 9999, proto: vsplanev1.Protocol_PROTOCOL_SCTP,
		backends: []backend{be("198.19.1.5", 9999)}}
	sctpFlow := func(client, orig, replySrc string) kernel.ConntrackEntry {
		e := udpFlow(client, orig, replySrc)
		e.Protocol = kernel.ProtocolSCTP
		return e
	}
	healthy := sctpFlow("198.19.3.1:40000", "198.18.0.30:9999", "198.19.1.5:9999")
	unanswered := sctpFlow("198.19.3.2:40000", "198.18.0.30:9999", "198.18.0.30:9999")
	otherPort := sctpFlow("198.19.3.3:40000", "198.18.0.30:9998", "198.18.0.30:9998")
	udpSame := udpFlow("198.19.3.4:40000", "198.18.0.30:9999", "198.18.0.30:9999") // no UDP server there

	mk := memory.New()
	for _, e := range []kernel.ConntrackEntry{healthy, unanswered, otherPort, udpSame} {
		if err := mk.AddConntrackEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), assoc.resource())))
	if diff := cmp.Diff([]kernel.ConntrackEntry{udpSame, healthy, otherPort}, mk.ConntrackEntries(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Fatalf("first Delta (-want +got):\n%s", diff)
	}

	assoc.backends = []backend{be("198.19.1.9", 9999)}
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "replace", Resources: []*vsplanev1.Resource{assoc.resource()}}))
	if diff := cmp.Diff([]kernel.ConntrackEntry{udpSame, otherPort}, mk.ConntrackEntries(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Fatalf("after the endpoint change (-want +got):\n%s", diff)
	}
	if got := r.Stats().StaleFlowsDeleted; got != 2 {
		t.Errorf("StaleFlowsDeleted %d, want 2", got)
	}
}
