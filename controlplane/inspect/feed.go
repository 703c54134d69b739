package inspect

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/controlplane/stream"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// DefaultWatchBuffer is the per-watcher buffer of Feed when none is given.
const DefaultWatchBuffer = 64

// Feed observes the agent streams through stream.Hooks and serves what
// inspection needs from them: a fan-out of sent Deltas to WatchDeltas callers
// and the last per-resource NACK error of each connected node.
//
// Hooks run on the agent stream's goroutine, so publishing never blocks: each
// watcher has a bounded buffer, and when it is full the Delta is dropped for
// that watcher only and counted; the next Delta it does get carries the count
// (WatchDeltasResponse.dropped_before). Drops after a watcher's last delivered
// Delta are never reported. The agent stream is never slowed by a watcher.
type Feed struct {
	buffer    int
	closed    chan struct{}
	closeOnce sync.Once

	mu       sync.RWMutex
	watchers map[string]map[*watcher]struct{}
	// nacks[node][resource] is the agent's last error for that resource;
	// dropped when the node's stream ends.
	nacks map[string]map[string]*vsplanev1.ResourceError
}

// NewFeed returns a Feed whose watchers each buffer up to buffer Deltas
// (DefaultWatchBuffer if buffer <= 0).
func NewFeed(buffer int) *Feed {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	return &Feed{
		buffer:   buffer,
		closed:   make(chan struct{}),
		watchers: map[string]map[*watcher]struct{}{},
		nacks:    map[string]map[string]*vsplanev1.ResourceError{},
	}
}

// Hooks returns stream hooks that feed f and then call next's hooks.
func (f *Feed) Hooks(next stream.Hooks) stream.Hooks {
	h := next
	h.OnDeltaSent = func(node string, d *vsplanev1.Delta) {
		f.publish(node, d, time.Now())
		if next.OnDeltaSent != nil {
			next.OnDeltaSent(node, d)
		}
	}
	h.OnAck = func(ev stream.AckEvent) {
		f.recordAck(ev)
		if next.OnAck != nil {
			next.OnAck(ev)
		}
	}
	h.OnDisconnect = func(node string, err error) {
		f.mu.Lock()
		delete(f.nacks, node)
		f.mu.Unlock()
		if next.OnDisconnect != nil {
			next.OnDisconnect(node, err)
		}
	}
	return h
}

// Close ends every WatchDeltas call (with Unavailable) and refuses new ones,
// so a watching client does not hold up a graceful gRPC stop. Call it before
// stopping the gRPC server; safe to call more than once.
func (f *Feed) Close() { f.closeOnce.Do(func() { close(f.closed) }) }

// event is one Delta as one watcher receives it.
type event struct {
	sentAt        time.Time
	droppedBefore uint64
	delta         *vsplanev1.Delta
}

type watcher struct {
	ch chan event

	mu      sync.Mutex
	dropped uint64
}

// watch registers a watcher for node; cancel unregisters it.
func (f *Feed) watch(node string) (w *watcher, cancel func()) {
	w = &watcher{ch: make(chan event, f.buffer)}
	f.mu.Lock()
	if f.watchers[node] == nil {
		f.watchers[node] = map[*watcher]struct{}{}
	}
	f.watchers[node][w] = struct{}{}
	f.mu.Unlock()
	return w, func() {
		f.mu.Lock()
		delete(f.watchers[node], w)
		if len(f.watchers[node]) == 0 {
			delete(f.watchers, node)
		}
		f.mu.Unlock()
	}
}

// Watchers returns the number of WatchDeltas callers watching node.
func (f *Feed) Watchers(node string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.watchers[node])
}

func (f *Feed) publish(node string, d *vsplanev1.Delta, at time.Time) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for w := range f.watchers[node] {
		// The Delta was already sent and is never modified again; watchers
		// share it read-only.
		w.mu.Lock()
		select {
		case w.ch <- event{sentAt: at, droppedBefore: w.dropped, delta: d}:
			w.dropped = 0
		default:
			w.dropped++
		}
		w.mu.Unlock()
	}
}

func (f *Feed) recordAck(ev stream.AckEvent) {
	if len(ev.Errors) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.nacks[ev.Node]
	if m == nil {
		m = map[string]*vsplanev1.ResourceError{}
		f.nacks[ev.Node] = m
	}
	for _, e := range ev.Errors {
		if e.GetName() != "" {
			m[e.GetName()] = proto.Clone(e).(*vsplanev1.ResourceError)
		}
	}
}

// nackError returns the agent's last error for resource name at version on
// node ("" if none recorded).
func (f *Feed) nackError(node, name, version string) string {
	if f == nil {
		return ""
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.nacks[node][name]
	if e == nil || e.GetVersion() != version {
		return ""
	}
	return e.GetMessage()
}
