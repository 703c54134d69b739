package linux_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/contract"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
)

// These run on any host with ipset and iptables (both backends installed),
// in the private network namespace TestMain provides.

// The contract suite cleans up and checks destroy/flush through these
// test-only methods, outside kernel.IPSets and kernel.Links.
var (
	_ contract.SetCleaner   = (*linux.IPSets)(nil)
	_ contract.DummyDeleter = (*linux.Links)(nil)
)

func newIPSets(t *testing.T) *linux.IPSets {
	t.Helper()
	requireNetns(t)
	s, err := linux.NewIPSets()
	if err != nil {
		t.Fatalf("ipset netlink unavailable: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestIPSetsContract(t *testing.T) {
	s := newIPSets(t)
	contract.RunIPSets(t, func(*testing.T) kernel.IPSets { return s })
	left, err := s.ListSets()
	if err != nil {
		t.Fatalf("list sets after the suite: %v", err)
	}
	for _, set := range left {
		if strings.HasPrefix(set.Name, "VSPT-") {
			t.Errorf("suite left set %s behind", set.Name)
		}
	}
}

func newIPTables(t *testing.T, b kernel.Backend) *linux.IPTables {
	t.Helper()
	requireNetns(t)
	ipt, err := linux.NewIPTables(context.Background(), linux.IPTablesOptions{Backend: b})
	if err != nil {
		t.Fatalf("iptables (%q backend) unavailable: %v", b, err)
	}
	return ipt
}

func TestIPTablesContract(t *testing.T) {
	for _, b := range []kernel.Backend{kernel.BackendNFT, kernel.BackendLegacy} {
		t.Run(string(b), func(t *testing.T) {
			ipt := newIPTables(t, b)
			if got := ipt.Info().Backend; got != b {
				t.Fatalf("asked for %s, got %s", b, got)
			}
			contract.RunIPTables(t, func(*testing.T) kernel.IPTables { return ipt })
		})
	}
}

func TestIPTablesDetectsBackend(t *testing.T) {
	ipt := newIPTables(t, "")
	info := ipt.Info()
	if info.Backend != kernel.BackendNFT && info.Backend != kernel.BackendLegacy {
		t.Fatalf("backend %q", info.Backend)
	}
	if !info.RandomFully {
		t.Errorf("iptables %s: want --random-fully support (>= 1.6.2)", info.Version)
	}

	// The backend already holding rules wins over the default.
	other := kernel.BackendLegacy
	if info.Backend == kernel.BackendLegacy {
		other = kernel.BackendNFT
	}
	ctx := context.Background()
	alt := newIPTables(t, other)
	chain := "VSPT-DETECT"
	if err := alt.Restore(ctx, kernel.FamilyIPv4, []byte("*filter\n:"+chain+" - [0:0]\n-A "+chain+" -j RETURN\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = alt.Restore(ctx, kernel.FamilyIPv4, []byte("*filter\n:"+chain+" - [0:0]\n-X "+chain+"\nCOMMIT\n"))
	})
	if got := newIPTables(t, "").Info().Backend; got != other {
		t.Errorf("with rules only in %s, detection picked %s", other, got)
	}
}

func TestIPSetsWithIPTablesContract(t *testing.T) {
	s := newIPSets(t)
	for _, b := range []kernel.Backend{kernel.BackendNFT, kernel.BackendLegacy} {
		t.Run(string(b), func(t *testing.T) {
			ipt := newIPTables(t, b)
			contract.RunIPSetsWithIPTables(t, func(*testing.T) kernel.Kernel {
				return kernel.Kernel{IPSets: s, IPTables: ipt}
			})
		})
	}
}

func TestSysctlContractProcSys(t *testing.T) {
	requireNetns(t)
	contract.RunSysctl(t, func(*testing.T) kernel.Sysctl { return linux.NewSysctl("") })
}

func TestSysctlContractFakeRoot(t *testing.T) {
	root := t.TempDir()
	files := append(slices.Clone(contract.SysctlNames), "kernel/osrelease", linux.DefaultConntrackHashsize[1:])
	for _, name := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		val := "0\n"
		switch name {
		case "kernel/osrelease":
			val = "5.4.0-42-generic\n"
		case linux.DefaultConntrackHashsize[1:]:
			val = "16384\n"
		}
		if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	contract.RunSysctl(t, func(*testing.T) kernel.Sysctl { return linux.NewSysctl(root) })
	s := linux.NewSysctl(root)
	v, err := s.KernelVersion()
	if err != nil || v.AtLeast(5, 9) || v.Major != 5 || v.Minor != 4 {
		t.Errorf("kernel version from fake root: %+v, %v; want 5.4", v, err)
	}
	if err := s.SetConntrackHashsize(65536); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ConntrackHashsize(); got != 65536 || err != nil {
		t.Errorf("hashsize after setting 65536: %d, %v", got, err)
	}
}

// TestIPSetsApplyEntriesBatches: ApplyEntries sends up to 512 requests per
// sendmsg, fewer when they are large, and a failed exchange reports every
// op of its batch as failed with an unknown outcome (bad input still as
// ErrInvalid).
func TestIPSetsApplyEntriesBatches(t *testing.T) {
	s := newIPSets(t)
	set := kernel.IPSet{Name: "VSPT-BATCHES", Type: kernel.HashIP, Family: kernel.FamilyIPv4, Comments: true}
	if err := s.CreateSet(set); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.DestroySet(set.Name) })
	ops := func(n int, comment string) []kernel.EntryOp {
		out := make([]kernel.EntryOp, n)
		for i := range out {
			out[i] = kernel.EntryOp{Kind: kernel.AddEntry, Set: set,
				Entry: kernel.Entry{IP: netip.AddrFrom4([4]byte{198, 18, 200 + byte(i>>8), byte(i)}), Comment: comment}}
		}
		return out
	}
	for _, c := range []struct {
		n       int
		comment string
		sends   int
	}{
		{1, "", 1},
		{512, "", 1},
		{1300, "", 3},                       // by count: 512 + 512 + 276
		{1000, strings.Repeat("c", 250), 4}, // by bytes: ~350 bytes each, 96 KiB a batch
	} {
		before := s.BatchSends()
		for i, err := range s.ApplyEntries(ops(c.n, c.comment)) {
			if err != nil {
				t.Fatalf("%d ops: op %d: %v", c.n, i, err)
			}
		}
		if got := s.BatchSends() - before; got != c.sends {
			t.Errorf("%d ops of comment length %d: %d sendmsg calls, want %d", c.n, len(c.comment), got, c.sends)
		}
	}
	if got, err := s.ListEntries(set.Name); err != nil || len(got) != 1300 {
		t.Fatalf("entries: %d, %v; want 1300", len(got), err)
	}

	s.BreakBatch()
	batch := append(ops(3, ""), kernel.EntryOp{Kind: kernel.AddEntry, Set: set, Entry: kernel.Entry{Port: 80}})
	errs := s.ApplyEntries(batch)
	for i, err := range errs[:3] {
		if err == nil || !strings.Contains(err.Error(), "outcome unknown") {
			t.Errorf("op %d after a failed exchange: got %v, want an outcome-unknown error", i, err)
		}
	}
	if !errors.Is(errs[3], kernel.ErrInvalid) {
		t.Errorf("invalid op with a failed exchange: got %v, want ErrInvalid", errs[3])
	}
	// Reads have their own socket.
	if _, err := s.ListEntries(set.Name); err != nil {
		t.Errorf("list after the batch socket broke: %v", err)
	}
}

func newConntrack(t *testing.T) *linux.Conntrack {
	t.Helper()
	requireNetns(t)
	c, err := linux.NewConntrack()
	if err != nil {
		t.Fatalf("conntrack netlink unavailable: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestConntrackContract needs nf_conntrack and nf_conntrack_netlink (this
// host has both; IPVS is not needed).
func TestConntrackContract(t *testing.T) {
	c := newConntrack(t)
	contract.RunConntrack(t, func(*testing.T) (kernel.Conntrack, contract.ConntrackSeeder) { return c, c })
}

// TestConntrackVanishedEntry: an entry that expires between the dump and
// its delete is neither an error nor counted, as the interface says.
func TestConntrackVanishedEntry(t *testing.T) {
	c := newConntrack(t)
	client := netip.MustParseAddrPort("198.18.127.1:40000")
	e := kernel.ConntrackEntry{Protocol: kernel.ProtocolUDP,
		Orig:  kernel.ConntrackTuple{Src: client, Dst: netip.MustParseAddrPort("198.18.127.2:53")},
		Reply: kernel.ConntrackTuple{Src: netip.MustParseAddrPort("198.18.127.3:5353"), Dst: client}}
	if err := c.CreateConntrackEntry(e, time.Second); err != nil {
		t.Fatal(err)
	}
	n, err := c.DeleteEntries(kernel.FamilyIPv4, kernel.ProtocolUDP, func(got kernel.ConntrackEntry) bool {
		if got != e {
			return false
		}
		time.Sleep(2 * time.Second) // the dump is done; the entry expires
		return true
	})
	if err != nil {
		t.Fatalf("delete of an entry that expired meanwhile: %v", err)
	}
	if n != 0 {
		t.Errorf("deleted %d, want 0: the entry had expired before its delete", n)
	}
	left, err := c.Entries(kernel.FamilyIPv4, kernel.ProtocolUDP)
	if err != nil || slices.Contains(left, e) {
		t.Errorf("entry still listed (%v): %+v", err, left)
	}
}
