package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/vm"
)

// StartForTest starts a cluster for t, or fails t saying what to install
// (scripts/vm/deps.sh, scripts/kube/build.sh). At t's end it stops the
// cluster (an error fails t), first logging its state (LogState) if t
// failed.
func StartForTest(t testing.TB, ctx context.Context, opts Options) *Cluster {
	t.Helper()
	c, err := Start(ctx, opts)
	if err != nil {
		if errors.Is(err, vm.ErrDepsMissing) {
			t.Fatalf("the VM test bed cannot run here (run bash scripts/vm/deps.sh): %v", err)
		}
		t.Fatalf("cluster start (needs bash scripts/kube/build.sh and bash scripts/vm/deps.sh): %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.LogState(t)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return c
}

// LogState logs to t, for a failed test, each node's agent log tail (40
// lines) and IPVS table, the VM console's tail (40 lines) and the
// apiserver/etcd log tail (20 lines). A node without an agent has no log.
func (c *Cluster) LogState(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	for _, n := range c.Nodes {
		if l, err := c.AgentLog(ctx, n.Name); err == nil {
			t.Logf("agent %s log tail:\n%s", n.Name, lastLines(l, 40))
		}
		if out, err := c.IPVS(ctx, n.Name); err == nil {
			t.Logf("%s ipvsadm -Ln:\n%s", n.Name, out)
		}
	}
	cancel()
	t.Logf("console tail:\n%s", c.VM.ConsoleTail(40))
	t.Logf("apiserver/etcd log tail:\n%s", c.Env.LogTail(20))
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
