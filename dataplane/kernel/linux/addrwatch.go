package linux

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

var _ kernel.AddressWatcher = (*Links)(nil)

// addrWatchRetry is how long a broken address watch waits before it
// subscribes again.
const addrWatchRetry = time.Second

// addrWatchBuffer is the subscription socket's receive buffer.
const addrWatchBuffer = 8 << 20

var forceRcvbufRefused atomic.Bool

// WatchRemovedAddresses subscribes to rtnetlink's IPv4 and IPv6 address
// groups in the caller's network namespace (the Links' own, as NewLinks)
// and reports every RTM_DELADDR (see kernel.AddressWatcher). A device
// deleted with its addresses sends one for each. When the subscription
// breaks (its socket's buffer overflowed: events came faster than they
// were read) it subscribes again and reports the zero Addr.
func (l *Links) WatchRemovedAddresses(ctx context.Context, removed func(netip.Addr)) error {
	updates, stop, err := subscribeAddresses(ctx)
	if err != nil {
		return fmt.Errorf("links: watch addresses: %w", err)
	}
	go func() {
		for {
			for u := range updates {
				if u.NewAddr {
					continue
				}
				if a, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok {
					removed(a.Unmap())
				}
			}
			stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(addrWatchRetry):
				}
				var err error
				if updates, stop, err = subscribeAddresses(ctx); err == nil {
					break
				}
			}
			removed(netip.Addr{})
		}
	}()
	return nil
}

// subscribeAddresses opens one subscription; stop closes its socket (the
// library closes the channel after a receive error, not the socket).
// The socket's buffer is forced to addrWatchBuffer (CAP_NET_ADMIN, which
// the agent has; without it the system's rmem_max): the agent's own unbind
// of thousands of addresses at once sends as many events.
// A refused force is not tried again (the library leaves that socket open).
func subscribeAddresses(ctx context.Context) (<-chan netlink.AddrUpdate, func(), error) {
	var err error
	for _, force := range []bool{true, false} {
		if force && forceRcvbufRefused.Load() {
			continue
		}
		sctx, stop := context.WithCancel(ctx)
		ch := make(chan netlink.AddrUpdate, 256)
		err = netlink.AddrSubscribeWithOptions(ch, sctx.Done(), netlink.AddrSubscribeOptions{
			ReceiveBufferSize: addrWatchBuffer, ReceiveBufferForceSize: force})
		if err == nil {
			return ch, stop, nil
		}
		stop()
		if force {
			forceRcvbufRefused.Store(true)
		}
	}
	return nil, nil, err
}
