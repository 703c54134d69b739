package linux_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
)

// TestIPTablesFingerprint: on both backends and families, a fingerprint
// (of nat and filter together) holds while nothing changes (traffic through a rule included) and
// changes when a chain is added, when its rules change, when it is flushed.
func TestIPTablesFingerprint(t *testing.T) {
	requireNetns(t)
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, b := range []kernel.Backend{kernel.BackendNFT, kernel.BackendLegacy} {
		for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
			t.Run(string(b)+"/"+fam.String(), func(t *testing.T) {
				ipt := newIPTables(t, b)
				var fp kernel.IPTablesFingerprinter = ipt
				print := func(what string) uint64 {
					t.Helper()
					// Two tables, the changes in the second: one
					// value for both must still see them.
					v, err := fp.Fingerprint(fam, kernel.TableNAT, kernel.TableFilter)
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					return v
				}
				restore := func(lines ...string) {
					t.Helper()
					if err := ipt.Restore(ctx, fam, []byte(strings.Join(lines, "\n")+"\n")); err != nil {
						t.Fatal(err)
					}
				}
				chain := "VSPT-FP"
				t.Cleanup(func() {
					_ = ipt.Restore(ctx, fam, []byte("*filter\n-D OUTPUT -o lo -p udp -j "+chain+"\n:"+chain+" - [0:0]\n-X "+chain+"\nCOMMIT\n"))
				})
				before := print("before")
				if again := print("again"); again != before {
					t.Fatalf("fingerprint changed with nothing changing: %x, %x", before, again)
				}
				restore("*filter", ":"+chain+" - [0:0]", "-A "+chain+" -j RETURN", "-A OUTPUT -o lo -p udp -j "+chain, "COMMIT")
				added := print("chain added")
				if added == before {
					t.Errorf("a chain and a jump added: fingerprint unchanged (%x)", added)
				}
				// Traffic through the rules changes their counters only.
				local := "127.0.0.1:0"
				if fam == kernel.FamilyIPv6 {
					local = "[::1]:0"
				}
				sink, err := net.ListenPacket("udp", local)
				if err != nil {
					t.Fatal(err)
				}
				for range 3 {
					if _, err := sink.WriteTo([]byte("x"), sink.LocalAddr()); err != nil {
						t.Fatal(err)
					}
				}
				sink.Close()
				if dump, err := ipt.Save(ctx, fam, kernel.TableFilter); err != nil || !strings.Contains(string(dump), chain) {
					t.Fatalf("save: %v", err)
				}
				if got := print("after traffic"); got != added {
					t.Errorf("traffic changed the fingerprint: %x -> %x", added, got)
				}
				restore("*filter", ":"+chain+" - [0:0]", "-A "+chain+" -j ACCEPT", "COMMIT")
				changed := print("rule changed")
				if changed == added {
					t.Errorf("RETURN replaced by ACCEPT: fingerprint unchanged (%x)", changed)
				}
				restore("*filter", ":"+chain+" - [0:0]", "COMMIT") // flush
				if flushed := print("flushed"); flushed == changed || flushed == added {
					t.Errorf("chain flushed: fingerprint %x, was %x then %x", flushed, added, changed)
				}
			})
		}
	}
	if _, err := newIPTables(t, kernel.BackendLegacy).Fingerprint(kernel.FamilyIPv4, ""); err == nil {
		t.Error("a fingerprint of an empty table name: no error")
	}
	if _, err := newIPTables(t, kernel.BackendNFT).Fingerprint(kernel.FamilyIPv4); err == nil {
		t.Error("a fingerprint of no table: no error")
	}
	var _ kernel.IPTablesFingerprinter = (*linux.IPTables)(nil)
}
