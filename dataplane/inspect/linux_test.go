package inspect

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/internal/netnstest"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// The real-kernel test changes ipsets and iptables, so the test
// binary re-executes itself in a fresh network namespace (never a skip: not
// getting one fails that test).
var netnsErr error

func TestMain(m *testing.M) {
	netnsErr = netnstest.Reexec("VSPLANE_INSPECT_TEST_IN_NETNS")
	os.Exit(m.Run())
}

// TestRealKernelSetsAndRules is TestSetsAndRulesCompared on this machine's
// kernel: real ipsets and iptables (the host's backend); IPVS, links,
// sysctls and conntrack in memory (this host's kernel has neither IPVS nor
// dummy links; the VM tests cover those). It covers what the memory kernel cannot do: a set
// destroyed, a set recreated with another type, entries as the kernel
// lists them, rules as iptables-save prints them. Then a full reconcile
// repairs all but the set of the wrong type, and inspection agrees.
func TestRealKernelSetsAndRules(t *testing.T) {
	if netnsErr != nil {
		t.Fatalf("cannot run the real-kernel test: %v", netnsErr)
	}
	ctx := context.Background()
	mem := memory.New().Kernel()
	ipt, err := linux.NewIPTables(ctx, linux.IPTablesOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	sets, err := linux.NewIPSets()
	if err != nil {
		t.Fatal(err)
	}
	k := kernel.Kernel{IPVS: mem.IPVS, Links: mem.Links, Sysctl: mem.Sysctl, Conntrack: mem.Conntrack, IPSets: sets, IPTables: ipt}
	r, err := reconcile.New(k, reconcile.Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	a := service("a", "198.18.0.10", 80, "198.19.1.2", "198.19.2.3")
	a.GetService().IpsetEntries = []*vsplanev1.IPSetEntry{{Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP,
		Family: vsplanev1.IPFamily_IP_FAMILY_IPV4, Ip: "198.18.0.10", Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP}}
	ack := r.Apply(ctx, &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{
		settings(), a, service("b", "198.18.0.11", 443, "198.19.1.4")}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v %v", ack.GetStatus(), ack.GetErrors())
	}
	s, err := New(r, Readers{IPVS: k.IPVS, Links: k.Links, IPSets: k.IPSets, IPTables: k.IPTables})
	if err != nil {
		t.Fatal(err)
	}
	get := func() (*vsplanev1.GetKernelStateResponse, map[string]*vsplanev1.IPSetState, map[string]*vsplanev1.ChainState) {
		t.Helper()
		resp, err := s.GetKernelState(ctx, &vsplanev1.GetKernelStateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetReadErrors()) != 0 {
			t.Fatalf("read errors: %v", resp.GetReadErrors())
		}
		sets, chains := map[string]*vsplanev1.IPSetState{}, map[string]*vsplanev1.ChainState{}
		for _, s := range resp.GetIpsets() {
			sets[s.GetName()] = s
		}
		for _, c := range resp.GetChains() {
			chains[c.GetTable()+"/"+c.GetChain()] = c
		}
		return resp, sets, chains
	}
	resp, setStates, chains := get()
	if resp.GetDifferences() != 0 {
		t.Fatalf("in sync after the Apply: differences %d\n%v", resp.GetDifferences(), resp)
	}
	if n := setStates["KUBE-CLUSTER-IP"].GetEntriesInSync(); n != 1 {
		t.Fatalf("KUBE-CLUSTER-IP: %d entries in sync, want 1", n)
	}
	if n := setStates["KUBE-IPVS-IPS"].GetEntriesInSync(); n != 2 {
		t.Fatalf("KUBE-IPVS-IPS: %d entries in sync, want the 2 bound addresses", n)
	}
	if c := chains["nat/KUBE-SERVICES"]; c.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC || c.GetKernelRules() == 0 {
		t.Fatalf("nat KUBE-SERVICES: %v", c)
	}

	// Drift of every kind the kernel allows. KUBE-NODE-PORT-SCTP-HASH and
	// KUBE-NODE-PORT-UDP are empty, so no rule references them and the
	// kernel lets them go.
	for _, cmd := range [][]string{
		{"ipset", "del", "KUBE-CLUSTER-IP", "198.18.0.10,tcp:80"},
		{"ipset", "add", "KUBE-CLUSTER-IP", "198.18.0.99,tcp:8080"},
		{"ipset", "destroy", "KUBE-NODE-PORT-SCTP-HASH"},
		{"ipset", "destroy", "KUBE-NODE-PORT-UDP"},
		{"ipset", "create", "KUBE-NODE-PORT-UDP", "hash:ip"},
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}
	if err := k.IPTables.Restore(ctx, kernel.FamilyIPv4, []byte("*nat\n-F KUBE-SERVICES\n-A KUBE-POSTROUTING -j RETURN\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	resp, setStates, chains = get()
	if s := setStates["KUBE-CLUSTER-IP"]; s.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS ||
		!slices.Equal(s.GetMissingEntries(), []string{"198.18.0.10,tcp:80"}) ||
		!slices.Equal(s.GetExtraEntries(), []string{"198.18.0.99,tcp:8080"}) || s.GetHeaderDiffers() != "" {
		t.Errorf("KUBE-CLUSTER-IP after one entry deleted and one added: %v", s)
	}
	if s := setStates["KUBE-NODE-PORT-SCTP-HASH"]; s.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_MISSING_IN_KERNEL {
		t.Errorf("KUBE-NODE-PORT-SCTP-HASH after ipset destroy: %v", s)
	}
	if s := setStates["KUBE-NODE-PORT-UDP"]; s.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS ||
		!strings.Contains(s.GetHeaderDiffers(), "exists as hash:ip") || !strings.Contains(s.GetHeaderDiffers(), "the agent creates bitmap:port") {
		t.Errorf("KUBE-NODE-PORT-UDP recreated as hash:ip: %v", s)
	}
	if c := chains["nat/KUBE-SERVICES"]; c.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS || c.GetKernelRules() != 0 ||
		len(c.GetMissingRules()) != int(c.GetDesiredRules()) || len(c.GetExtraRules()) != 0 {
		t.Errorf("nat KUBE-SERVICES after a flush: %v", c)
	}
	if c := chains["nat/KUBE-POSTROUTING"]; c.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_DIFFERS ||
		!slices.Equal(c.GetExtraRules(), []string{"-j RETURN"}) || len(c.GetMissingRules()) != 0 {
		t.Errorf("nat KUBE-POSTROUTING after a rule was appended: %v", c)
	}
	// Two entries, a missing set, a set header, two chains.
	if resp.GetDifferences() != 6 {
		t.Errorf("differences = %d, want 6\n%v", resp.GetDifferences(), resp)
	}

	// A full reconcile repairs the rest. A set of the wrong type is never
	// destroyed (dataplane/reconcile/ipsets.go; kube-proxy's sync fails on
	// it too): it stays the one difference, and the agent names it.
	r.Reconcile(ctx)
	resp, setStates, _ = get()
	if resp.GetDifferences() != 1 || setStates["KUBE-NODE-PORT-UDP"].GetHeaderDiffers() == "" {
		t.Fatalf("after a full reconcile: differences %d, want only KUBE-NODE-PORT-UDP's header\n%v", resp.GetDifferences(), resp)
	}
	if errs := resp.GetKernelErrors(); len(errs) != 1 || !strings.Contains(errs[0], "ipset KUBE-NODE-PORT-UDP: exists as hash:ip") {
		t.Fatalf("kernel errors %q, want the wrong set's", errs)
	}
}
