package inspect

import (
	"errors"
	"testing"
	"time"

	"github.com/vsplane/vsplane/controlplane/stream"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func recvNow(t *testing.T, w *watcher) event {
	t.Helper()
	select {
	case ev := <-w.ch:
		return ev
	default:
		t.Fatal("watcher has nothing buffered")
		return event{}
	}
}

// TestFeedDropsForSlowWatcherOnly: publish never blocks; a full watcher loses
// Deltas and the next one it gets counts them; other watchers lose nothing.
func TestFeedDropsForSlowWatcherOnly(t *testing.T) {
	f := NewFeed(2)
	var chained []string
	h := f.Hooks(stream.Hooks{OnDeltaSent: func(_ string, d *vsplanev1.Delta) { chained = append(chained, d.GetNonce()) }})
	slow, cancelSlow := f.watch("n1")
	fast, cancelFast := f.watch("n1")
	other, cancelOther := f.watch("n2")
	defer cancelOther()
	if f.Watchers("n1") != 2 || f.Watchers("n2") != 1 {
		t.Fatalf("watchers = %d, %d", f.Watchers("n1"), f.Watchers("n2"))
	}
	for i := range 6 {
		h.OnDeltaSent("n1", &vsplanev1.Delta{Nonce: string(rune('a' + i))})
		if ev := recvNow(t, fast); ev.delta.GetNonce() != string(rune('a'+i)) || ev.droppedBefore != 0 || ev.sentAt.IsZero() {
			t.Fatalf("fast watcher got %+v", ev)
		}
	}
	if len(chained) != 6 {
		t.Fatalf("next hook ran %d times, want 6", len(chained))
	}
	for _, want := range []string{"a", "b"} {
		if ev := recvNow(t, slow); ev.delta.GetNonce() != want || ev.droppedBefore != 0 {
			t.Fatalf("slow watcher got %+v, want %s", ev, want)
		}
	}
	h.OnDeltaSent("n1", &vsplanev1.Delta{Nonce: "g"})
	if ev := recvNow(t, slow); ev.delta.GetNonce() != "g" || ev.droppedBefore != 4 {
		t.Fatalf("slow watcher after the gap got %+v, want g with 4 dropped", ev)
	}
	if len(other.ch) != 0 {
		t.Fatal("a watcher of n2 got n1's Deltas")
	}
	cancelSlow()
	cancelFast()
	if f.Watchers("n1") != 0 {
		t.Fatalf("watchers after cancel = %d", f.Watchers("n1"))
	}
	h.OnDeltaSent("n1", &vsplanev1.Delta{Nonce: "h"}) // no watcher: a no-op
}

func TestFeedNackErrors(t *testing.T) {
	f := NewFeed(0)
	var disconnected, acks int
	h := f.Hooks(stream.Hooks{
		OnAck:        func(stream.AckEvent) { acks++ },
		OnDisconnect: func(string, error) { disconnected++ },
	})
	h.OnAck(stream.AckEvent{Node: "n1", Status: vsplanev1.AckStatus_ACK_STATUS_NACK, ReceivedAt: time.Now(),
		Errors: []*vsplanev1.ResourceError{{Name: "service/a/b", Version: "v1", Message: "boom"}, {Message: "unnamed"}}})
	if got := f.nackError("n1", "service/a/b", "v1"); got != "boom" {
		t.Fatalf("nackError = %q", got)
	}
	if got := f.nackError("n1", "service/a/b", "v2"); got != "" {
		t.Fatalf("nackError for another version = %q", got)
	}
	h.OnDisconnect("n1", errors.New("gone"))
	if got := f.nackError("n1", "service/a/b", "v1"); got != "" {
		t.Fatalf("nackError after disconnect = %q", got)
	}
	if acks != 1 || disconnected != 1 {
		t.Fatalf("chained hooks ran %d/%d times", acks, disconnected)
	}
	var nilFeed *Feed
	if nilFeed.nackError("n1", "x", "v") != "" {
		t.Fatal("nil Feed reported an error")
	}
}
