package memory

import (
	"context"
	"net/netip"
	"slices"
	"sync"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

var _ kernel.AddressWatcher = (*Links)(nil)

// addrWatch delivers removed addresses to one watcher from a goroutine of
// its own: the kernel's lock is held where removals happen, and a watcher
// may call back into the kernel.
type addrWatch struct {
	mu      sync.Mutex
	pending []netip.Addr
	kick    chan struct{}
}

// WatchRemovedAddresses reports every address removed from any interface:
// unbinds that removed one, and a deleted device's addresses (see
// kernel.AddressWatcher). It never misses one, so it never reports the zero
// Addr.
func (m *Links) WatchRemovedAddresses(ctx context.Context, removed func(netip.Addr)) error {
	k := m.k()
	w := &addrWatch{kick: make(chan struct{}, 1)}
	k.mu.Lock()
	k.watches = append(k.watches, w)
	k.mu.Unlock()
	go func() {
		defer func() {
			k.mu.Lock()
			k.watches = slices.DeleteFunc(k.watches, func(x *addrWatch) bool { return x == w })
			k.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.kick:
			}
			w.mu.Lock()
			batch := w.pending
			w.pending = nil
			w.mu.Unlock()
			for _, a := range batch {
				removed(a)
			}
		}
	}()
	return nil
}

// notifyRemoved queues addrs for every watcher; k.mu is held.
func (k *Kernel) notifyRemoved(addrs ...netip.Addr) {
	for _, w := range k.watches {
		w.mu.Lock()
		w.pending = append(w.pending, addrs...)
		w.mu.Unlock()
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}
