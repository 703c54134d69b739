package reconcile

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/rules"
)

// printIPTables is the in-memory IPTables with a fingerprint that, like
// nf_tables' generation, changes with every restore; it counts saves.
type printIPTables struct {
	kernel.IPTables
	mu    sync.Mutex
	gen   uint64
	saves int
}

func (p *printIPTables) Restore(ctx context.Context, fam kernel.Family, payload []byte) error {
	err := p.IPTables.Restore(ctx, fam, payload)
	if err == nil {
		p.mu.Lock()
		p.gen++
		p.mu.Unlock()
	}
	return err
}

func (p *printIPTables) Save(ctx context.Context, fam kernel.Family, t kernel.Table) ([]byte, error) {
	p.mu.Lock()
	p.saves++
	p.mu.Unlock()
	return p.IPTables.Save(ctx, fam, t)
}

func (p *printIPTables) Fingerprint(kernel.Family, ...kernel.Table) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen, nil
}

func (p *printIPTables) savesSoFar() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.saves
}

func newPrintReconciler(t *testing.T, cfg Config) (*Reconciler, *printIPTables, kernel.Kernel) {
	t.Helper()
	k := memory.New().Kernel()
	ipt := &printIPTables{IPTables: k.IPTables}
	k.IPTables = ipt
	r, err := New(k, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	mustAck(t, apply(t, r, full(settingsRes(defaultNodeSettings()), svcA.resource(), svcB.resource())))
	return r, ipt, k
}

// flushServicesChain is iptables -t nat -F KUBE-SERVICES by someone else.
func flushServicesChain(t *testing.T, k kernel.Kernel) {
	t.Helper()
	if err := k.IPTables.Restore(context.Background(), kernel.FamilyIPv4, []byte("*nat\n:"+rules.ChainServices+" - [0:0]\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
}

func servicesChainRules(t *testing.T, k kernel.Kernel) int {
	t.Helper()
	out, err := k.IPTables.Save(context.Background(), kernel.FamilyIPv4, kernel.TableNAT)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(out), "-A "+rules.ChainServices+" ")
}

// TestFullPassTrustsUnchangedFingerprint: a full pass leaves out the
// iptables-save while the tables keep the fingerprint of the last right
// compare, at most maxPrintSkips passes in a row; a changed fingerprint (a
// flushed chain) is compared and repaired by the next pass.
func TestFullPassTrustsUnchangedFingerprint(t *testing.T) {
	r, ipt, k := newPrintReconciler(t, Config{ProbeInterval: -1})
	ctx := context.Background()
	want := servicesChainRules(t, k)
	if want == 0 {
		t.Fatal("no KUBE-SERVICES rules after the first Apply")
	}
	before := ipt.savesSoFar()
	for range maxPrintSkips {
		r.Reconcile(ctx)
	}
	if n := ipt.savesSoFar() - before; n != 0 {
		t.Errorf("%d saves in %d full passes with the fingerprint unchanged, want 0", n, maxPrintSkips)
	}
	r.Reconcile(ctx) // the next one compares whatever the fingerprint says
	if n := ipt.savesSoFar() - before; n == 0 {
		t.Errorf("no save after %d trusting passes", maxPrintSkips)
	}

	flushServicesChain(t, k)
	before = ipt.savesSoFar()
	r.Reconcile(ctx)
	if ipt.savesSoFar() == before {
		t.Error("the fingerprint changed, but the full pass did not compare")
	}
	if got := servicesChainRules(t, k); got != want {
		t.Errorf("KUBE-SERVICES has %d rules after the pass, want %d", got, want)
	}
}

// TestDriftProbeSeesFlushedChain: with the period an hour away, a flushed
// KUBE-SERVICES is found by the probe's fingerprint and repaired by the
// full pass it runs.
func TestDriftProbeSeesFlushedChain(t *testing.T) {
	r, _, k := newPrintReconciler(t, Config{Period: time.Hour, ProbeInterval: 10 * time.Millisecond})
	want := servicesChainRules(t, k)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	awaitProbe(t, r, "three quiet probes", func() bool { return r.probe.runs >= 3 })
	r.mu.Lock()
	hits := r.probe.hits
	r.mu.Unlock()
	if hits != 0 {
		t.Fatalf("%d probes found drift before any", hits)
	}
	flushServicesChain(t, k)
	awaitProbe(t, r, "flushed chain repaired", func() bool { return r.probe.hits == 1 })
	if got := servicesChainRules(t, k); got != want {
		t.Errorf("KUBE-SERVICES has %d rules after the probe's pass, want %d", got, want)
	}
}
