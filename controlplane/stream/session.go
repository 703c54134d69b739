package stream

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// inflightDelta is a Delta sent but not yet answered.
type inflightDelta struct {
	nonce    string
	upserts  map[string]string // name -> version sent
	removed  []string
	sentAt   time.Time
	triggers map[string]time.Time
}

type recvResult struct {
	msg *vsplanev1.ConnectRequest
	err error
}

// session is one accepted stream. Everything except st (shared with the
// Registry under st.mu) is owned by the run goroutine.
type session struct {
	s      *Server
	stream vsplanev1.AgentService_ConnectServer
	log    *zap.Logger
	node   string
	st     *agentState
	sub    Subscription

	// sent is what the agent holds or will hold once in-flight Deltas apply:
	// name -> version (seeded from Hello).
	sent map[string]string
	// nacked is name -> version the agent NACKed; not resent until changed.
	nacked map[string]string
	dirty  map[string]struct{}
	// needFull: next Delta compares every desired and every sent name
	// (first Delta, and after the node (re)appears in the Source).
	needFull bool
	// firstSent: the first Delta (possibly empty) went out.
	firstSent bool
	known     bool
	nonce     uint64
	inflight  []*inflightDelta
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// accept reads and validates the Hello, registers the agent and subscribes.
func (s *Server) accept(stream vsplanev1.AgentService_ConnectServer) (*session, error) {
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
	node := hello.GetNodeName()
	if strings.TrimSpace(node) == "" {
		return nil, invalid("Hello.node_name must not be empty")
	}
	peerAddr := ""
	if p, ok := peer.FromContext(stream.Context()); ok && p.Addr != nil {
		peerAddr = p.Addr.String()
	}
	held := make(map[string]string, len(hello.GetResourceVersions()))
	for name, v := range hello.GetResourceVersions() {
		if name == "" {
			continue // cannot be upserted or removed by name; ignore
		}
		held[name] = v
	}
	st := &agentState{
		replaced:       make(chan struct{}),
		node:           node,
		agentVersion:   hello.GetAgentVersion(),
		peer:           peerAddr,
		connectedSince: time.Now(),
		capabilities:   hello.GetCapabilities(),
		acked:          maps.Clone(held),
	}
	log := s.log.With(zap.String("node", node), zap.String("peer", peerAddr))
	// Subscribe before the first List (contract), and before registering so
	// inspection never shows an agent whose changes are not tracked.
	sub := s.src.Subscribe(node)
	replaced := s.reg.register(st)
	log.Info("agent connected", zap.String("agentVersion", st.agentVersion),
		zap.Int("heldResources", len(held)), zap.Bool("replacedOlderStream", replaced))
	if s.hooks.OnConnect != nil {
		s.hooks.OnConnect(ConnectEvent{Node: node, AgentVersion: st.agentVersion, Peer: peerAddr,
			HeldResources: len(held), Replaced: replaced})
	}
	return &session{
		s: s, stream: stream, log: log, node: node, st: st, sub: sub,
		sent: held, nacked: map[string]string{}, dirty: map[string]struct{}{},
		needFull: true,
	}, nil
}

// recvHello waits at most helloTimeout for the first message, so a peer that
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
	t := time.NewTimer(s.helloTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-t.C:
		// Returning ends the RPC, which makes the pending Recv return.
		return nil, invalid("no Hello within %v", s.helloTimeout)
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

func (ss *session) run() error {
	defer ss.sub.Close()
	defer ss.s.reg.unregister(ss.st)

	done := make(chan struct{})
	defer close(done)
	recv := make(chan recvResult)
	go func() {
		for {
			m, err := ss.stream.Recv()
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

	ctx := ss.stream.Context()
	if err := ss.maybeSend(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			ss.log.Info("agent stream ended", zap.Error(ctx.Err()))
			return status.FromContextError(ctx.Err()).Err()
		case <-ss.s.shutdown:
			ss.log.Info("closing agent stream: shutting down")
			return errShuttingDown()
		case <-ss.st.replaced:
			ss.log.Info("agent stream replaced by a newer one")
			return status.Errorf(codes.Aborted, "stream replaced by a newer stream for node %q", ss.node)
		case <-ss.sub.C():
			for _, n := range ss.sub.Drain() {
				ss.dirty[n] = struct{}{}
			}
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
		}
		if err := ss.maybeSend(); err != nil {
			return err
		}
	}
}

func (ss *session) handle(m *vsplanev1.ConnectRequest) error {
	switch msg := m.GetMessage().(type) {
	case *vsplanev1.ConnectRequest_Ack:
		return ss.handleAck(msg.Ack)
	case *vsplanev1.ConnectRequest_Status:
		ss.st.mu.Lock()
		ss.st.lastStatus = msg.Status
		// A NACKed version the agent's retry has since applied is
		// acknowledged now; no Ack would ever say so.
		var healed []string
		for name, v := range msg.Status.GetRecovered() {
			if nv, ok := ss.nacked[name]; ok && nv == v {
				delete(ss.nacked, name)
				ss.st.acked[name] = v
				healed = append(healed, name)
			}
		}
		ss.st.mu.Unlock()
		if len(healed) > 0 {
			slices.Sort(healed)
			ss.log.Info("agent recovered NACKed resources by retrying", zap.Strings("resources", healed))
		}
		return nil
	case *vsplanev1.ConnectRequest_Hello:
		return invalid("Hello sent twice on one stream")
	default:
		return invalid("ConnectRequest without a message")
	}
}

func (ss *session) handleAck(ack *vsplanev1.Ack) error {
	now := time.Now()
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
	ss.inflight = slices.Delete(ss.inflight, idx, idx+1)

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
	for name, v := range d.upserts {
		if _, bad := failed[name]; bad || allFailed {
			ss.nacked[name] = v
			continue
		}
		ss.st.acked[name] = v
		delete(ss.nacked, name)
	}
	for _, name := range d.removed {
		if _, bad := failed[name]; bad || allFailed {
			continue
		}
		delete(ss.st.acked, name)
	}
	if ack.GetStatus() == vsplanev1.AckStatus_ACK_STATUS_NACK {
		ss.st.nacks++
		ss.st.lastNackError = nackSummary(ack.GetErrors())
	}
	ss.st.lastAck = now
	ss.st.lastApply = ack.GetApplyDuration().AsDuration()
	ss.st.lastOps = maps.Clone(ack.GetKernelOperations())
	ss.st.mu.Unlock()

	if ack.GetStatus() == vsplanev1.AckStatus_ACK_STATUS_NACK {
		ss.log.Warn("agent NACKed delta", zap.String("nonce", d.nonce),
			zap.String("errors", nackSummary(ack.GetErrors())))
	} else {
		ss.log.Debug("agent ACKed delta", zap.String("nonce", d.nonce))
	}
	if h := ss.s.hooks.OnAck; h != nil {
		h(AckEvent{
			Node: ss.node, Nonce: d.nonce, Status: ack.GetStatus(),
			ApplyDuration: ack.GetApplyDuration().AsDuration(),
			SentAt:        d.sentAt, ReceivedAt: now, TriggerTimes: d.triggers,
			Resources: len(d.upserts), Removed: len(d.removed),
			Errors: ack.GetErrors(), KernelOperations: ack.GetKernelOperations(),
		})
	}
	return nil
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

// maybeSend computes and sends the next Delta if flow control allows and
// there is something to send (or the first Delta is still due).
func (ss *session) maybeSend() error {
	if len(ss.inflight) >= ss.s.maxInFlight {
		return nil // coalesce: dirty keeps growing until an Ack frees a slot
	}
	if !ss.needFull && len(ss.dirty) == 0 {
		return nil
	}
	if svr, ok := ss.s.src.(SystemVersioner); ok && !ss.needFull {
		// Incremental: O(dirty names).
		sysVersion, known := svr.SystemVersion(ss.node)
		if !known {
			ss.nodeUnknown()
			return nil
		}
		names := slices.Sorted(maps.Keys(ss.dirty))
		clear(ss.dirty)
		var upserts []*vsplanev1.Resource
		var removed []string
		for _, name := range names {
			r, found := ss.s.src.Get(ss.node, name)
			upserts, removed = ss.decide(name, r, found, upserts, removed)
		}
		// Gets are not atomic with SystemVersion: if the node vanished
		// meanwhile, its "removals" must not reach the agent (fail-static).
		if _, still := svr.SystemVersion(ss.node); !still {
			ss.nodeUnknown()
			return nil
		}
		return ss.maybeSendDelta(upserts, removed, sysVersion)
	}

	res, sysVersion, ok := ss.s.src.List(ss.node)
	if !ok {
		ss.nodeUnknown()
		return nil
	}
	if !ss.known && ss.firstSent {
		ss.log.Info("node reappeared in the desired state; sending a full diff")
	}
	ss.known = true

	var names []string
	if ss.needFull {
		set := make(map[string]struct{}, len(res)+len(ss.sent))
		for _, r := range res {
			set[r.GetName()] = struct{}{}
		}
		for n := range ss.sent {
			set[n] = struct{}{}
		}
		names = slices.Sorted(maps.Keys(set))
	} else {
		names = slices.Sorted(maps.Keys(ss.dirty))
	}
	clear(ss.dirty)
	ss.needFull = false

	var upserts []*vsplanev1.Resource
	var removed []string
	for _, name := range names {
		i, found := sort.Find(len(res), func(i int) int { return strings.Compare(name, res[i].GetName()) })
		var r *vsplanev1.Resource
		if found {
			r = res[i]
		}
		upserts, removed = ss.decide(name, r, found, upserts, removed)
	}
	return ss.maybeSendDelta(upserts, removed, sysVersion)
}

// nodeUnknown handles a node absent from the Source: nothing is sent or
// removed (fail-static); the next appearance gets a full diff.
func (ss *session) nodeUnknown() {
	if ss.known {
		ss.log.Warn("node disappeared from the desired state; keeping the agent's state")
	} else if !ss.firstSent && ss.needFull && len(ss.dirty) == 0 {
		ss.log.Info("node not known yet; waiting for it to appear")
	}
	ss.known = false
	ss.needFull = true
	clear(ss.dirty)
}

// decide appends name to upserts or removed if the agent needs it: desired
// (found) with a version other than the one sent and not a NACKed one, or
// not desired but held by the agent.
func (ss *session) decide(name string, r *vsplanev1.Resource, found bool,
	upserts []*vsplanev1.Resource, removed []string) ([]*vsplanev1.Resource, []string) {
	if found {
		if v, ok := ss.sent[name]; ok && v == r.GetVersion() {
			return upserts, removed
		}
		if v, ok := ss.nacked[name]; ok && v == r.GetVersion() {
			return upserts, removed
		}
		return append(upserts, r), removed
	}
	if _, held := ss.sent[name]; held {
		removed = append(removed, name)
	}
	return upserts, removed
}

func (ss *session) maybeSendDelta(upserts []*vsplanev1.Resource, removed []string, sysVersion string) error {
	if len(upserts) == 0 && len(removed) == 0 && ss.firstSent {
		return nil
	}
	return ss.send(upserts, removed, sysVersion)
}

func (ss *session) send(upserts []*vsplanev1.Resource, removed []string, sysVersion string) error {
	ss.nonce++
	d := &inflightDelta{
		nonce:    strconv.FormatUint(ss.nonce, 10),
		upserts:  make(map[string]string, len(upserts)),
		removed:  removed,
		triggers: map[string]time.Time{},
	}
	delta := &vsplanev1.Delta{
		Nonce:         d.nonce,
		SystemVersion: sysVersion,
		Resources:     upserts, // shared, immutable resources: never modified here
		Removed:       removed,
	}
	for _, r := range upserts {
		d.upserts[r.GetName()] = r.GetVersion()
		if t := ss.s.src.TriggerTime(ss.node, r.GetName()); !t.IsZero() {
			d.triggers[r.GetName()] = t
			if delta.TriggerTimes == nil {
				delta.TriggerTimes = map[string]*timestamppb.Timestamp{}
			}
			delta.TriggerTimes[r.GetName()] = timestamppb.New(t)
		}
	}
	d.sentAt = time.Now()
	if err := ss.stream.Send(&vsplanev1.ConnectResponse{Message: &vsplanev1.ConnectResponse_Delta{Delta: delta}}); err != nil {
		ss.log.Info("sending delta failed", zap.Error(err))
		return err
	}
	for name, v := range d.upserts {
		ss.sent[name] = v
	}
	for _, name := range removed {
		delete(ss.sent, name)
		delete(ss.nacked, name)
	}
	ss.inflight = append(ss.inflight, d)
	ss.firstSent = true
	ss.log.Debug("sent delta", zap.String("nonce", d.nonce), zap.Int("resources", len(upserts)),
		zap.Int("removed", len(removed)))
	if h := ss.s.hooks.OnDeltaSent; h != nil {
		h(ss.node, delta)
	}
	return nil
}
