package stream

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// inflightDelta is a Delta sent but not yet answered.
type inflightDelta struct {
	nonce string
	// upserts are the Delta's resources (its own slice, shared: names are
	// unique within a Delta).
	upserts []*vsplanev1.Resource
	removed []string
	sentAt  time.Time
	// triggers[i] is upserts[i]'s trigger time (unix nanoseconds, 0:
	// none); nil when none has one. A slice, not a map: a fleet's cold
	// start holds two Deltas in flight per agent.
	triggers []int64
}

// triggerTimes returns the Delta's trigger times by name (AckEvent).
func (d *inflightDelta) triggerTimes() map[string]time.Time {
	out := map[string]time.Time{}
	for i, ns := range d.triggers {
		if ns != 0 {
			out[d.upserts[i].GetName()] = time.Unix(0, ns)
		}
	}
	return out
}

type recvResult struct {
	msg *vsplanev1.ConnectRequest
	err error
}

// session is one accepted stream. Everything except st (shared with the
// Registry under st.mu) is owned by the run goroutine.
type session struct {
	s    *Server
	log  *zap.Logger
	node string
	st   *agentState
	sub  Subscription
	// sendq feeds the sender goroutine (capacity MaxInFlight).
	sendq chan *vsplanev1.ConnectResponse

	// state is the stream's phase (phase.go).
	state sessionState
	// dirty holds the names changed since they were last read (the
	// subscription's, and those a bounded Delta left out); the agent's
	// NACKed versions are st.nacked.
	dirty    map[string]struct{}
	nonce    uint64
	inflight []*inflightDelta
	// rate sizes Deltas from this agent's Acks.
	rate *applyRate
	// lastSys is the node's system version at the last List or Lookup.
	lastSys string
}

// accept reads and validates the Hello, checks it against the stream's
// credentials, registers the agent and subscribes.
func (s *Server) accept(stream vsplanev1.AgentService_ConnectServer) (*session, error) {
	var authNode string
	if s.opts.Authenticate != nil {
		n, err := s.opts.Authenticate(stream.Context())
		if err != nil {
			return nil, err
		}
		authNode = n
	}
	// Announced on every stream, with its first message: an agent may
	// resume its next stream by system version (agent.proto).
	if err := stream.SetHeader(metadata.Pairs(wire.ResumeBySystemVersionHeader, "1")); err != nil {
		return nil, err
	}
	first, err := s.recvHello(stream)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, invalid("stream closed before Hello")
		}
		return nil, err
	}
	hello := first.GetHello()
	if hello == nil {
		return nil, invalid("first message must be Hello, got %s", describe(first))
	}
	if err := checkHello(hello); err != nil {
		return nil, err
	}
	node := hello.GetNodeName()
	if s.opts.Authenticate != nil && node != authNode {
		return nil, closeErr(ReasonPermissionDenied, codes.PermissionDenied,
			"Hello names node %q but the credentials belong to node %q", node, authNode)
	}
	peerAddr := ""
	if p, ok := peer.FromContext(stream.Context()); ok && p.Addr != nil {
		peerAddr = p.Addr.String()
	}
	// The Hello's versions become the session's set (versionset.go), which
	// keeps the Hello's strings and lets its map go.
	held := hello.GetResourceVersions()
	if held == nil {
		held = map[string]string{}
	}
	delete(held, "") // cannot be upserted or removed by name; ignore
	heldCount := len(held)
	if hello.GetHeldSystemVersion() != "" {
		heldCount = int(hello.GetHeldCount())
	}
	st := &agentState{
		replaced:       make(chan struct{}),
		node:           node,
		agentVersion:   hello.GetAgentVersion(),
		peer:           peerAddr,
		connectedSince: s.opts.Clock.Now(),
		capabilities:   hello.GetCapabilities(),
		sent:           newVersionSet(held), // acknowledged too: ackDiff is empty
		nacked:         map[string]nackedVersion{},
	}
	log := s.log.With(zap.String("node", node), zap.String("peer", peerAddr))
	// Subscribe before the first List (contract), and before registering so
	// inspection never shows an agent whose changes are not tracked.
	sub := s.src.Subscribe(node)
	replaced := s.reg.register(st)
	log.Info("agent connected", zap.String("agentVersion", st.agentVersion),
		zap.Int("heldResources", heldCount), zap.String("heldSystemVersion", hello.GetHeldSystemVersion()),
		zap.Bool("replacedOlderStream", replaced))
	if s.hooks.OnConnect != nil {
		s.hooks.OnConnect(ConnectEvent{Node: node, AgentVersion: st.agentVersion, Peer: peerAddr,
			HeldResources: heldCount, HeldSystemVersion: hello.GetHeldSystemVersion(), Replaced: replaced})
	}
	return &session{
		s: s, log: log, node: node, st: st, sub: sub,
		sendq: make(chan *vsplanev1.ConnectResponse, s.opts.MaxInFlight),
		dirty: map[string]struct{}{},
		state: sessionState{phase: phaseWaitReady,
			claim: resumeClaim{systemVersion: hello.GetHeldSystemVersion(), count: hello.GetHeldCount()}},
		rate: newApplyRate(s.opts.TargetApplyTime, s.opts.MinDeltaOps, s.opts.MaxDeltaOps),
	}, nil
}

// recvHello waits at most HelloTimeout for the first message, so a peer that
// connects and never speaks does not hold a handler forever.
func (s *Server) recvHello(stream vsplanev1.AgentService_ConnectServer) (*vsplanev1.ConnectRequest, error) {
	type result struct {
		m   *vsplanev1.ConnectRequest
		err error
	}
	ch := make(chan result, 1) // buffered: the goroutine never blocks after a timeout
	go func() {
		m, err := stream.Recv()
		ch <- result{m, err}
	}()
	t := s.opts.Clock.NewTimer(s.opts.HelloTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-t.C():
		// Returning ends the RPC, which makes the pending Recv return.
		return nil, closeErr(ReasonHelloTimeout, codes.InvalidArgument, "no Hello within %v", s.opts.HelloTimeout)
	case <-s.shutdown:
		return nil, errShuttingDown()
	}
}

func describe(m *vsplanev1.ConnectRequest) string {
	switch m.GetMessage().(type) {
	case *vsplanev1.ConnectRequest_Ack:
		return "Ack"
	case *vsplanev1.ConnectRequest_Status:
		return "AgentStatus"
	case nil:
		return "an empty ConnectRequest"
	default:
		return fmt.Sprintf("%T", m.GetMessage())
	}
}

// run serves the stream: one loop owns the session state and never blocks
// on the network; a receiver and a sender goroutine do the I/O.
func (ss *session) run(stream vsplanev1.AgentService_ConnectServer) error {
	defer ss.sub.Close()
	defer ss.s.reg.unregister(ss.st)
	defer ss.leave()

	done := make(chan struct{})
	defer close(done)
	recv := make(chan recvResult)
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case recv <- recvResult{m, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	sendErr := make(chan error, 1)
	go func() {
		for {
			select {
			case m := <-ss.sendq:
				enc, err := ss.s.wire.encode(m)
				if err != nil {
					sendErr <- status.Errorf(codes.Internal, "encoding a Delta: %v", err)
					return
				}
				// Blocks while the agent does not read (gRPC flow control);
				// returning from the handler unblocks it.
				if err := stream.SendMsg(enc); err != nil {
					sendErr <- err
					return
				}
			case <-done:
				return
			}
		}
	}()

	ctx := stream.Context()
	ready := ss.s.opts.Ready
	if ready != nil {
		select {
		case <-ready:
			ready = nil
		default:
			ss.log.Info("holding the agent until this replica has computed its first full state")
		}
	}
	if ready == nil {
		if err := ss.enter(evReady); err != nil {
			return err
		}
	}
	clk := ss.s.opts.Clock
	timer := clk.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ss.noteInSync()
		if err := ss.maybeSend(); err != nil {
			ss.log.Warn("closing agent stream", zap.Error(err))
			return err
		}
		deadline, reason := ss.deadline()
		resetTimer(timer, deadline, clk.Now())
		select {
		case <-ctx.Done():
			ss.log.Info("agent stream ended", zap.Error(ctx.Err()))
			return status.FromContextError(ctx.Err()).Err()
		case <-ss.s.shutdown:
			ss.log.Info("closing agent stream: shutting down")
			return errShuttingDown()
		case <-ss.st.replaced:
			ss.log.Info("agent stream replaced by a newer one")
			return closeErr(ReasonReplaced, codes.Aborted, "stream replaced by a newer stream for node %q", ss.node)
		case <-ready:
			ready = nil
			if err := ss.enter(evReady); err != nil {
				return err
			}
		case <-ss.sub.C():
			for _, n := range ss.sub.Drain() {
				ss.dirty[n] = struct{}{}
			}
		case err := <-sendErr:
			ss.log.Info("sending delta failed", zap.Error(err))
			return err
		case r := <-recv:
			if r.err != nil {
				if errors.Is(r.err, io.EOF) {
					ss.log.Info("agent closed stream")
					return nil
				}
				ss.log.Info("agent stream receive failed", zap.Error(r.err))
				return r.err
			}
			if err := ss.handle(r.msg); err != nil {
				ss.log.Warn("protocol error, closing stream", zap.Error(err))
				return err
			}
		case <-timer.C():
			if !deadline.IsZero() && !clk.Now().Before(deadline) {
				err := reason()
				ss.log.Warn("closing agent stream", zap.Error(err))
				return err
			}
		}
	}
}

// deadline is the earliest time the stream must end by itself (the oldest
// in-flight Delta's Ack timeout, or its phase's: the HeldVersions or the
// unknown-node timeout) and the error
// to end it with; zero if none.
func (ss *session) deadline() (time.Time, func() error) {
	var at time.Time
	var why func() error
	if len(ss.inflight) > 0 {
		d := ss.inflight[0]
		at = d.sentAt.Add(ss.s.opts.AckTimeout)
		why = func() error {
			return closeErr(ReasonAckTimeout, codes.DeadlineExceeded,
				"no Ack for Delta %s (%d resources, %d removals) within %v", d.nonce, len(d.upserts), len(d.removed), ss.s.opts.AckTimeout)
		}
	}
	switch ss.state.phase {
	case phaseVersions:
		if v := ss.state.since.Add(ss.s.opts.HelloTimeout); at.IsZero() || v.Before(at) {
			at = v
			why = func() error {
				return closeErr(ReasonHelloTimeout, codes.InvalidArgument,
					"no HeldVersions within %v of the VersionsRequest", ss.s.opts.HelloTimeout)
			}
		}
	case phaseUnknown:
		if u := ss.state.since.Add(ss.s.opts.UnknownNodeTimeout); at.IsZero() || u.Before(at) {
			at = u
			why = func() error {
				return closeErr(ReasonUnknownNode, codes.FailedPrecondition,
					"node %q has not been in the cluster for %v (no Node object)", ss.node, ss.s.opts.UnknownNodeTimeout)
			}
		}
	}
	return at, why
}

// resetTimer makes t fire at deadline (or not at all for a zero deadline);
// now is the time on t's clock.
func resetTimer(t clock.Timer, deadline, now time.Time) {
	t.Stop()
	if deadline.IsZero() {
		return
	}
	t.Reset(max(deadline.Sub(now), 0))
}

func (ss *session) handle(m *vsplanev1.ConnectRequest) error {
	switch msg := m.GetMessage().(type) {
	case *vsplanev1.ConnectRequest_Ack:
		return ss.handleAck(msg.Ack)
	case *vsplanev1.ConnectRequest_Status:
		if err := checkStatus(msg.Status); err != nil {
			return err
		}
		ss.st.mu.Lock()
		ss.st.lastStatus = msg.Status
		// A NACKed version the agent's retry has since applied is
		// acknowledged now; no Ack would ever say so.
		var healed []string
		for name, v := range msg.Status.GetRecovered() {
			if nv, ok := ss.st.nacked[name]; ok && nv.version == v {
				delete(ss.st.nacked, name)
				ss.st.setAcked(name, v, true)
				healed = append(healed, name)
			}
		}
		if len(healed) > 0 {
			ss.ackedChanged()
		}
		ss.st.mu.Unlock()
		if len(healed) > 0 {
			slices.Sort(healed)
			ss.log.Info("agent recovered NACKed resources by retrying", zap.Strings("resources", healed))
		}
		return nil
	case *vsplanev1.ConnectRequest_HeldVersions:
		return ss.handleHeldVersions(msg.HeldVersions)
	case *vsplanev1.ConnectRequest_Hello:
		return invalid("Hello sent twice on one stream")
	default:
		return invalid("ConnectRequest without a message")
	}
}

// handleHeldVersions takes the agent's answer to a VersionsRequest as what
// it holds, as a full Hello would have said; the first Delta follows.
func (ss *session) handleHeldVersions(hv *vsplanev1.HeldVersions) error {
	if err := ss.enter(evHeldVersions); err != nil {
		return err
	}
	held := hv.GetResourceVersions()
	if err := checkVersions("HeldVersions.resource_versions", held); err != nil {
		return err
	}
	if held == nil {
		held = map[string]string{}
	}
	delete(held, "")
	ss.st.mu.Lock()
	ss.st.sent = newVersionSet(held) // acknowledged too: nothing was sent, ackDiff is empty
	ss.st.mu.Unlock()
	ss.log.Info("agent listed the versions it holds", zap.Int("heldResources", len(held)))
	return nil
}

func (ss *session) handleAck(ack *vsplanev1.Ack) error {
	now := ss.s.opts.Clock.Now()
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK && ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		return invalid("Ack for nonce %q has status %v; want ACK or NACK", ack.GetNonce(), ack.GetStatus())
	}
	idx := slices.IndexFunc(ss.inflight, func(d *inflightDelta) bool { return d.nonce == ack.GetNonce() })
	if idx < 0 {
		// Stale/duplicate: harmless to ignore; the in-flight Delta still awaits its own Ack.
		ss.log.Warn("ignoring Ack with unknown nonce", zap.String("nonce", ack.GetNonce()))
		return nil
	}
	d := ss.inflight[idx]
	if err := checkAck(ack, d); err != nil {
		return err
	}
	ss.inflight = slices.Delete(ss.inflight, idx, idx+1)
	ss.rate.observe(kernelOps(ack), ack.GetApplyDuration().AsDuration())

	failed := map[string]*vsplanev1.ResourceError{}
	unnamed := false
	for _, e := range ack.GetErrors() {
		if e.GetName() == "" {
			unnamed = true
			continue
		}
		failed[e.GetName()] = e
	}
	// A NACK without per-resource errors, or with an error naming no resource,
	// fails the whole Delta: nothing counted as acknowledged, nothing resent.
	allFailed := ack.GetStatus() == vsplanev1.AckStatus_ACK_STATUS_NACK && (len(failed) == 0 || unnamed)

	ss.st.mu.Lock()
	ss.ackedChanged()
	for _, r := range d.upserts {
		name, v := r.GetName(), r.GetVersion()
		if e, bad := failed[name]; bad || allFailed {
			msg := "NACK without a message for this resource"
			if bad {
				msg = e.GetMessage()
			}
			ss.st.nacked[name] = nackedVersion{version: v, message: msg}
			continue
		}
		ss.st.setAcked(name, v, true)
		delete(ss.st.nacked, name)
	}
	for _, name := range d.removed {
		if _, bad := failed[name]; bad || allFailed {
			continue
		}
		ss.st.setAcked(name, "", false)
	}
	nacked := ack.GetStatus() == vsplanev1.AckStatus_ACK_STATUS_NACK
	var summary string
	if nacked {
		summary = nackSummary(ack.GetErrors())
		ss.st.nacks++
		ss.st.lastNackError = summary
	}
	ss.st.lastAck = now
	ss.st.lastApply = ack.GetApplyDuration().AsDuration()
	ss.st.lastOps = maps.Clone(ack.GetKernelOperations())
	ss.st.mu.Unlock()

	if nacked {
		ss.log.Warn("agent NACKed delta", zap.String("nonce", d.nonce), zap.String("errors", summary))
	} else {
		ss.log.Debug("agent ACKed delta", zap.String("nonce", d.nonce))
	}
	if h := ss.s.hooks.OnAck; h != nil {
		h(AckEvent{
			Node: ss.node, Nonce: d.nonce, Status: ack.GetStatus(),
			ApplyDuration: ack.GetApplyDuration().AsDuration(),
			SentAt:        d.sentAt, ReceivedAt: now, TriggerTimes: d.triggerTimes(),
			Resources: len(d.upserts), Removed: len(d.removed),
			Errors: ack.GetErrors(), KernelOperations: ack.GetKernelOperations(),
		})
	}
	return nil
}

// noteInSync records in st.inSyncAt that the agent holds exactly the
// node's desired state as of system version lastSys, when that is known:
// every Delta sent is acknowledged, no NACKed version is outstanding,
// nothing is pending (the subscription is drained first: a change already
// in lastSys is in the pending set or drained by then, since a commit
// notifies before readers see it) and the acknowledged names are the ones
// sent (a NACKed removal leaves one behind). Inspection and the metrics
// then answer "pending" by comparing lastSys with the node's current
// version instead of comparing every resource (Registry). The record
// holds until the acknowledged state changes (ackedChanged). Only a
// streaming stream can be in sync.
func (ss *session) noteInSync() {
	if ss.st.inSyncAt != "" || ss.state.phase != phaseStreaming || len(ss.inflight) > 0 || len(ss.st.nacked) > 0 || len(ss.dirty) > 0 {
		return
	}
	for _, n := range ss.sub.Drain() {
		ss.dirty[n] = struct{}{}
	}
	if len(ss.dirty) > 0 {
		return // maybeSend sends them
	}
	ss.st.mu.Lock()
	if len(ss.st.ackDiff) == 0 {
		ss.st.inSyncAt = ss.lastSys
	}
	ss.st.mu.Unlock()
}

// ackedChanged forgets the in-sync record; st.mu is held.
func (ss *session) ackedChanged() {
	ss.st.inSyncAt = ""
}

func nackSummary(errs []*vsplanev1.ResourceError) string {
	if len(errs) == 0 {
		return "NACK without resource errors"
	}
	const maxShown = 3
	parts := make([]string, 0, maxShown+1)
	for i, e := range errs {
		if i == maxShown {
			parts = append(parts, fmt.Sprintf("and %d more", len(errs)-maxShown))
			break
		}
		if e.GetName() == "" {
			parts = append(parts, e.GetMessage())
			continue
		}
		parts = append(parts, fmt.Sprintf("%s@%s: %s", e.GetName(), e.GetVersion(), e.GetMessage()))
	}
	return strings.Join(parts, "; ")
}
