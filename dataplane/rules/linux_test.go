package rules_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
	"github.com/vsplane/vsplane/dataplane/rules"
)

// The real-iptables test changes the kernel, so the test binary re-executes
// itself in a fresh network namespace and that test only runs there. Not
// getting one fails the test (never a skip); the pure tests run either way.
const netnsEnv = "VSPLANE_RULES_TEST_IN_NETNS"

var netnsErr error

func TestMain(m *testing.M) {
	if os.Getenv(netnsEnv) == "1" {
		os.Exit(m.Run())
	}
	if os.Geteuid() != 0 {
		netnsErr = errors.New("needs root to create a private network namespace; run `go test` as root")
		os.Exit(m.Run())
	}
	self, err := os.Executable()
	if err == nil {
		cmd := exec.Command(self, os.Args[1:]...)
		cmd.Env = append(os.Environ(), netnsEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
		err = cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			os.Exit(0)
		case errors.As(err, &ee) && ee.Exited():
			os.Exit(ee.ExitCode())
		}
	}
	netnsErr = fmt.Errorf("re-exec in a new network namespace: %w", err)
	os.Exit(m.Run())
}

func saveTables(t *testing.T, ipt kernel.IPTables, fam kernel.Family) []kernel.TableDump {
	t.Helper()
	var out []kernel.TableDump
	for _, tb := range []kernel.Table{kernel.TableFilter, kernel.TableNAT} {
		b, err := ipt.Save(context.Background(), fam, tb)
		if err != nil {
			t.Fatal(err)
		}
		d, err := kernel.ParseSave(b)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d...)
	}
	return out
}

// TestRealIPTablesReadBack applies rendered payloads with the real
// iptables-restore (legacy and nft, IPv4 and IPv6) and checks that
// iptables-save prints exactly the rendered rules, so Check finds no drift
// after an apply and jumps are never duplicated.
func TestRealIPTablesReadBack(t *testing.T) {
	if netnsErr != nil {
		t.Fatalf("cannot run real-kernel test: %v", netnsErr)
	}
	ctx := context.Background()
	sets, err := linux.NewIPSets()
	if err != nil {
		t.Fatal(err)
	}
	cidr := map[kernel.Family]netip.Prefix{
		kernel.FamilyIPv4: netip.MustParsePrefix("198.19.0.0/16"),
		kernel.FamilyIPv6: netip.MustParsePrefix("2001:2:0:100::/56"),
	}
	for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
		for _, s := range rules.AllSets() {
			if err := sets.CreateSet(s.Spec(fam)); err != nil {
				t.Fatalf("create %s: %v", s.Name(fam), err)
			}
		}
	}
	for _, backend := range []kernel.Backend{kernel.BackendLegacy, kernel.BackendNFT} {
		ipt, err := linux.NewIPTables(ctx, linux.IPTablesOptions{Backend: backend})
		if err != nil {
			t.Fatalf("%s: %v", backend, err)
		}
		for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
			t.Run(fmt.Sprintf("%s/%v", backend, fam), func(t *testing.T) {
				inputs := []rules.Input{
					{Family: fam, MasqueradeBit: 14, ClusterCIDR: cidr[fam], RandomFully: ipt.Info().RandomFully,
						NonEmpty: rules.SetMask(0).With(rules.SetClusterIP).With(rules.SetLoopBack)},
					{Family: fam, MasqueradeBit: 14, MasqueradeAll: true, NonEmpty: rules.SetMask(0).With(rules.SetClusterIP)},
					{Family: fam, MasqueradeBit: 3, ConntrackTCPLiberal: true},
				}
				for i, in := range inputs {
					rs, err := rules.Render(in)
					if err != nil {
						t.Fatal(err)
					}
					missing, _ := rs.Check(saveTables(t, ipt, fam))
					if err := ipt.Restore(ctx, fam, rs.Payload(missing)); err != nil {
						t.Fatalf("input %d: restore: %v\n%s", i, err, rs.Payload(missing))
					}
					saved := saveTables(t, ipt, fam)
					if missing, differ := rs.Check(saved); len(missing) > 0 || differ {
						t.Fatalf("input %d: read-back differs from rendering (missing jumps %v, chains differ %v)\nrendered:\n%s\nsaved:\n%+v",
							i, missing, differ, rs.Payload(nil), saved)
					}
					for _, j := range rs.Jumps {
						for _, d := range saved {
							if d.Table != j.Table {
								continue
							}
							c, _ := d.Chain(j.From)
							if n := countOf(c.Rules, j.Rule); n != 1 {
								t.Errorf("input %d: %s %s holds the jump %d times", i, j.Table, j.From, n)
							}
						}
					}
				}
			})
		}
	}
}

func countOf(list []string, s string) int {
	n := 0
	for i := range list {
		if list[i] == s {
			n++
		}
	}
	return n
}
