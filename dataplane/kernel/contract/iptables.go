package contract

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// RunIPTables checks an IPTables implementation for IPv4 and IPv6.
func RunIPTables(t *testing.T, newIPT func(t *testing.T) kernel.IPTables) {
	for _, fam := range []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6} {
		t.Run(fam.String(), func(t *testing.T) { runIPTablesFamily(t, fam, newIPT) })
	}
	t.Run("Info", func(t *testing.T) {
		info := newIPT(t).Info()
		if info.Backend != kernel.BackendLegacy && info.Backend != kernel.BackendNFT {
			t.Errorf("backend %q: want legacy or nft", info.Backend)
		}
		if info.Version == "" {
			t.Errorf("empty version")
		}
	})
	t.Run("InvalidInput", func(t *testing.T) {
		ipt := newIPT(t)
		ctx := context.Background()
		wantErr(t, ipt.Restore(ctx, kernel.FamilyUnspecified, []byte("*filter\nCOMMIT\n")), kernel.ErrInvalid, "restore without family")
		_, err := ipt.Save(ctx, kernel.FamilyIPv4, "nosuchtable")
		wantErr(t, err, kernel.ErrInvalid, "save unknown table")
		for _, p := range []string{"*filter\n:X - [0:0]\n", "-A INPUT -j ACCEPT\n", "*bogus\nCOMMIT\n"} {
			wantErr(t, ipt.Restore(ctx, kernel.FamilyIPv4, []byte(p)), kernel.ErrInvalid, fmt.Sprintf("restore %q", p))
		}
	})
}

type iptFixture struct {
	t   *testing.T
	ipt kernel.IPTables
	fam kernel.Family
	ctx context.Context
	// a and b are addresses of the family, in canonical save form.
	a, b string
}

func (f *iptFixture) restore(lines ...string) error {
	return f.ipt.Restore(f.ctx, f.fam, []byte(strings.Join(lines, "\n")+"\n"))
}

func (f *iptFixture) mustRestore(lines ...string) {
	f.t.Helper()
	must(f.t, f.restore(lines...), "restore")
}

// dump returns the parsed table.
func (f *iptFixture) dump(table kernel.Table) kernel.TableDump {
	f.t.Helper()
	out, err := f.ipt.Save(f.ctx, f.fam, table)
	must(f.t, err, "save "+string(table))
	tables, err := kernel.ParseSave(out)
	must(f.t, err, "parse save output")
	for _, td := range tables {
		if td.Table == table {
			return td
		}
	}
	return kernel.TableDump{Table: table}
}

// wantChain checks the rules of a chain; nil rules with exists=false
// means the chain must be absent.
func (f *iptFixture) wantChain(table kernel.Table, chain string, exists bool, rules ...string) {
	f.t.Helper()
	c, ok := f.dump(table).Chain(chain)
	if ok != exists {
		f.t.Fatalf("%s/%s: exists=%v, want %v", table, chain, ok, exists)
	}
	if !slices.Equal(c.Rules, rules) {
		f.t.Fatalf("%s/%s rules:\n got %q\nwant %q", table, chain, c.Rules, rules)
	}
}

// chains creates unique user chains and deletes them (and any jump from a
// built-in chain) when the test ends.
func (f *iptFixture) chains(table kernel.Table, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = uniqueName("VSPT-")
	}
	f.t.Cleanup(func() {
		d := f.dump(table)
		lines := []string{"*" + string(table)}
		for _, c := range kernel.BuiltinChains(table) {
			bc, _ := d.Chain(c)
			for _, r := range bc.Rules {
				for _, n := range names {
					if strings.HasSuffix(r, "-j "+n) {
						lines = append(lines, "-D "+c+" "+r)
					}
				}
			}
		}
		for _, n := range names {
			if _, ok := d.Chain(n); ok {
				lines = append(lines, ":"+n+" - [0:0]")
			}
		}
		for _, n := range names {
			if _, ok := d.Chain(n); ok {
				lines = append(lines, "-X "+n)
			}
		}
		lines = append(lines, "COMMIT")
		if err := f.restore(lines...); err != nil {
			f.t.Errorf("cleanup of chains %v: %v", names, err)
		}
	})
	return names
}

func runIPTablesFamily(t *testing.T, fam kernel.Family, newIPT func(t *testing.T) kernel.IPTables) {
	fixture := func(t *testing.T) *iptFixture {
		f := &iptFixture{t: t, ipt: newIPT(t), fam: fam, ctx: context.Background()}
		if fam == kernel.FamilyIPv4 {
			f.a, f.b = testAddr4().String()+"/32", testAddr4().String()+"/32"
		} else {
			f.a, f.b = testAddr6().String()+"/128", testAddr6().String()+"/128"
		}
		return f
	}

	t.Run("CreateChainsAndRules", func(t *testing.T) {
		f := fixture(t)
		c := f.chains(kernel.TableNAT, 2)
		svc := fmt.Sprintf("-d %s -p tcp -m comment --comment \"ns/svc:http cluster IP\" -m tcp --dport 80 -j %s", f.a, c[1])
		f.mustRestore("*nat",
			":"+c[0]+" - [0:0]",
			":"+c[1]+" - [0:0]",
			"-A "+c[0]+" "+svc,
			"-A "+c[0]+" -s "+f.b+" -j RETURN",
			"-A "+c[1]+" -j MASQUERADE",
			"COMMIT")
		f.wantChain(kernel.TableNAT, c[0], true, svc, "-s "+f.b+" -j RETURN")
		f.wantChain(kernel.TableNAT, c[1], true, "-j MASQUERADE")
		d := f.dump(kernel.TableNAT)
		for _, b := range kernel.BuiltinChains(kernel.TableNAT) {
			if bc, ok := d.Chain(b); !ok || bc.Policy == "-" {
				t.Errorf("built-in chain %s missing or without policy in %+v", b, d)
			}
		}
	})

	t.Run("NoflushKeepsUnnamedChains", func(t *testing.T) {
		f := fixture(t)
		c := f.chains(kernel.TableFilter, 2)
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", ":"+c[1]+" - [0:0]",
			"-A "+c[0]+" -s "+f.a+" -j ACCEPT", "-A "+c[1]+" -s "+f.b+" -j ACCEPT", "COMMIT")
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", "-A "+c[0]+" -s "+f.b+" -j RETURN", "COMMIT")
		f.wantChain(kernel.TableFilter, c[0], true, "-s "+f.b+" -j RETURN")
		f.wantChain(kernel.TableFilter, c[1], true, "-s "+f.b+" -j ACCEPT")
		// A table not in the payload is untouched too.
		n := f.chains(kernel.TableNAT, 1)
		f.mustRestore("*nat", ":"+n[0]+" - [0:0]", "-A "+n[0]+" -j RETURN", "COMMIT")
		f.mustRestore("*filter", ":"+c[1]+" - [0:0]", "COMMIT")
		f.wantChain(kernel.TableNAT, n[0], true, "-j RETURN")
		f.wantChain(kernel.TableFilter, c[1], true)
	})

	t.Run("BuiltinChainDeclarationDoesNotFlush", func(t *testing.T) {
		f := fixture(t)
		c := f.chains(kernel.TableFilter, 1)
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", "-A INPUT -j "+c[0], "COMMIT")
		f.mustRestore("*filter", ":INPUT ACCEPT [0:0]", ":"+c[0]+" - [0:0]", "COMMIT")
		in, _ := f.dump(kernel.TableFilter).Chain("INPUT")
		if !slices.Contains(in.Rules, "-j "+c[0]) || in.Policy != "ACCEPT" {
			t.Fatalf("INPUT after re-declaring it: %+v; want the jump kept and policy ACCEPT", in)
		}
	})

	t.Run("DeleteChain", func(t *testing.T) {
		f := fixture(t)
		c := f.chains(kernel.TableFilter, 3)
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", ":"+c[1]+" - [0:0]", ":"+c[2]+" - [0:0]",
			"-A "+c[0]+" -j "+c[1], "-A "+c[2]+" -j ACCEPT", "COMMIT")
		// Referenced, and non-empty: both refused, nothing changes.
		if err := f.restore("*filter", "-X "+c[1], "COMMIT"); err == nil {
			t.Errorf("-X of a referenced chain succeeded")
		}
		if err := f.restore("*filter", "-X "+c[2], "COMMIT"); err == nil {
			t.Errorf("-X of a non-empty chain succeeded")
		}
		if err := f.restore("*filter", "-X "+uniqueName("VSPT-NONE-"), "COMMIT"); err == nil {
			t.Errorf("-X of a missing chain succeeded")
		}
		f.wantChain(kernel.TableFilter, c[1], true)
		f.wantChain(kernel.TableFilter, c[2], true, "-j ACCEPT")
		// kube-proxy's way: declare (flush) then delete, in one payload.
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", ":"+c[1]+" - [0:0]", ":"+c[2]+" - [0:0]",
			"-X "+c[0], "-X "+c[1], "-X "+c[2], "COMMIT")
		for _, n := range c {
			f.wantChain(kernel.TableFilter, n, false)
		}
	})

	t.Run("FailedTableIsUnchanged", func(t *testing.T) {
		f := fixture(t)
		c := f.chains(kernel.TableFilter, 2)
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", "-A "+c[0]+" -s "+f.a+" -j ACCEPT", "COMMIT")
		err := f.restore("*filter", ":"+c[0]+" - [0:0]", ":"+c[1]+" - [0:0]", "-A "+c[0]+" -j RETURN",
			"-A "+c[1]+" -j "+uniqueName("VSPT-MISSING-"), "COMMIT")
		if err == nil {
			t.Fatalf("restore with a jump to a missing chain succeeded")
		}
		f.wantChain(kernel.TableFilter, c[0], true, "-s "+f.a+" -j ACCEPT")
		f.wantChain(kernel.TableFilter, c[1], false)
		if err := f.restore("*filter", "-D "+c[0]+" -j DROP", "COMMIT"); err == nil {
			t.Errorf("-D of a missing rule succeeded")
		}
		if err := f.restore("*filter", "-N "+c[0], "COMMIT"); err == nil {
			t.Errorf("-N of an existing chain succeeded")
		}
		if err := f.restore("*nat", ":"+c[1]+" - [0:0]", "-A "+c[1]+" -j DROP", "COMMIT"); err == nil {
			t.Errorf("DROP in the nat table succeeded")
		}
	})

	t.Run("InsertDeleteFlush", func(t *testing.T) {
		f := fixture(t)
		c := f.chains(kernel.TableFilter, 2)
		f.mustRestore("*filter", "-N "+c[0], "-N "+c[1],
			"-A "+c[0]+" -s "+f.a+" -j ACCEPT",
			"-I "+c[0]+" -j RETURN",
			"-I "+c[0]+" 2 -s "+f.b+" -j DROP",
			"-A "+c[0]+" -j "+c[1],
			"-A "+c[1]+" -j ACCEPT",
			"COMMIT")
		f.wantChain(kernel.TableFilter, c[0], true, "-j RETURN", "-s "+f.b+" -j DROP", "-s "+f.a+" -j ACCEPT", "-j "+c[1])
		f.mustRestore("*filter", "-D "+c[0]+" -j RETURN", "-D "+c[0]+" 2", "COMMIT")
		f.wantChain(kernel.TableFilter, c[0], true, "-s "+f.b+" -j DROP", "-j "+c[1])
		if err := f.restore("*filter", "-I "+c[0]+" 9 -j ACCEPT", "COMMIT"); err == nil {
			t.Errorf("-I beyond the end succeeded")
		}
		f.mustRestore("*filter", "-F "+c[0], "COMMIT")
		f.wantChain(kernel.TableFilter, c[0], true)
		f.wantChain(kernel.TableFilter, c[1], true, "-j ACCEPT")
	})

	t.Run("KubeProxyStyleRules", func(t *testing.T) {
		f := fixture(t)
		c := f.chains(kernel.TableNAT, 2)
		masq := "-j MASQUERADE"
		if f.ipt.Info().RandomFully {
			masq = "-j MASQUERADE --random-fully"
		}
		rules := []string{
			"-m comment --comment \"kubernetes service traffic requiring SNAT\" -j MARK --set-xmark 0x4000/0x4000",
			"-m mark ! --mark 0x4000/0x4000 -j RETURN",
			"-p udp -m udp --dport 53 -j RETURN",
			"! -s " + f.a + " -m addrtype --dst-type LOCAL -j " + c[1],
		}
		f.mustRestore(append(append([]string{"*nat", ":" + c[0] + " - [0:0]", ":" + c[1] + " - [0:0]"},
			prefixAll("-A "+c[0]+" ", rules)...), "-A "+c[1]+" "+masq, "COMMIT")...)
		f.wantChain(kernel.TableNAT, c[0], true, rules...)
		f.wantChain(kernel.TableNAT, c[1], true, masq)
	})
}

func prefixAll(p string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = p + s
	}
	return out
}

// RunIPSetsWithIPTables checks the rules that span ipsets and iptables.
func RunIPSetsWithIPTables(t *testing.T, newKernel func(t *testing.T) kernel.Kernel) {
	t.Run("MatchSetNeedsSetAndPinsIt", func(t *testing.T) {
		k := newKernel(t)
		f := &iptFixture{t: t, ipt: k.IPTables, fam: kernel.FamilyIPv4, ctx: context.Background()}
		c := f.chains(kernel.TableFilter, 1)
		set := kernel.IPSet{Name: uniqueName("VSPT-REF-"), Type: kernel.HashIPPort, Family: kernel.FamilyIPv4}
		rule := "-m set --match-set " + set.Name + " dst,dst -j ACCEPT"
		if err := f.restore("*filter", ":"+c[0]+" - [0:0]", "-A "+c[0]+" "+rule, "COMMIT"); err == nil {
			t.Fatalf("rule matching a missing set was accepted")
		}
		createSet(t, k.IPSets, set)
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", "-A "+c[0]+" "+rule, "COMMIT")
		f.wantChain(kernel.TableFilter, c[0], true, rule)
		wantErr(t, destroySet(k.IPSets, set.Name), kernel.ErrBusy, "destroy set used by a rule")
		f.mustRestore("*filter", ":"+c[0]+" - [0:0]", "COMMIT")
		must(t, destroySet(k.IPSets, set.Name), "destroy set after the rule is gone")
	})
}
