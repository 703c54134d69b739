package watch

import (
	"reflect"
	"sync"
	"time"

	"github.com/vsplane/vsplane/controlplane/model"
)

// Observed is one converted Kubernetes object as the model sees it.
type Observed[T any] struct {
	// Value is nil when the object exists but is not proxied or unusable.
	Value *T
	// Problems found while converting (dropped parts or the reason it was skipped).
	Problems []model.Problem
}

// Change is the net change of one object since the last batch.
type Change[T any] struct {
	// Previous is the object as the sink last saw it; nil if it did not exist.
	Previous *Observed[T]
	// Current is the object now; nil if it no longer exists.
	Current *Observed[T]
	// Trigger is the earliest trigger time of the events merged into this change.
	Trigger time.Time
}

// tracker coalesces the changes of one kind of object, like kube-proxy's
// ServiceChangeTracker: per key it keeps the first previous and the latest
// current value, and forgets the key when they become equal again (add then
// delete, or an update back to the same content).
type tracker[K comparable, T any] struct {
	mu    sync.Mutex
	items map[K]*Change[T]
}

func newTracker[K comparable, T any]() *tracker[K, T] {
	return &tracker[K, T]{items: map[K]*Change[T]{}}
}

// update records that key went from prev() to cur (nil = absent) at
// trigger. prev is called only when no change of key is pending (a pending
// change keeps its first Previous), under the tracker's lock. It returns
// true if a change for key is pending afterwards.
func (t *tracker[K, T]) update(key K, prev func() *Observed[T], cur *Observed[T], trigger time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch, ok := t.items[key]
	if !ok {
		ch = &Change[T]{Previous: prev(), Trigger: trigger}
		t.items[key] = ch
	} else if trigger.Before(ch.Trigger) {
		ch.Trigger = trigger
	}
	ch.Current = cur
	if reflect.DeepEqual(ch.Previous, ch.Current) {
		delete(t.items, key)
		return false
	}
	return true
}

// take returns and clears the pending changes.
func (t *tracker[K, T]) take() map[K]Change[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[K]Change[T], len(t.items))
	for k, ch := range t.items {
		out[k] = *ch
	}
	clear(t.items)
	return out
}

// requeue puts back changes the sink failed to apply, underneath any newer
// changes recorded since take.
func (t *tracker[K, T]) requeue(batch map[K]Change[T]) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, old := range batch {
		newer, ok := t.items[k]
		if !ok {
			c := old
			t.items[k] = &c
			continue
		}
		newer.Previous = old.Previous
		if old.Trigger.Before(newer.Trigger) {
			newer.Trigger = old.Trigger
		}
		if reflect.DeepEqual(newer.Previous, newer.Current) {
			delete(t.items, k)
		}
	}
}

func (t *tracker[K, T]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.items)
}
