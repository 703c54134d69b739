package linux

import (
	"bufio"
	"fmt"
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

// parseProc parses s as the file would be read.
func parseProc(s string) (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	out, _, err := parseProcIPVS(bufio.NewReaderSize(strings.NewReader(s), procLineMax), 0)
	return out, err
}

func TestParseProcIPVS(t *testing.T) {
	got, err := parseProc(procSample)
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
	got, err := parseProc(header)
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
		if got, err := parseProc(body); err == nil {
			t.Errorf("%s: parsed %v, want an error", name, got)
		}
	}
	// Unknown protocols are skipped with their destinations, not errors.
	got, err := parseProc((header + "IP_41  C612800A:0050 rr\n  -> C6130103:1F90 Masq 1 0 0\n"))
	if err != nil || len(got) != 0 {
		t.Errorf("unknown protocol: got %v, %v; want it skipped", got, err)
	}
}

// TestParseProcIPVSStreams: the file is parsed as it is read, into one
// array: a last line without a newline counts, a line longer than the
// reader's buffer fails the dump, each server's list is capped so an
// append to it cannot overwrite the next server's, and parsing a large
// table allocates a fixed number of times, not per line or destination.
func TestParseProcIPVSStreams(t *testing.T) {
	header, _, _ := strings.Cut(procSample, "TCP ")
	got, err := parseProc(header + "TCP  C612800A:0050 rr\n  -> C6130103:1F90 Masq 1 0 0")
	if err != nil || len(got[kernel.AddrKey(netip.MustParseAddr("198.18.128.10"), kernel.ProtocolTCP, 80)]) != 1 {
		t.Errorf("last line without a newline: got %v, %v; want its destination", got, err)
	}
	if got, err := parseProc(header + "TCP  C612800A:0050 rr " + strings.Repeat("x", procLineMax) + "\n"); err == nil || !strings.Contains(err.Error(), "line too long") {
		t.Errorf("overlong line: got %v, %v; want a line-too-long error", got, err)
	}

	const servers, dests = 2000, 10
	var b strings.Builder
	b.WriteString(header)
	for i := range servers {
		fmt.Fprintf(&b, "TCP  C612%04X:0050 rr\n", i) // 198.18.x.y
		for j := range dests {
			fmt.Fprintf(&b, "  -> C613%04X:1F90      Masq    1      0          0         \n", i*dests+j) // 198.19.x.y
		}
	}
	text := b.String()
	parse := func(hint int) (map[kernel.VirtualServerKey][]kernel.Destination, int) {
		out, n, err := parseProcIPVS(bufio.NewReaderSize(strings.NewReader(text), procLineMax), hint)
		if err != nil {
			t.Fatal(err)
		}
		return out, n
	}
	out, n := parse(0)
	if len(out) != servers || n != servers*dests {
		t.Fatalf("parsed %d servers, %d destinations; want %d, %d", len(out), n, servers, servers*dests)
	}
	first := kernel.AddrKey(netip.MustParseAddr("198.18.0.0"), kernel.ProtocolTCP, 80)
	second := kernel.AddrKey(netip.MustParseAddr("198.18.0.1"), kernel.ProtocolTCP, 80)
	before := out[second][0]
	_ = append(out[first], kernel.Destination{Port: 1})
	if out[second][0] != before || cap(out[first]) != dests {
		t.Errorf("a server's list is not capped (cap %d): an append overwrote the next server's first destination", cap(out[first]))
	}
	allocs := testing.AllocsPerRun(3, func() { parse(n) })
	// The reader, the array, the servers' growing slice (~20 doublings)
	// and the map: a few dozen, where a slice per line was 22,000.
	if allocs > 60 {
		t.Errorf("parsing %d lines allocated %.0f times; want a fixed number (<= 60)", servers*(dests+1), allocs)
	}
}
