package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// rolloutsSeenLate answers GetRollout from a script: NotFound for the first
// notFound calls (the control plane's informer has not seen the rollout),
// then the rollout, or NotFound again after it was seen (deleted).
type rolloutsSeenLate struct {
	vsplanev1.InspectServiceClient
	notFound    int
	thenDeleted bool
	calls       int
}

func (f *rolloutsSeenLate) GetRollout(context.Context, *vsplanev1.GetRolloutRequest, ...grpc.CallOption) (*vsplanev1.GetRolloutResponse, error) {
	f.calls++
	if f.calls <= f.notFound || f.thenDeleted && f.calls > f.notFound+1 {
		return nil, status.Error(codes.NotFound, `rollout "to-mh" not found`)
	}
	if f.thenDeleted {
		return rollout("Progressing", vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_PENDING), nil
	}
	return rollout("Succeeded", vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_UPDATED), nil
}

func TestRolloutWatchWaitsForTheControlPlaneToObserveIt(t *testing.T) {
	clock := time.Unix(0, 0)
	newOptions := func() (*options, *bytes.Buffer) {
		var stderr bytes.Buffer
		return &options{output: OutputTable, stdout: &bytes.Buffer{}, stderr: &stderr,
			now: func() time.Time { clock = clock.Add(10 * time.Second); return clock }}, &stderr
	}
	ctx := context.Background()

	// Watching: not observed twice, then there (and done).
	o, stderr := newOptions()
	f := &rolloutsSeenLate{notFound: 2}
	if err := o.rolloutStatus(ctx, f, "to-mh", true, time.Millisecond); err != nil {
		t.Fatalf("watch of a rollout observed late: %v", err)
	}
	if f.calls != 3 || !strings.Contains(stderr.String(), "Waiting up to 30s for the control plane to observe rollout \"to-mh\"") {
		t.Errorf("calls %d, stderr %q", f.calls, stderr.String())
	}

	// Watching a name never observed: NotFound once the grace is over (the
	// fake clock moves 10 s per reading), not for ever.
	o, _ = newOptions()
	f = &rolloutsSeenLate{notFound: 1000}
	err := o.rolloutStatus(ctx, f, "to-mh", true, time.Millisecond)
	if status.Code(err) != codes.NotFound || ExitCode(err) != ExitNotFound || f.calls != 4 {
		t.Errorf("watch of an unknown rollout: %v (exit %d) after %d calls, want NotFound after 4", err, ExitCode(err), f.calls)
	}

	// Not watching: NotFound at once.
	o, _ = newOptions()
	f = &rolloutsSeenLate{notFound: 1000}
	if err := o.rolloutStatus(ctx, f, "to-mh", false, time.Millisecond); status.Code(err) != codes.NotFound || f.calls != 1 {
		t.Errorf("status of an unknown rollout: %v after %d calls, want NotFound after 1", err, f.calls)
	}

	// Watching, seen, then gone (deleted): NotFound at once, no waiting.
	o, _ = newOptions()
	f = &rolloutsSeenLate{thenDeleted: true}
	if err := o.rolloutStatus(ctx, f, "to-mh", true, time.Millisecond); status.Code(err) != codes.NotFound || f.calls != 2 {
		t.Errorf("watch of a deleted rollout: %v after %d calls, want NotFound after 2", err, f.calls)
	}
}
