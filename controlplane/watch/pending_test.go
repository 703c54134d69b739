package watch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vsplane/vsplane/controlplane/watch"
)

// chunkedSink has three more chunks of work after the first batch.
type chunkedSink struct {
	mu      sync.Mutex
	left    int
	batches []*watch.Changes
}

func (s *chunkedSink) Apply(_ context.Context, ch *watch.Changes) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.batches) == 0 {
		s.left = 3
	} else if s.left > 0 {
		s.left--
	}
	s.batches = append(s.batches, ch)
	return nil
}

func (s *chunkedSink) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left > 0
}

func (s *chunkedSink) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.batches)
}

// A sink with pending work is called again without any change until it is
// done, so a chunked periodic resync finishes on a quiet cluster.
func TestPendingSinkRunsUntilDone(t *testing.T) {
	sink := &chunkedSink{}
	w, err := watch.New(fake.NewClientset(node("n1")), sink, watch.Options{MinInterval: time.Millisecond}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	eventually(t, "three follow-up batches", func() bool { return sink.calls() >= 4 })
	if sink.Pending() {
		t.Fatal("still pending after the follow-ups")
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.batches[0].Nodes) != 1 {
		t.Errorf("first batch should hold the initial node, got %d nodes", len(sink.batches[0].Nodes))
	}
	for i, b := range sink.batches[1:4] {
		if !b.Empty() || b.Periodic {
			t.Errorf("follow-up %d: empty %v periodic %v, want an empty non-periodic batch", i+1, b.Empty(), b.Periodic)
		}
	}
}
