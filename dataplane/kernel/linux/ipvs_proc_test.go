package linux

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// procSample is /proc/net/ip_vs as Linux 6.1 wrote it in the VM test bed
// (addresses changed), with every kind of line the parser meets.
const procSample = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  C612800A:0050 rr 
  -> C6130103:1F90      Masq    1      2          3         
  -> C6130102:1F90      Route   0      0          0         
UDP  C612800B:0035 wrr ops persistent 10800 FFFFFFFF
  -> C6130104:14E9      Tunnel  3      0          17        
SCTP  C612800C:0001 sh 
TCP  [2001:0002:0000:00ff:0000:0000:0000:0001]:01BB rr persistent 60 0000FFFF
  -> [2001:0002:0000:00ff:0000:0000:0000:0002]:20FB      Masq    1      0          0         
  -> C6130105:20FB      Local   2      0          0         
FWM  7D000001 rr 
  -> C6130106:0000      Masq    1      0          0         
`

func TestParseProcIPVS(t *testing.T) {
	got, err := parseProcIPVS([]byte(procSample))
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	want := map[kernel.VirtualServerKey][]kernel.Destination{
		kernel.AddrKey(a("198.18.128.10"), kernel.ProtocolTCP, 80): {
			// sorted by address: .2 before .3
			{Address: a("198.19.1.2"), Port: 8080, Weight: 0, Forward: kernel.ForwardDirectRoute},
			{Address: a("198.19.1.3"), Port: 8080, Weight: 1, ActiveConn: 2, InactiveConn: 3},
		},
		kernel.AddrKey(a("198.18.128.11"), kernel.ProtocolUDP, 53): {
			{Address: a("198.19.1.4"), Port: 5353, Weight: 3, Forward: kernel.ForwardTunnel, InactiveConn: 17},
		},
		kernel.AddrKey(a("198.18.128.12"), kernel.ProtocolSCTP, 1): {},
		kernel.AddrKey(a("2001:2:0:ff::1"), kernel.ProtocolTCP, 443): {
			{Address: a("198.19.1.5"), Port: 8443, Weight: 2, Forward: kernel.ForwardLocal},
			{Address: a("2001:2:0:ff::2"), Port: 8443, Weight: 1},
		},
		// The FWM server and its destination are left out.
	}
	if d := cmp.Diff(want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
		t.Errorf("parse (-want +got):\n%s", d)
	}
}

func TestParseProcIPVSEmptyTable(t *testing.T) {
	header, _, _ := strings.Cut(procSample, "TCP ")
	got, err := parseProcIPVS([]byte(header))
	if err != nil || len(got) != 0 {
		t.Errorf("header only: got %v, %v; want an empty map", got, err)
	}
}

// TestParseProcIPVSRejects: a line it cannot read fails the whole dump (the
// caller then reads per server) rather than a guess entering the compare.
func TestParseProcIPVSRejects(t *testing.T) {
	header, _, _ := strings.Cut(procSample, "TCP ")
	for name, body := range map[string]string{
		"not the table":        "Prot LocalAddress:Port Scheduler Flags\n",
		"short server line":    header + "TCP  C612800A:0050\n",
		"bad server address":   header + "TCP  C612800:0050 rr\n",
		"bad port":             header + "TCP  C612800A:50 rr\n",
		"bad IPv6":             header + "TCP  [2001:zz::1]:0050 rr\n",
		"IPv4 in brackets":     header + "TCP  [198.18.0.1]:0050 rr\n",
		"short destination":    header + "TCP  C612800A:0050 rr\n  -> C6130103:1F90 Masq 1 0\n",
		"unknown forward":      header + "TCP  C612800A:0050 rr\n  -> C6130103:1F90 Bypass 1 0 0\n",
		"weight not a number":  header + "TCP  C612800A:0050 rr\n  -> C6130103:1F90 Masq x 0 0\n",
		"count out of range":   header + "TCP  C612800A:0050 rr\n  -> C6130103:1F90 Masq 1 99999999999 0\n",
		"bad destination addr": header + "TCP  C612800A:0050 rr\n  -> C61301:1F90 Masq 1 0 0\n",
	} {
		if got, err := parseProcIPVS([]byte(body)); err == nil {
			t.Errorf("%s: parsed %v, want an error", name, got)
		}
	}
	// Unknown protocols are skipped with their destinations, not errors.
	got, err := parseProcIPVS([]byte(header + "IP_41  C612800A:0050 rr\n  -> C6130103:1F90 Masq 1 0 0\n"))
	if err != nil || len(got) != 0 {
		t.Errorf("unknown protocol: got %v, %v; want it skipped", got, err)
	}
}
