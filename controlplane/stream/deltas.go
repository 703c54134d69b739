package stream

import (
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vsplane/vsplane/controlplane/snapshot"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// maybeSend queues the next Deltas while flow control allows and there is
// something to send (or a full pass is due). It never blocks: at most
// MaxInFlight Deltas are queued or in gRPC, and the queue holds that many.
func (ss *session) maybeSend() error {
	if p := ss.state.phase; p == phaseWaitReady || p == phaseVersions {
		return nil // nothing goes out before the replica is ready and the agent says what it holds
	}
	for len(ss.inflight) < ss.s.opts.MaxInFlight && (ss.state.phase.fullPass() || len(ss.dirty) > 0) {
		queued, err := ss.sendNext()
		if err != nil || !queued {
			return err
		}
	}
	return nil // otherwise coalesce: dirty keeps growing until an Ack frees a slot
}

// sendNext computes the next Delta from the pending work and queues it;
// it reports whether it queued one.
//
// A Delta carries whole resources, in name order, up to the stream's budget
// (applyRate) of estimated kernel work, so a burst reaches the agent as
// Deltas it applies in about TargetApplyTime each instead of one that
// everything waits behind. What does not fit stays dirty and is read again
// next time, so a name changed meanwhile goes out at its newest version.
// Removals ride only with the last of the pending upserts: an upsert may
// replace what a removal takes away (a Service recreated under another name
// with the same ClusterIP), so the node never lacks both. Every Delta thus
// leaves the node at a prefix of a complete state.
func (ss *session) sendNext() (bool, error) {
	var upserts []Entry
	var removed []string
	var sysVersion string
	full := ss.state.phase.fullPass()
	if full {
		// First Delta, or the node (re)appeared: compare everything desired
		// with everything the agent holds.
		res, sv, ok := ss.s.src.List(ss.node)
		if !ok {
			return false, ss.nodeUnknown()
		}
		if err := ss.enter(evNodePresent); err != nil {
			return false, err
		}
		if ss.state.phase == phaseResolve {
			if ok, err := ss.resumed(res, sv); !ok || err != nil {
				return false, err // asked for the agent's versions instead
			}
		}
		sysVersion, ss.lastSys = sv, sv
		set := make(map[string]struct{}, len(res)+ss.st.sent.Len())
		for _, e := range res {
			set[e.Resource.GetName()] = struct{}{}
		}
		for n := range ss.st.sent.All() {
			set[n] = struct{}{}
		}
		for _, name := range slices.Sorted(maps.Keys(set)) {
			i, found := sort.Find(len(res), func(i int) int { return strings.Compare(name, res[i].Resource.GetName()) })
			var e Entry
			if found {
				e = res[i]
			}
			upserts, removed = ss.decide(name, e, found, upserts, removed)
		}
	} else {
		// Incremental: O(pending names), one consistent read.
		names := slices.Sorted(maps.Keys(ss.dirty))
		found, sv, ok := ss.s.src.Lookup(ss.node, names)
		if !ok {
			return false, ss.nodeUnknown()
		}
		sysVersion, ss.lastSys = sv, sv
		byName := make(map[string]Entry, len(found))
		for _, e := range found {
			byName[e.Resource.GetName()] = e
		}
		for _, name := range names {
			e, ok := byName[name]
			upserts, removed = ss.decide(name, e, ok, upserts, removed)
		}
	}
	ss.resetDirty()
	first := ss.state.phase == phaseFirst
	if len(upserts) == 0 && len(removed) == 0 && !first {
		return false, nil
	}
	budget := ss.rate.budget()
	n, cost := fit(upserts, budget)
	if n < len(upserts) {
		if first && len(removed) > 0 {
			// The agent holds back a first Delta after (re)connect that
			// removes most of its Services (dataplane/client removal.go).
			// Splitting would defer the removals past the first Delta and
			// so past that guard: a first Delta with removals goes whole.
			// A cold start (nothing removed) is split like any burst.
			for _, e := range upserts[n:] {
				cost += ResourceCost(e.Resource)
			}
		} else {
			for _, e := range upserts[n:] {
				ss.dirty[e.Resource.GetName()] = struct{}{}
			}
			for _, name := range removed {
				ss.dirty[name] = struct{}{}
			}
			upserts, removed = upserts[:n], nil
		}
	}
	ss.queue(upserts, removed, sysVersion, cost, budget)
	return true, ss.enter(evDeltaQueued)
}

// resetDirty empties the pending names. A Go map keeps the capacity it
// once grew to, and iterating or clearing it costs that capacity: after a
// cold start or a burst left a node's every name pending, each later
// Delta of one name would pay for all of them. A fresh map costs what it
// holds.
func (ss *session) resetDirty() { ss.dirty = map[string]struct{}{} }

// nodeUnknown handles a node absent from the Source: nothing is sent or
// removed (fail-static) and the pending names are dropped; the node's
// appearance gets a full diff (phaseUnknown).
func (ss *session) nodeUnknown() error {
	ss.resetDirty()
	return ss.enter(evNodeAbsent)
}

// resumed settles a Hello that gave a system version instead of versions
// (phaseResolve): if it is the node's, the agent holds exactly res (sent
// becomes res, and the first Delta is empty); if not, a VersionsRequest
// goes out and resumed reports false.
func (ss *session) resumed(res []Entry, sv string) (bool, error) {
	claim := ss.state.claim
	if claim.systemVersion == sv && int(claim.count) == len(res) {
		ss.st.mu.Lock()
		if ss.st.sent.Len() == 0 { // as after a Hello without versions
			ss.st.sent = versionSetOf(res) // shares the store's strings
		} else {
			for _, e := range res {
				ss.st.sent.Set(e.Resource.GetName(), e.Resource.GetVersion(), true)
			}
		}
		ss.st.mu.Unlock()
		ss.log.Info("agent resumed by system version: it holds the node's desired state",
			zap.String("systemVersion", sv), zap.Int("resources", len(res)))
		return true, ss.enter(evClaimMatches)
	}
	ss.log.Info("agent's system version is not the node's; asking for its versions",
		zap.String("agentSystemVersion", claim.systemVersion), zap.Uint32("agentResources", claim.count),
		zap.String("systemVersion", sv), zap.Int("resources", len(res)))
	return false, ss.enter(evClaimDiffers)
}

// decide appends name to upserts or removed if the agent needs it: desired
// (found, as e) with a version other than the one sent and not a NACKed
// one, or not desired but held by the agent.
func (ss *session) decide(name string, e Entry, found bool,
	upserts []Entry, removed []string) ([]Entry, []string) {
	if found {
		v := e.Resource.GetVersion()
		if sv, ok := ss.st.sent.Get(name); ok && sv == v {
			return upserts, removed
		}
		if nv, ok := ss.st.nacked[name]; ok && nv.version == v {
			return upserts, removed
		}
		return append(upserts, e), removed
	}
	if _, held := ss.st.sent.Get(name); held {
		removed = append(removed, name)
	}
	return upserts, removed
}

// queue records a Delta as in flight and hands it to the sender goroutine.
// The trigger times are the ones read with the resources (Entry), so they
// are never a newer version's. cost and budget are for the log only.
func (ss *session) queue(entries []Entry, removed []string, sysVersion string, cost, budget int) {
	ss.nonce++
	upserts := snapshot.Resources(entries)
	d := &inflightDelta{
		nonce:   strconv.FormatUint(ss.nonce, 10),
		upserts: upserts,
		removed: removed,
	}
	delta := &vsplanev1.Delta{
		Nonce:         d.nonce,
		SystemVersion: sysVersion,
		Resources:     upserts, // shared, immutable resources: never modified here
		Removed:       removed,
	}
	for i, e := range entries {
		if e.Trigger.IsZero() {
			continue
		}
		if d.triggers == nil {
			d.triggers = make([]int64, len(upserts))
		}
		d.triggers[i] = e.Trigger.UnixNano()
		if delta.TriggerTimes == nil {
			delta.TriggerTimes = map[string]*timestamppb.Timestamp{}
		}
		delta.TriggerTimes[e.Resource.GetName()] = timestamppb.New(e.Trigger)
	}
	d.sentAt = ss.s.opts.Clock.Now()
	// Never blocks: the queue's capacity is MaxInFlight and every queued
	// Delta is in flight.
	ss.sendq <- &vsplanev1.ConnectResponse{Message: &vsplanev1.ConnectResponse_Delta{Delta: delta}}
	ss.st.mu.Lock()
	for _, r := range upserts {
		ss.st.setSent(r.GetName(), r.GetVersion(), true)
	}
	for _, name := range removed {
		ss.st.setSent(name, "", false)
		delete(ss.st.nacked, name)
	}
	ss.st.mu.Unlock()
	ss.inflight = append(ss.inflight, d)
	ss.log.Debug("sent delta", zap.String("nonce", d.nonce), zap.Int("resources", len(upserts)),
		zap.Int("removed", len(removed)), zap.Int("cost", cost), zap.Int("budget", budget),
		zap.Int("pending", len(ss.dirty)))
	if h := ss.s.hooks.OnDeltaSent; h != nil {
		h(ss.node, delta)
	}
}
