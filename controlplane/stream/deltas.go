package stream

import (
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// maybeSend queues the next Deltas while flow control allows and there is
// something to send (or the first Delta is still due). It never blocks: at
// most MaxInFlight Deltas are queued or in gRPC, and the queue holds that
// many.
func (ss *session) maybeSend() error {
	if !ss.versionsAsked.IsZero() {
		return nil // nothing goes out before the agent says what it holds
	}
	for len(ss.inflight) < ss.s.opts.MaxInFlight && (ss.needFull || len(ss.dirty) > 0) {
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
	var upserts []*vsplanev1.Resource
	var removed []string
	var sysVersion string
	full := ss.needFull
	if full {
		// First Delta, or the node (re)appeared: compare everything desired
		// with everything the agent holds.
		res, sv, ok := ss.s.src.List(ss.node)
		if !ok {
			return false, ss.nodeUnknown()
		}
		ss.nodeKnown()
		if ss.resume != "" && !ss.resumed(res, sv) {
			return false, nil // asked for the agent's versions instead
		}
		sysVersion, ss.lastSys = sv, sv
		set := make(map[string]struct{}, len(res)+len(ss.st.sent))
		for _, r := range res {
			set[r.GetName()] = struct{}{}
		}
		for n := range ss.st.sent {
			set[n] = struct{}{}
		}
		for _, name := range slices.Sorted(maps.Keys(set)) {
			i, found := sort.Find(len(res), func(i int) int { return strings.Compare(name, res[i].GetName()) })
			var r *vsplanev1.Resource
			if found {
				r = res[i]
			}
			upserts, removed = ss.decide(name, r, found, upserts, removed)
		}
	} else {
		// Incremental: O(pending names), one consistent read.
		names := slices.Sorted(maps.Keys(ss.dirty))
		found, sv, ok := ss.s.src.Lookup(ss.node, names)
		if !ok {
			return false, ss.nodeUnknown()
		}
		sysVersion, ss.lastSys = sv, sv
		byName := make(map[string]*vsplanev1.Resource, len(found))
		for _, r := range found {
			byName[r.GetName()] = r
		}
		for _, name := range names {
			r, ok := byName[name]
			upserts, removed = ss.decide(name, r, ok, upserts, removed)
		}
	}
	ss.resetDirty()
	ss.needFull = false
	if len(upserts) == 0 && len(removed) == 0 && ss.firstSent {
		return false, nil
	}
	budget := ss.rate.budget()
	n, cost := fit(upserts, budget)
	if n < len(upserts) {
		if full && !ss.firstSent && len(removed) > 0 {
			// The agent holds back a first Delta after (re)connect that
			// removes most of its Services (dataplane/client removal.go).
			// Splitting would defer the removals past the first Delta and
			// so past that guard: a first Delta with removals goes whole.
			// A cold start (nothing removed) is split like any burst.
			for _, r := range upserts[n:] {
				cost += ResourceCost(r)
			}
		} else {
			for _, r := range upserts[n:] {
				ss.dirty[r.GetName()] = struct{}{}
			}
			for _, name := range removed {
				ss.dirty[name] = struct{}{}
			}
			upserts, removed = upserts[:n], nil
		}
	}
	ss.queue(upserts, removed, sysVersion, cost, budget)
	return true, nil
}

// resetDirty empties the pending names. A Go map keeps the capacity it
// once grew to, and iterating or clearing it costs that capacity: after a
// cold start or a burst left a node's every name pending, each later
// Delta of one name would pay for all of them. A fresh map costs what it
// holds.
func (ss *session) resetDirty() { ss.dirty = map[string]struct{}{} }

// nodeUnknown handles a node absent from the Source: nothing is sent or
// removed (fail-static); the next appearance gets a full diff. A stream
// waits for its node at most UnknownNodeTimeout, and at most
// MaxUnknownNodeStreams streams wait at once.
func (ss *session) nodeUnknown() error {
	if ss.known {
		ss.log.Warn("node disappeared from the desired state; keeping the agent's state")
	} else if ss.unknownSince.IsZero() {
		ss.log.Info("node not in the desired state (no Node object); waiting for it to appear",
			zap.Duration("timeout", ss.s.opts.UnknownNodeTimeout))
	}
	ss.known = false
	ss.needFull = true
	ss.resetDirty()
	if ss.unknownSince.IsZero() {
		ss.unknownSince = time.Now()
		if n := ss.s.unknown.Add(1); n > int64(ss.s.opts.MaxUnknownNodeStreams) {
			return closeErr(ReasonTooManyUnknown, codes.ResourceExhausted,
				"node %q is not in the cluster and %d streams already wait for unknown nodes", ss.node, n-1)
		}
	}
	return nil
}

// nodeKnown ends the unknown-node wait, if any.
func (ss *session) nodeKnown() {
	if !ss.known && ss.firstSent {
		ss.log.Info("node reappeared in the desired state; sending a full diff")
	}
	ss.known = true
	ss.leaveUnknown()
}

func (ss *session) leaveUnknown() {
	if !ss.unknownSince.IsZero() {
		ss.unknownSince = time.Time{}
		ss.s.unknown.Add(-1)
	}
}

// resumed settles a Hello that gave a system version instead of versions:
// if it is the node's, the agent holds exactly res (sent becomes res, and
// the first Delta is empty); if not, a VersionsRequest goes out and
// resumed reports false. Either way it happens once per stream.
func (ss *session) resumed(res []*vsplanev1.Resource, sv string) bool {
	claimed, count := ss.resume, ss.resumeCount
	ss.resume = ""
	if claimed == sv && int(count) == len(res) {
		ss.st.mu.Lock()
		for _, r := range res {
			ss.st.sent[r.GetName()] = r.GetVersion() // shares the store's strings
		}
		ss.st.mu.Unlock()
		ss.log.Info("agent resumed by system version: it holds the node's desired state",
			zap.String("systemVersion", sv), zap.Int("resources", len(res)))
		return true
	}
	ss.log.Info("agent's system version is not the node's; asking for its versions",
		zap.String("agentSystemVersion", claimed), zap.Uint32("agentResources", count),
		zap.String("systemVersion", sv), zap.Int("resources", len(res)))
	ss.versionsAsked = time.Now()
	// The queue has room: nothing is in flight before the first Delta.
	ss.sendq <- &vsplanev1.ConnectResponse{Message: &vsplanev1.ConnectResponse_VersionsRequest{VersionsRequest: &vsplanev1.VersionsRequest{}}}
	return false
}

// decide appends name to upserts or removed if the agent needs it: desired
// (found) with a version other than the one sent and not a NACKed one, or
// not desired but held by the agent.
func (ss *session) decide(name string, r *vsplanev1.Resource, found bool,
	upserts []*vsplanev1.Resource, removed []string) ([]*vsplanev1.Resource, []string) {
	if found {
		if v, ok := ss.st.sent[name]; ok && v == r.GetVersion() {
			return upserts, removed
		}
		if v, ok := ss.nacked[name]; ok && v == r.GetVersion() {
			return upserts, removed
		}
		return append(upserts, r), removed
	}
	if _, held := ss.st.sent[name]; held {
		removed = append(removed, name)
	}
	return upserts, removed
}

// queue records a Delta as in flight and hands it to the sender goroutine.
// cost and budget are for the log only.
func (ss *session) queue(upserts []*vsplanev1.Resource, removed []string, sysVersion string, cost, budget int) {
	ss.nonce++
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
	for i, r := range upserts {
		if t := ss.s.src.TriggerTime(ss.node, r.GetName()); !t.IsZero() {
			if d.triggers == nil {
				d.triggers = make([]int64, len(upserts))
			}
			d.triggers[i] = t.UnixNano()
			if delta.TriggerTimes == nil {
				delta.TriggerTimes = map[string]*timestamppb.Timestamp{}
			}
			delta.TriggerTimes[r.GetName()] = timestamppb.New(t)
		}
	}
	d.sentAt = time.Now()
	// Never blocks: the queue's capacity is MaxInFlight and every queued
	// Delta is in flight.
	ss.sendq <- &vsplanev1.ConnectResponse{Message: &vsplanev1.ConnectResponse_Delta{Delta: delta}}
	ss.st.mu.Lock()
	for _, r := range upserts {
		ss.st.setSent(r.GetName(), r.GetVersion(), true)
	}
	for _, name := range removed {
		ss.st.setSent(name, "", false)
		delete(ss.nacked, name)
		delete(ss.st.nackErrs, name)
	}
	ss.st.mu.Unlock()
	ss.inflight = append(ss.inflight, d)
	ss.firstSent = true
	ss.log.Debug("sent delta", zap.String("nonce", d.nonce), zap.Int("resources", len(upserts)),
		zap.Int("removed", len(removed)), zap.Int("cost", cost), zap.Int("budget", budget),
		zap.Int("pending", len(ss.dirty)))
	if h := ss.s.hooks.OnDeltaSent; h != nil {
		h(ss.node, delta)
	}
}
