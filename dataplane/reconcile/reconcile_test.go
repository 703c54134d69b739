package reconcile

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

var twoServices = kernelState{
	Services: map[string][]string{
		"tcp/198.18.0.10:80 rr": {"198.19.1.2:8080 w1", "198.19.2.3:8080 w1"},
		"udp/198.18.0.11:53 rr": {"198.19.1.5:5353 w1"},
	},
	Bound: []string{"198.18.0.10", "198.18.0.11"},
	Sets: map[string][]string{
		"KUBE-CLUSTER-IP": {"198.18.0.10,tcp:80", "198.18.0.11,udp:53"},
		"KUBE-IPVS-IPS":   {"198.18.0.10", "198.18.0.11"},
	},
}

// setup applies settings + svcA + svcB to a fresh memory kernel.
func setup(t *testing.T) (*memory.Kernel, *Reconciler) {
	t.Helper()
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	return mk, r
}

func TestApplyTwoClusterIPServices(t *testing.T) {
	mk, r := setup(t)
	wantState(t, mk, twoServices)

	wantNAT := []string{
		`-s 127.0.0.0/8 -j RETURN`,
		`! -s 198.19.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`,
		`-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT`,
		`-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT`,
	}
	if d := cmp.Diff(wantNAT, natRules(t, mk, "KUBE-SERVICES")); d != "" {
		t.Errorf("KUBE-SERVICES (-want +got):\n%s", d)
	}
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		if got := natRules(t, mk, chain); !slices.Contains(got, `-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`) {
			t.Errorf("%s lacks the KUBE-SERVICES jump: %q", chain, got)
		}
	}
	calls := mk.Calls()
	if calls["iptables.Restore"] != 1 {
		t.Errorf("iptables restores = %d, want 1 (one per family)", calls["iptables.Restore"])
	}
	sc := mk.Kernel().Sysctl
	for name, want := range map[string]int{
		kernel.SysctlVSConntrack: 1, kernel.SysctlVSExpireNodestConn: 1, kernel.SysctlVSExpireQuiescentTmpl: 1,
		kernel.SysctlIPForward: 1, kernel.SysctlVSConnReuseMode: 1, // 6.1 kernel: left alone
		kernel.SysctlArpIgnoreAll: 0,
	} {
		if got, _ := sc.Get(name); got != want {
			t.Errorf("sysctl %s = %d, want %d", name, got, want)
		}
	}
	wantVersions := map[string]string{
		SettingsResource:    settingsRes(defaultNodeSettings()).GetVersion(),
		"service/default/a": svcA.resource().GetVersion(),
		"service/default/b": svcB.resource().GetVersion(),
	}
	if d := cmp.Diff(wantVersions, r.Versions()); d != "" {
		t.Errorf("Versions (-want +got):\n%s", d)
	}
}

func TestEndpointChangeTouchesOnlyThatDestination(t *testing.T) {
	mk, r := setup(t)
	mk.ResetCalls()
	changed := svcA
	changed.backends = []backend{be("198.19.1.2", 8080), be("198.19.2.4", 8080)}
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{changed.resource()}})
	mustAck(t, ack)
	want := map[string]uint32{wire.OpAddDestination: 1, wire.OpDeleteDestination: 1}
	if d := cmp.Diff(want, ops(ack.GetKernelOperations())); d != "" {
		t.Errorf("kernel_operations (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{"ipvs.AddDestination": 1, "ipvs.DeleteDestination": 1}, writes(mk)); d != "" {
		t.Errorf("kernel writes (-want +got):\n%s", d)
	}

	// A weight change is one update.
	mk.ResetCalls()
	changed.backends[0].weight = 5
	ack = apply(t, r, &vsplanev1.Delta{Nonce: "3", Resources: []*vsplanev1.Resource{changed.resource()}})
	mustAck(t, ack)
	if d := cmp.Diff(map[string]uint32{wire.OpUpdateDestination: 1}, ops(ack.GetKernelOperations())); d != "" {
		t.Errorf("kernel_operations (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{"ipvs.UpdateDestination": 1}, writes(mk)); d != "" {
		t.Errorf("kernel writes (-want +got):\n%s", d)
	}
	st := readState(t, mk)
	if d := cmp.Diff([]string{"198.19.1.2:8080 w5", "198.19.2.4:8080 w1"}, st.Services["tcp/198.18.0.10:80 rr"]); d != "" {
		t.Errorf("destinations (-want +got):\n%s", d)
	}
	if ack.GetApplyDuration() == nil {
		t.Error("apply_duration not set")
	}
}

func TestRemoveService(t *testing.T) {
	mk, r := setup(t)
	mk.ResetCalls()
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "2", Removed: []string{"service/default/b", "service/default/never-seen"}})
	mustAck(t, ack)
	wantState(t, mk, kernelState{
		Services: map[string][]string{"tcp/198.18.0.10:80 rr": {"198.19.1.2:8080 w1", "198.19.2.3:8080 w1"}},
		Bound:    []string{"198.18.0.10"},
		Sets: map[string][]string{
			"KUBE-CLUSTER-IP": {"198.18.0.10,tcp:80"},
			"KUBE-IPVS-IPS":   {"198.18.0.10"},
		},
	})
	// KUBE-CLUSTER-IP is still non-empty: the rules did not change.
	want := map[string]uint32{wire.OpDeleteService: 1, wire.OpUnbind: 1, wire.OpDelEntry: 2}
	if d := cmp.Diff(want, ops(ack.GetKernelOperations())); d != "" {
		t.Errorf("kernel_operations (-want +got):\n%s", d)
	}
	if _, ok := r.Versions()["service/default/b"]; ok {
		t.Error("removed service still in Versions")
	}

	// Removing the last service empties KUBE-CLUSTER-IP: rules re-rendered.
	ack = apply(t, r, &vsplanev1.Delta{Nonce: "3", Removed: []string{"service/default/a"}})
	mustAck(t, ack)
	if ack.GetKernelOperations()[wire.OpRestore] != 1 {
		t.Errorf("want one iptables restore, got ops %v", ack.GetKernelOperations())
	}
	if got := natRules(t, mk, "KUBE-SERVICES"); !slices.Equal(got, []string{"-s 127.0.0.0/8 -j RETURN", "-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"}) {
		t.Errorf("KUBE-SERVICES still matches the empty set: %q", got)
	}
	wantState(t, mk, kernelState{Services: map[string][]string{}, Sets: map[string][]string{}})
}

func TestReplaceAllRemovesUnlisted(t *testing.T) {
	mk, r := setup(t)
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource())))
	st := readState(t, mk)
	if _, ok := st.Services["udp/198.18.0.11:53 rr"]; ok || len(st.Bound) != 1 {
		t.Fatalf("replace_all kept service b: %+v", st)
	}
}

func TestRestartWritesNothing(t *testing.T) {
	mk, _ := setup(t)
	mk.ResetCalls()
	r2 := newReconciler(t, mk, Config{})
	r2.Reconcile(context.Background()) // before the first delta: nothing
	ack := apply(t, r2, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource()))
	mustAck(t, ack)
	if len(ack.GetKernelOperations()) != 0 {
		t.Errorf("restart performed kernel operations %v", ack.GetKernelOperations())
	}
	if w := writes(mk); len(w) != 0 {
		t.Errorf("restart wrote to the kernel: %v", w)
	}
	wantState(t, mk, twoServices)
	r2.Reconcile(context.Background())
	if w := writes(mk); len(w) != 0 {
		t.Errorf("full reconcile after restart wrote to the kernel: %v", w)
	}
}

func TestRestartCleansUpServiceDeletedWhileDown(t *testing.T) {
	mk, _ := setup(t)
	r2 := newReconciler(t, mk, Config{})
	mk.ResetCalls()
	ack := apply(t, r2, full(settingsRes(defaultNodeSettings()), svcA.resource()))
	mustAck(t, ack)
	want := map[string]uint32{wire.OpDeleteService: 1, wire.OpUnbind: 1, wire.OpDelEntry: 2}
	if d := cmp.Diff(want, ops(ack.GetKernelOperations())); d != "" {
		t.Errorf("kernel_operations (-want +got):\n%s", d)
	}
	if got := readState(t, mk).Bound; !slices.Equal(got, []string{"198.18.0.10"}) {
		t.Errorf("bound = %v", got)
	}
}

func TestFailStaticBeforeFirstDelta(t *testing.T) {
	mk := memory.New()
	k := mk.Kernel()
	// Something a previous agent left: must survive until state arrives.
	if err := addVS(k, kernel.VirtualServer{Key: kernel.AddrKey(netip.MustParseAddr("198.18.0.99"), kernel.ProtocolTCP, 80), Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Links.EnsureDummy(kernel.DummyDevice); err != nil {
		t.Fatal(err)
	}
	if err := bindAddr(k, kernel.DummyDevice, netip.MustParseAddr("198.18.0.99")); err != nil {
		t.Fatal(err)
	}
	mk.ResetCalls()
	r := newReconciler(t, mk, Config{Period: time.Millisecond, RetryBase: time.Millisecond})
	if ack := r.Apply(context.Background(), nil); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Errorf("nil delta acked: %v", ack)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	// Several periods pass with no delta.
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
		r.Reconcile(ctx)
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if w := writes(mk); len(w) != 0 {
		t.Fatalf("kernel written before the first delta: %v", w)
	}
	if r.Stats().FullReconciles != 0 {
		t.Fatal("full reconcile ran before the first delta")
	}
}

func TestDriftRepaired(t *testing.T) {
	mk, r := setup(t)
	k := mk.Kernel()
	ctx := context.Background()
	keyA := kernel.AddrKey(netip.MustParseAddr("198.18.0.10"), kernel.ProtocolTCP, 80)
	keyB := kernel.AddrKey(netip.MustParseAddr("198.18.0.11"), kernel.ProtocolUDP, 53)
	if err := deleteVS(k, keyA); err != nil {
		t.Fatal(err)
	}
	if err := updateDest(k, keyB, kernel.Destination{Address: netip.MustParseAddr("198.19.1.5"), Port: 5353, Weight: 7}); err != nil {
		t.Fatal(err)
	}
	if err := unbindAddr(k, kernel.DummyDevice, netip.MustParseAddr("198.18.0.11")); err != nil {
		t.Fatal(err)
	}
	if err := flushSet(k, "KUBE-CLUSTER-IP"); err != nil {
		t.Fatal(err)
	}
	if err := k.IPTables.Restore(ctx, kernel.FamilyIPv4, []byte("*nat\n-F KUBE-MARK-MASQ\n-D PREROUTING 1\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	mk.ResetCalls()
	r.Reconcile(ctx)
	wantState(t, mk, twoServices)
	if got := natRules(t, mk, "KUBE-MARK-MASQ"); len(got) != 1 {
		t.Errorf("KUBE-MARK-MASQ not repaired: %q", got)
	}
	wantWrites := map[string]int{
		"ipvs.AddVirtualServer": 1, "ipvs.AddDestination": 2, "ipvs.UpdateDestination": 1,
		"link.BindAddress": 1, "iptables.Restore": 1,
		"ipset.AddEntry": 2, // KUBE-CLUSTER-IP refilled
	}
	if d := cmp.Diff(wantWrites, writes(mk)); d != "" {
		t.Errorf("repair writes (-want +got):\n%s", d)
	}
	st := r.Stats()
	if st.FullReconciles != 1 || st.DriftRepaired != 8 || st.RepairsByKind[wire.OpAddEntry] != 2 {
		t.Errorf("stats = %+v", st)
	}
	if got := natRules(t, mk, "PREROUTING"); len(got) != 1 {
		t.Errorf("PREROUTING jump not restored exactly once: %q", got)
	}

	// ipvsadm -C: everything gone, all back.
	for _, key := range []kernel.VirtualServerKey{keyA, keyB} {
		if err := deleteVS(k, key); err != nil {
			t.Fatal(err)
		}
	}
	r.Reconcile(ctx)
	wantState(t, mk, twoServices)

	// Nothing left to repair.
	mk.ResetCalls()
	r.Reconcile(ctx)
	if w := writes(mk); len(w) != 0 {
		t.Errorf("clean reconcile wrote %v", w)
	}
}

func TestKernelErrorFailsOnlyThatResource(t *testing.T) {
	mk := memory.New()
	mk.SetSchedulers([]string{"rr", "sh"}) // no wrr module yet
	// The agent was told wrr is offered (installed): the kernel's refusal
	// is a kernel error, retried.
	r := newReconciler(t, mk, Config{RetryBase: time.Millisecond, RetryMax: 5 * time.Millisecond, Schedulers: memory.DefaultSchedulers})
	bad := svcB
	bad.scheduler = "wrr"
	ack := apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), bad.resource()))
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("want NACK, got %v", ack.GetStatus())
	}
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetName() != "service/default/b" ||
		ack.GetErrors()[0].GetVersion() != bad.resource().GetVersion() {
		t.Fatalf("errors = %v", ack.GetErrors())
	}
	if msg := ack.GetErrors()[0].GetMessage(); !contains(msg, kernel.ErrUnsupported.Error()) {
		t.Errorf("error message lacks the kernel's reason: %q", msg)
	}
	st := readState(t, mk)
	if _, ok := st.Services["tcp/198.18.0.10:80 rr"]; !ok {
		t.Fatalf("service a not applied: %+v", st)
	}
	v := r.Versions()
	if _, ok := v["service/default/b"]; ok {
		t.Error("failed resource in Versions")
	}
	if _, ok := v["service/default/a"]; !ok {
		t.Error("applied resource missing from Versions")
	}
	if r.Stats().FailedResources != 1 {
		t.Errorf("FailedResources = %d", r.Stats().FailedResources)
	}

	// The module gets loaded; the periodic loop retries on its own.
	mk.SetSchedulers(memory.DefaultSchedulers)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Start(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := r.Versions()["service/default/b"]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("failed resource not retried: %v", r.Failed())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if _, ok := readState(t, mk).Services["udp/198.18.0.11:53 wrr"]; !ok {
		t.Errorf("retried service not programmed: %+v", readState(t, mk))
	}
}

func TestInjectedFaultOnOneResource(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource())))
	boom := errors.New("netlink: simulated ENOMEM")
	mk.SetFault(func(op string) error {
		if op == "ipvs.AddVirtualServer" {
			return boom
		}
		return nil
	})
	changedA := svcA
	changedA.backends = append(slices.Clone(svcA.backends), be("198.19.3.3", 8080))
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{svcB.resource(), changedA.resource()}})
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetName() != "service/default/b" || !contains(ack.GetErrors()[0].GetMessage(), "simulated ENOMEM") {
		t.Fatalf("errors = %v", ack.GetErrors())
	}
	if got := readState(t, mk).Services["tcp/198.18.0.10:80 rr"]; len(got) != 3 {
		t.Errorf("service a not updated despite b failing: %v", got)
	}
	mk.SetFault(nil)
	r.Reconcile(context.Background())
	if len(r.Failed()) != 0 {
		t.Fatalf("still failed after retry: %v", r.Failed())
	}
	if _, ok := readState(t, mk).Services["udp/198.18.0.11:53 rr"]; !ok {
		t.Error("service b not programmed by the retry")
	}
	// No Ack reports the retry's success: the status does, until a Delta
	// names the resource again.
	bName, bVersion := "service/default/b", svcB.resource().GetVersion()
	if got := r.Status().GetRecovered(); !maps.Equal(got, map[string]string{bName: bVersion}) {
		t.Errorf("status recovered = %v, want %s@%s", got, bName, bVersion)
	}
	if got := r.Status().GetRecovered(); got["service/default/a"] != "" {
		t.Errorf("a never failed but is reported recovered: %v", got)
	}
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "3", Resources: []*vsplanev1.Resource{svcB.resource()}}))
	if got := r.Status().GetRecovered(); len(got) != 0 {
		t.Errorf("recovered still reported after a Delta named it: %v", got)
	}
}

func TestExcludeCIDRsAndOwnership(t *testing.T) {
	mk := memory.New()
	k := mk.Kernel()
	add := func(addr string, bind bool) kernel.VirtualServerKey {
		key := kernel.AddrKey(netip.MustParseAddr(addr), kernel.ProtocolTCP, 443)
		if err := addVS(k, kernel.VirtualServer{Key: key, Scheduler: "rr"}); err != nil {
			t.Fatal(err)
		}
		if bind {
			if _, err := k.Links.EnsureDummy(kernel.DummyDevice); err != nil {
				t.Fatal(err)
			}
			if err := bindAddr(k, kernel.DummyDevice, key.Address); err != nil {
				t.Fatal(err)
			}
		}
		return key
	}
	excluded := add("198.18.200.1", true) // someone else's, in excludeCIDRs
	foreign := add("198.19.0.11", false)  // not on kube-ipvs0: not ours
	stale := add("198.18.0.77", true)     // ours from before a restart
	ns := defaultNodeSettings()
	ns.ExcludeCidrs = []string{"198.18.200.0/24"}
	r := newReconciler(t, mk, Config{})
	mustAck(t, apply(t, r, full(settingsRes(ns), svcA.resource())))
	for key, want := range map[kernel.VirtualServerKey]bool{excluded: true, foreign: true, stale: false} {
		_, err := k.IPVS.GetVirtualServer(key)
		if got := err == nil; got != want {
			t.Errorf("%v present = %v, want %v (err %v)", key, got, want, err)
		}
	}
	if got := readState(t, mk).Bound; !slices.Equal(got, []string{"198.18.0.10", "198.18.200.1"}) {
		t.Errorf("bound = %v", got)
	}
	r.Reconcile(context.Background())
	if _, err := k.IPVS.GetVirtualServer(excluded); err != nil {
		t.Errorf("periodic reconcile deleted an excluded virtual server: %v", err)
	}

	// A service of ours inside excludeCIDRs is programmed but never deleted.
	inExcl := tcp("x", "198.18.200.5", 80, be("198.19.1.9", 80))
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{inExcl.resource()}}))
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "3", Removed: []string{"service/default/x"}}))
	if _, err := k.IPVS.GetVirtualServer(kernel.AddrKey(netip.MustParseAddr("198.18.200.5"), kernel.ProtocolTCP, 80)); err != nil {
		t.Errorf("virtual server in excludeCIDRs deleted: %v", err)
	}
}

func TestBadResourceIsNackedOthersApplied(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	bad := tcp("bad", "not-an-ip", 80)
	ack := apply(t, r, full(svcA.resource(), bad.resource(), &vsplanev1.Resource{Name: "service/default/empty", Version: "1"}))
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK || len(ack.GetErrors()) != 2 {
		t.Fatalf("ack = %v", ack)
	}
	if _, ok := readState(t, mk).Services["tcp/198.18.0.10:80 rr"]; !ok {
		t.Error("good service not applied")
	}
	// Content errors are not retried.
	if !r.retry.at.IsZero() {
		t.Error("retry scheduled for a content error")
	}
}

func TestSettings(t *testing.T) {
	mk := memory.New()
	mk.SetKernelRelease("5.4.0-old")
	r := newReconciler(t, mk, Config{})
	ns := defaultNodeSettings()
	ns.StrictArp = true
	ns.TcpTimeoutSeconds = 600
	ns.DefaultScheduler = "lc"
	mustAck(t, apply(t, r, full(settingsRes(ns), svcA.resource())))
	sc := mk.Kernel().Sysctl
	for name, want := range map[string]int{kernel.SysctlVSConnReuseMode: 0, kernel.SysctlArpIgnoreAll: 1, kernel.SysctlArpAnnounceAll: 2} {
		if got, _ := sc.Get(name); got != want {
			t.Errorf("sysctl %s = %d, want %d", name, got, want)
		}
	}
	to, _ := mk.Kernel().IPVS.Timeouts()
	if to.TCP != 600*time.Second || to.UDP != memory.DefaultTimeoutUDP {
		t.Errorf("timeouts = %+v", to)
	}
	if _, ok := readState(t, mk).Services["tcp/198.18.0.10:80 lc"]; !ok {
		t.Errorf("default scheduler not used: %+v", readState(t, mk))
	}
	// Changing the default scheduler updates every service using it.
	ns.DefaultScheduler = "rr"
	ns.MasqueradeAll = true
	mk.ResetCalls()
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{settingsRes(ns)}})
	mustAck(t, ack)
	if d := cmp.Diff(map[string]uint32{wire.OpUpdateService: 1, wire.OpRestore: 1}, ops(ack.GetKernelOperations())); d != "" {
		t.Errorf("kernel_operations (-want +got):\n%s", d)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestFailedRemovalIsReportedAndRetried(t *testing.T) {
	mk, r := setup(t)
	mk.SetFault(func(op string) error {
		if op == "ipvs.DeleteVirtualServer" {
			return errors.New("simulated EBUSY")
		}
		return nil
	})
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "2", Removed: []string{"service/default/b"}})
	if len(ack.GetErrors()) != 1 || ack.GetErrors()[0].GetName() != "service/default/b" {
		t.Fatalf("errors = %v", ack.GetErrors())
	}
	if len(r.Stats().KernelErrors) == 0 || r.retry.at.IsZero() {
		t.Fatal("failed removal not scheduled for retry")
	}
	mk.SetFault(nil)
	r.Reconcile(context.Background())
	if _, ok := readState(t, mk).Services["udp/198.18.0.11:53 rr"]; ok {
		t.Error("retry did not delete the removed service's virtual server")
	}
	if len(r.Stats().KernelErrors) != 0 {
		t.Errorf("kernel errors after retry: %v", r.Stats().KernelErrors)
	}
}

func TestUnlessLocalBinding(t *testing.T) {
	mk := memory.New()
	mk.AddInterface("eth0", "veth", netip.MustParsePrefix("198.19.0.11/24"))
	r := newReconciler(t, mk, Config{})
	res := func(name, addr string) *vsplanev1.Resource {
		return &vsplanev1.Resource{Name: "service/default/" + name, Version: "1", Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
			VirtualServers: []*vsplanev1.VirtualServer{{
				Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP, Address: addr, Port: 80,
				Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL,
				RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.2", Port: 80, Weight: 1}},
			}},
		}}}
	}
	mustAck(t, apply(t, r, full(res("local", "198.19.0.11"), res("remote", "198.18.5.5"))))
	st := readState(t, mk)
	if !slices.Equal(st.Bound, []string{"198.18.5.5"}) {
		t.Errorf("bound = %v, want only the address no interface holds", st.Bound)
	}
	if len(st.Services) != 2 {
		t.Errorf("services = %v", st.Services)
	}
	if d := cmp.Diff([]string{"198.18.5.5"}, st.Sets["KUBE-IPVS-IPS"]); d != "" {
		t.Errorf("KUBE-IPVS-IPS (-want +got):\n%s", d)
	}
}

func TestDualStack(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{Families: []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6}})
	v6 := &vsplanev1.Resource{Name: "service/default/v6", Version: "1", Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
		VirtualServers: []*vsplanev1.VirtualServer{{
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: "2001:2:0:1::10", Port: 80,
			Family: vsplanev1.IPFamily_IP_FAMILY_IPV6, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
			RealServers: []*vsplanev1.RealServer{{Address: "2001:2:0:100::5", Port: 8080, Weight: 1}},
		}},
		IpsetEntries: []*vsplanev1.IPSetEntry{{Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP, Ip: "2001:2:0:1::10", Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP}},
	}}}
	ns := defaultNodeSettings()
	ns.ClusterCidrs = append(ns.ClusterCidrs, "2001:2:0:100::/56")
	ack := apply(t, r, full(settingsRes(ns), svcA.resource(), v6))
	mustAck(t, ack)
	if ack.GetKernelOperations()[wire.OpRestore] != 2 {
		t.Errorf("want one restore per family, got %v", ack.GetKernelOperations())
	}
	st := readState(t, mk)
	if d := cmp.Diff([]string{"2001:2:0:1::10,tcp:80"}, st.Sets["KUBE-6-CLUSTER-IP"]); d != "" {
		t.Errorf("KUBE-6-CLUSTER-IP (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"198.18.0.10", "2001:2:0:1::10"}, st.Bound); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
	if _, ok := st.Services["tcp/[2001:2:0:1::10]:80 rr"]; !ok {
		t.Errorf("IPv6 service missing: %v", st.Services)
	}
	b, err := mk.Kernel().IPTables.Save(context.Background(), kernel.FamilyIPv6, kernel.TableNAT)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(string(b), "! -s 2001:2:0:100::/56") || !contains(string(b), "KUBE-6-CLUSTER-IP") {
		t.Errorf("IPv6 nat rules:\n%s", b)
	}
	// A single-stack agent refuses IPv6 content as a problem, not a crash.
	r4 := newReconciler(t, memory.New(), Config{})
	if ack := apply(t, r4, full(v6)); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Errorf("IPv4-only agent accepted an IPv6 service: %v", ack)
	}
}

func TestSharedItemsStayWhileWanted(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{})
	// Two Services whose ExternalIP is the same address (different ports)
	// and that both list the same hairpin entry.
	res := func(name string, port uint32) *vsplanev1.Resource {
		return &vsplanev1.Resource{Name: "service/default/" + name, Version: "1", Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
			VirtualServers: []*vsplanev1.VirtualServer{{
				Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_EXTERNAL_IP, Address: "198.18.9.9", Port: port,
				Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_UNLESS_LOCAL,
				RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.2", Port: 80, Weight: 1}},
			}},
			IpsetEntries: []*vsplanev1.IPSetEntry{{Set: vsplanev1.IPSet_IP_SET_LOOP_BACK, Ip: "198.19.1.2", Port: 80,
				Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Ip2: "198.19.1.2"}},
		}}}
	}
	mustAck(t, apply(t, r, full(res("x", 80), res("y", 443))))
	mk.ResetCalls()
	ack := apply(t, r, &vsplanev1.Delta{Nonce: "2", Removed: []string{"service/default/x"}})
	mustAck(t, ack)
	if d := cmp.Diff(map[string]uint32{wire.OpDeleteService: 1}, ops(ack.GetKernelOperations())); d != "" {
		t.Errorf("kernel_operations (-want +got):\n%s", d)
	}
	st := readState(t, mk)
	if !slices.Equal(st.Bound, []string{"198.18.9.9"}) || len(st.Sets["KUBE-LOOP-BACK"]) != 1 {
		t.Errorf("shared address/entry removed while still wanted: %+v", st)
	}
	mustAck(t, apply(t, r, &vsplanev1.Delta{Nonce: "3", Removed: []string{"service/default/y"}}))
	wantState(t, mk, kernelState{Services: map[string][]string{}, Sets: map[string][]string{}})
}

func TestRunRepairsDriftPeriodically(t *testing.T) {
	mk := memory.New()
	r := newReconciler(t, mk, Config{Period: 5 * time.Millisecond})
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// Someone runs `ipvsadm -C` and removes an address.
	k := mk.Kernel()
	for _, key := range []kernel.VirtualServerKey{
		kernel.AddrKey(netip.MustParseAddr("198.18.0.10"), kernel.ProtocolTCP, 80),
		kernel.AddrKey(netip.MustParseAddr("198.18.0.11"), kernel.ProtocolUDP, 53),
	} {
		if err := deleteVS(k, key); err != nil {
			t.Fatal(err)
		}
	}
	if err := unbindAddr(k, kernel.DummyDevice, netip.MustParseAddr("198.18.0.10")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().DriftRepaired < 6 { // 2 services + 3 destinations + 1 address
		if time.Now().After(deadline) {
			t.Fatalf("drift not repaired by Run: %+v", r.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	wantState(t, mk, twoServices)
}

// A failed iptables-restore is counted per family (kube-proxy's
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total) and the
// retry that succeeds does not count.
func TestRestoreFailuresCounted(t *testing.T) {
	mk := memory.New()
	restoreErr := errors.New("iptables-restore: line 3 failed")
	mk.SetFault(func(op string) error {
		if op == "iptables.Restore" {
			return restoreErr
		}
		return nil
	})
	r := newReconciler(t, mk, Config{})
	apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource()))
	if got := r.Stats().RestoreFailures; got[kernel.FamilyIPv4] != 1 || len(got) != 1 {
		t.Fatalf("after one failed restore: %v, want IPv4: 1", got)
	}
	mk.SetFault(nil)
	r.Reconcile(context.Background())
	if got := r.Stats().RestoreFailures; got[kernel.FamilyIPv4] != 1 {
		t.Errorf("after a successful retry: %v, want IPv4 still 1", got)
	}
	if rules := natRules(t, mk, "KUBE-SERVICES"); len(rules) == 0 {
		t.Error("the retry did not write KUBE-SERVICES")
	}
}
