package client

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Defaults of the mass-removal guard.
const (
	DefaultMaxRemovalShare     = 0.5
	DefaultRemovalConfirmation = 30 * time.Second
)

// removalGuard is the agent's defence in depth against a control plane that
// (by a bug, or while it is still starting) tells a resuming node to delete
// most of its Services: the first Delta after a (re)connect is the one that
// can do that, since it is computed from the agent's Hello.
//
// Such a Delta is held: not applied, not acknowledged, reported (log,
// OnRemovalHeld -> AgentStatus.held_removal and the agent's metrics). After
// the confirmation period the client reconnects, possibly to another
// replica, and asks again. If the new first Delta still removes more than
// the share, the removal is real (a namespace was deleted) and is applied;
// otherwise the hold is dropped and the new Delta applied. The price is
// that a real mass deletion reaches the node one confirmation period later,
// while the node keeps serving what it has.
type removalGuard struct {
	maxShare float64
	confirm  time.Duration
	log      *zap.Logger
	notify   func(*vsplanev1.HeldRemoval)

	mu   sync.Mutex
	held *vsplanev1.HeldRemoval // nil: nothing held
}

// check decides about a first Delta: 0 means apply it now; otherwise hold
// it for the returned duration. held is what the agent holds now.
func (g *removalGuard) check(d *vsplanev1.Delta, held map[string]string, target string, now time.Time) time.Duration {
	services, removed := removals(d, held)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.maxShare >= 1 || services == 0 || float64(removed) <= g.maxShare*float64(services) {
		if g.held != nil {
			g.log.Warn("mass removal not confirmed: the control plane no longer asks for it",
				zap.Uint32("heldRemovals", g.held.GetRemovals()), zap.Int("removalsNow", removed))
			g.held = nil
			g.report(nil)
		}
		return 0
	}
	if g.held != nil {
		if waited := now.Sub(g.held.GetSince().AsTime()); waited >= g.confirm {
			g.log.Warn("mass removal confirmed after the confirmation period; applying it",
				zap.Int("removals", removed), zap.Int("heldServices", services), zap.Duration("waited", waited),
				zap.String("target", target))
			g.held = nil
			g.report(nil)
			return 0
		}
		// Asked again too early (a reconnect for another reason): wait
		// out the rest of the period.
		g.held.Removals, g.held.HeldServices, g.held.Target = uint32(removed), uint32(services), target
		g.report(g.held)
		return g.confirm - now.Sub(g.held.GetSince().AsTime())
	}
	g.held = &vsplanev1.HeldRemoval{Removals: uint32(removed), HeldServices: uint32(services),
		Since: timestamppb.New(now), Target: target}
	g.log.Warn("holding a first Delta that would remove most of this node's Services; it is applied only if the control plane still asks for it after the confirmation period",
		zap.Int("removals", removed), zap.Int("heldServices", services), zap.Float64("maxShare", g.maxShare),
		zap.Duration("confirmation", g.confirm), zap.String("target", target))
	g.report(g.held)
	return g.confirm
}

// report hands the listener a copy (the guard keeps updating its own).
func (g *removalGuard) report(h *vsplanev1.HeldRemoval) {
	if g.notify == nil {
		return
	}
	if h == nil {
		g.notify(nil)
		return
	}
	g.notify(proto.Clone(h).(*vsplanev1.HeldRemoval))
}

// removals counts the Services held and how many of them d removes
// (explicitly, or by leaving them out of a replace_all).
func removals(d *vsplanev1.Delta, held map[string]string) (services, removed int) {
	for name := range held {
		if wire.IsServiceResource(name) {
			services++
		}
	}
	if d.GetReplaceAll() {
		keep := map[string]bool{}
		for _, r := range d.GetResources() {
			keep[r.GetName()] = true
		}
		for name := range held {
			if wire.IsServiceResource(name) && !keep[name] {
				removed++
			}
		}
		return services, removed
	}
	for _, name := range d.GetRemoved() {
		if _, ok := held[name]; ok && wire.IsServiceResource(name) {
			removed++
		}
	}
	return services, removed
}
