package fanout_test

import (
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/fanout"
)

// TestFanoutTiny runs the whole benchmark at a tiny size so it cannot rot:
// a real apiserver, the control plane as its own process, 20 agents over
// TLS with bound tokens. It asserts correctness only (every agent converges
// to exactly the expected IPVS state and the control plane's versions, no
// NACK, the reconnect storm resends nothing); never times.
func TestFanoutTiny(t *testing.T) {
	rep := fanout.Run(t, fanout.Options{
		Size:    fanout.Size{Nodes: 20, Services: 50, Endpoints: 10},
		Changes: 5, BurstWriters: 2, IdleWindow: 500 * time.Millisecond,
		Timeout: 2 * time.Minute, ReadyTimeout: 2 * time.Minute,
		Out: "fanout-tiny", Dir: t.TempDir(),
	})
	// Run already failed t on each problem; the storm's "nothing resent"
	// and the final state comparison are among them.
	if len(rep.Problems) > 0 {
		t.Fatalf("problems: %v", rep.Problems)
	}
}
