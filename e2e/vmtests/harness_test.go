package vmtests

import (
	"context"
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/cluster"
)

// vmRun is one VM test's time budget and phase clock.
type vmRun struct {
	t           *testing.T
	ctx         context.Context
	start, last time.Time
}

// newVMRun bounds the test to budget (and to 20 s before the go test
// deadline, so teardown and the failure report still run).
func newVMRun(t *testing.T, budget time.Duration) *vmRun {
	t.Helper()
	deadline := time.Now().Add(budget)
	if d, ok := t.Deadline(); ok && d.Add(-20*time.Second).Before(deadline) {
		deadline = d.Add(-20 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	now := time.Now()
	return &vmRun{t: t, ctx: ctx, start: now, last: now}
}

// phase logs how long the step just finished took (VM tests are slow
// under TCG; the log says where the time went).
func (r *vmRun) phase(what string) {
	r.t.Logf("%-40s %8v (total %v)", what, time.Since(r.last).Round(time.Millisecond), time.Since(r.start).Round(time.Millisecond))
	r.last = time.Now()
}

// startCluster starts the VM cluster or fails the test saying what to
// install; at the end it stops the cluster, first logging the agents' logs,
// IPVS tables, console and apiserver tails if the test failed.
func (r *vmRun) startCluster(opts cluster.Options) *cluster.Cluster {
	r.t.Helper()
	return cluster.StartForTest(r.t, r.ctx, opts)
}
