package stream

import (
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Where a stream is in the protocol: one phase, changed only by
// sessionState.next; session.enter applies a transition's effects (logs,
// the server's count of streams waiting for unknown nodes, the
// VersionsRequest).
//
//	waitReady ──ready──▶ resolve (the Hello gave a system version)
//	          └─ready──▶ first   (the Hello listed versions)
//	resolve ──claim matches──▶ first
//	resolve ──claim differs──▶ versions ──HeldVersions──▶ first
//	first ──first Delta queued──▶ streaming
//	resolve, first, streaming ──node absent──▶ unknown ──node present──▶ the phase it left
type phase uint8

const (
	// phaseWaitReady: the replica has not computed its first full state
	// (Options.Ready); nothing is read or sent.
	phaseWaitReady phase = iota
	// phaseResolve: the Hello gave a system version instead of versions;
	// the first full pass compares it with the node's.
	phaseResolve
	// phaseVersions: a VersionsRequest went out (at sessionState.since);
	// nothing is sent until HeldVersions answers it within HelloTimeout.
	phaseVersions
	// phaseFirst: what the agent holds is known (listed in the Hello or in
	// HeldVersions, or a matching system version); the first Delta, from a
	// full pass, is due and goes out even when empty ("in sync").
	phaseFirst
	// phaseStreaming: the first Delta went out; Deltas carry the dirty
	// names.
	phaseStreaming
	// phaseUnknown: the node is not in the Source (since
	// sessionState.since); nothing is sent or removed (fail-static), and
	// the node's appearance returns to sessionState.back with a full pass.
	phaseUnknown
)

var phaseNames = [...]string{"waitReady", "resolve", "versions", "first", "streaming", "unknown"}

func (p phase) String() string { return phaseNames[p] }

// fullPass reports whether the next read compares every desired name with
// every name the agent holds (List) rather than the dirty ones (Lookup).
func (p phase) fullPass() bool {
	return p == phaseResolve || p == phaseFirst || p == phaseUnknown
}

// event is what moves a stream from one phase to the next.
type event uint8

const (
	// evReady: the replica computed its first full state.
	evReady event = iota
	// evClaimMatches: the Hello's system version and count are the node's.
	evClaimMatches
	// evClaimDiffers: they are not; the agent is asked for its versions.
	evClaimDiffers
	// evHeldVersions: the agent listed its versions.
	evHeldVersions
	// evDeltaQueued: a Delta was queued for the agent.
	evDeltaQueued
	// evNodeAbsent: a read found the node unknown to the Source.
	evNodeAbsent
	// evNodePresent: a full read found the node.
	evNodePresent
	numEvents
)

var eventNames = [...]string{"ready", "claimMatches", "claimDiffers", "heldVersions", "deltaQueued", "nodeAbsent", "nodePresent"}

func (e event) String() string { return eventNames[e] }

// resumeClaim is a Hello's held_system_version and held_count.
type resumeClaim struct {
	systemVersion string
	count         uint32
}

// sessionState is a stream's phase and the data that goes with it.
type sessionState struct {
	phase phase
	// claim is the Hello's system version and count (zero for a Hello that
	// listed versions), until the first full pass settles it.
	claim resumeClaim
	// since is when the phase began, for its deadline: phaseVersions (the
	// VersionsRequest) and phaseUnknown (the wait for the node).
	since time.Time
	// back is the phase phaseUnknown returns to (phaseResolve, phaseFirst
	// or phaseStreaming).
	back phase
}

// next is the one place a stream changes phase: the state after event ev
// at time now, or ok=false if ev cannot happen in s's phase.
func (s sessionState) next(ev event, now time.Time) (_ sessionState, ok bool) {
	switch {
	case ev == evReady && s.phase == phaseWaitReady:
		if s.claim.systemVersion != "" {
			return sessionState{phase: phaseResolve, claim: s.claim}, true
		}
		return sessionState{phase: phaseFirst}, true
	case ev == evClaimMatches && s.phase == phaseResolve:
		return sessionState{phase: phaseFirst}, true
	case ev == evClaimDiffers && s.phase == phaseResolve:
		return sessionState{phase: phaseVersions, since: now}, true
	case ev == evHeldVersions && s.phase == phaseVersions:
		return sessionState{phase: phaseFirst}, true
	case ev == evDeltaQueued && (s.phase == phaseFirst || s.phase == phaseStreaming):
		return sessionState{phase: phaseStreaming}, true
	case ev == evNodeAbsent && s.phase == phaseUnknown:
		return s, true // still waiting, since the first absence
	case ev == evNodeAbsent && (s.phase == phaseResolve || s.phase == phaseFirst || s.phase == phaseStreaming):
		return sessionState{phase: phaseUnknown, claim: s.claim, since: now, back: s.phase}, true
	case ev == evNodePresent && s.phase == phaseUnknown:
		return sessionState{phase: s.back, claim: s.claim}, true
	case ev == evNodePresent && (s.phase == phaseResolve || s.phase == phaseFirst || s.phase == phaseStreaming):
		return s, true
	}
	return s, false
}

// enter moves the stream on by event ev (sessionState.next) and applies the
// transition's effects. An event its phase does not expect ends the stream:
// an unasked HeldVersions is the agent's protocol error, anything else a
// bug here.
func (ss *session) enter(ev event) error {
	from := ss.state
	to, ok := from.next(ev, ss.s.opts.Clock.Now())
	if !ok {
		if ev == evHeldVersions {
			return invalid("HeldVersions without a VersionsRequest")
		}
		return status.Errorf(codes.Internal, "stream: event %v in phase %v", ev, from.phase)
	}
	ss.state = to
	switch {
	case to.phase == phaseUnknown && from.phase != phaseUnknown:
		// A stream waits for its node at most UnknownNodeTimeout, and at
		// most MaxUnknownNodeStreams streams wait at once.
		if from.phase == phaseStreaming {
			ss.log.Warn("node disappeared from the desired state; keeping the agent's state")
		} else {
			ss.log.Info("node not in the desired state (no Node object); waiting for it to appear",
				zap.Duration("timeout", ss.s.opts.UnknownNodeTimeout))
		}
		if n := ss.s.unknown.Add(1); n > int64(ss.s.opts.MaxUnknownNodeStreams) {
			return closeErr(ReasonTooManyUnknown, codes.ResourceExhausted,
				"node %q is not in the cluster and %d streams already wait for unknown nodes", ss.node, n-1)
		}
	case from.phase == phaseUnknown && to.phase != phaseUnknown:
		if to.phase == phaseStreaming {
			ss.log.Info("node reappeared in the desired state; sending a full diff")
		}
		ss.s.unknown.Add(-1)
	case to.phase == phaseVersions:
		// The queue has room: nothing is in flight before the first Delta.
		ss.sendq <- &vsplanev1.ConnectResponse{Message: &vsplanev1.ConnectResponse_VersionsRequest{VersionsRequest: &vsplanev1.VersionsRequest{}}}
	}
	return nil
}

// leave ends the stream's phase when the stream ends: a stream waiting for
// its node no longer counts among the waiting ones.
func (ss *session) leave() {
	if ss.state.phase == phaseUnknown {
		ss.s.unknown.Add(-1)
	}
}
