package linux_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/contract"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
)

// These run on any host with ipset and iptables (both backends installed),
// in the private network namespace TestMain provides.

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
	files := append(slices.Clone(contract.SysctlNames), "kernel/osrelease")
	for _, name := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		val := "0\n"
		if name == "kernel/osrelease" {
			val = "5.4.0-42-generic\n"
		}
		if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	contract.RunSysctl(t, func(*testing.T) kernel.Sysctl { return linux.NewSysctl(root) })
	v, err := linux.NewSysctl(root).KernelVersion()
	if err != nil || v.AtLeast(5, 9) || v.Major != 5 || v.Minor != 4 {
		t.Errorf("kernel version from fake root: %+v, %v; want 5.4", v, err)
	}
}
