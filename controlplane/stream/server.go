// Package stream is the control plane's side of the per-node agent stream
// (vsplane.v1.AgentService/Connect).
//
// Protocol as implemented here:
//
//   - The first message must be a Hello with a non-empty node name, within
//     Options.HelloTimeout, else the stream ends with InvalidArgument. Any message without a payload, a second
//     Hello, or an Ack with status UNSPECIFIED also ends the stream with
//     InvalidArgument (a protocol bug should be loud, and the agent reconnects).
//     An Ack whose nonce is not in flight (stale or duplicate) is logged and
//     ignored.
//   - After Hello the server subscribes to the node, then sends the first Delta:
//     the resources whose desired version differs from the Hello's
//     resource_versions, plus the names the agent holds that are no longer
//     desired (removed); if that is more than one Delta's budget and removes
//     nothing, the rest follows in further Deltas (see below). This first
//     Delta is ALWAYS sent for a known node, even when it carries nothing:
//     an empty first Delta means "you are in sync".
//   - Every stream announces wire.ResumeBySystemVersionHeader in its
//     response headers. A Hello may carry held_system_version (and
//     held_count) instead of resource_versions, never both: if they equal
//     the node's system version and size, the agent holds the node's
//     desired state and the first Delta is empty; otherwise the first
//     message is a VersionsRequest, nothing else is sent until HeldVersions
//     answers it (within HelloTimeout, else InvalidArgument), and its
//     versions count as the Hello's.
//     replace_all is never set; removals are always explicit.
//   - If the node is unknown to the Source, the stream stays open and nothing
//     is sent (the agent stays fail-static) until the node appears; then a
//     full diff is sent. If a known node disappears, nothing is removed; the
//     next appearance triggers a full diff again.
//   - Afterwards every Subscription signal adds names to a dirty set. At most
//     MaxInFlight Deltas are unacknowledged; while waiting, changes coalesce.
//   - Deltas are bounded: pending work goes out in Deltas of whole
//     resources, in name order, up to a budget of estimated kernel work
//     (ResourceCost; a resource larger than the budget goes alone). The
//     budget is the agent's measured rate (Ack kernel_operations over
//     apply_duration) times TargetApplyTime, within [MinDeltaOps,
//     MaxDeltaOps]; InitialDeltaOps before any measurement. What does not
//     fit stays pending and is read again for the next Delta (a change
//     meanwhile is sent at its newest version). Removals go only with the
//     last of the pending upserts (an upsert may replace what a removal
//     takes away), so every Delta leaves the node at a prefix of a complete
//     state; removals alone go at once. The first Delta of a stream is
//     split only if it removes nothing: the agent's mass-removal guard
//     judges that Delta alone, so it must carry every removal.
//   - A name is sent when its desired version differs from the version last
//     sent on this stream (or reported in Hello). A NACKed version is
//     remembered and not resent until the desired version changes. A NACK
//     fails the resources its errors name; a NACK with no errors, or with an
//     error whose name is empty, fails every resource of its Delta.
//   - The agent retries failed resources itself. When a retry applies a
//     NACKed version, AgentStatus.recovered says so and that version counts
//     as acknowledged (it is still not resent).
//   - A new stream for a node closes the older one with Aborted.
//   - Until Options.Ready is closed nothing is sent (the replica is still
//     computing its first full state).
//   - Sending never blocks the stream's loop: a separate goroutine hands
//     Deltas to gRPC. A Delta unacknowledged for Options.AckTimeout ends the
//     stream with DeadlineExceeded; a node absent from the desired state for
//     Options.UnknownNodeTimeout ends it with FailedPrecondition.
//   - Limits (InvalidArgument when exceeded): the node name is a DNS-1123
//     subdomain; a Hello lists at most MaxHeldResources names; an Ack carries
//     at most one error per resource of its Delta (plus one) and
//     MaxKernelOperationKinds kinds; an AgentStatus at most
//     MaxStatusKernelErrors kernel errors, MaxStatusDraining draining real
//     servers and MaxHeldResources recovered versions.
package stream

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"k8s.io/utils/clock"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
	// MaxInFlight is the number of Deltas that may be unacknowledged at once;
	// 0 means DefaultMaxInFlight. With 2, the agent finds the next bounded
	// Delta waiting when it acknowledges one, instead of idling for a round
	// trip.
	MaxInFlight int
	// TargetApplyTime is how long one Delta should take an agent to apply;
	// 0 means DefaultTargetApplyTime. A node's pending work goes out in
	// Deltas of at most its agent's measured rate (kernel operations per
	// second, from its Acks) times this, in ResourceCost units, so no change
	// waits long behind a Delta in flight.
	TargetApplyTime time.Duration
	// MinDeltaOps and MaxDeltaOps clamp that budget; 0 means
	// DefaultMinDeltaOps and DefaultMaxDeltaOps. A MinDeltaOps above
	// MaxDeltaOps is lowered to it. Before its first usable Ack a stream
	// uses InitialDeltaOps.
	MinDeltaOps, MaxDeltaOps int
	// HelloTimeout bounds the wait for the first message; 0 means 30s.
	HelloTimeout time.Duration
	// AckTimeout: a Delta unacknowledged this long closes its stream with
	// DeadlineExceeded (the agent reconnects and resumes); 0 means
	// DefaultAckTimeout. It must exceed the longest legitimate apply (a cold
	// start of a large node).
	AckTimeout time.Duration
	// Ready, if set, holds every stream until it is closed: nothing is sent
	// before the replica's informers synced and its first full computation
	// was committed, so a starting replica never diffs an agent against an
	// empty or partial state. Hellos are accepted and registered meanwhile.
	Ready <-chan struct{}
	// UnknownNodeTimeout closes, with FailedPrecondition, a stream whose
	// node has not been in the desired state (no Node object) for this long
	// after Ready; 0 means DefaultUnknownNodeTimeout.
	UnknownNodeTimeout time.Duration
	// MaxUnknownNodeStreams caps the streams waiting for nodes that are not
	// in the desired state; further ones end with ResourceExhausted. 0 means
	// DefaultMaxUnknownNodeStreams.
	MaxUnknownNodeStreams int
	// Authenticate, if set, returns the node the stream's credentials name
	// (see package auth). A Hello naming any other node ends the stream with
	// PermissionDenied before anything is registered or sent; an error it
	// returns (a gRPC status, e.g. Unauthenticated) ends the stream as is.
	Authenticate func(ctx context.Context) (node string, err error)
	// Hooks observe streams (metrics).
	Hooks Hooks
	// Clock times the streams: Hello, HeldVersions, Ack and unknown-node
	// timeouts, Deltas' send times, and the lag of the agents' reports
	// (default the real clock).
	Clock clock.Clock
}

// Defaults of Options.
const (
	DefaultMaxInFlight           = 2
	DefaultAckTimeout            = 5 * time.Minute
	DefaultUnknownNodeTimeout    = 10 * time.Minute
	DefaultMaxUnknownNodeStreams = 256
)

// Server implements vsplanev1.AgentServiceServer.
type Server struct {
	vsplanev1.UnimplementedAgentServiceServer

	src   Source
	log   *zap.Logger
	opts  Options
	hooks Hooks
	reg   *Registry
	// unknown counts streams waiting for a node not in the desired state.
	unknown atomic.Int64
	// wire encodes each shared resource once for every stream (encode.go).
	wire wireCache

	shutdownOnce sync.Once
	shutdown     chan struct{}
}

// NewServer returns a Server that streams src's per-node state.
func NewServer(src Source, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.TargetApplyTime <= 0 {
		opts.TargetApplyTime = DefaultTargetApplyTime
	}
	if opts.MinDeltaOps <= 0 {
		opts.MinDeltaOps = DefaultMinDeltaOps
	}
	if opts.MaxDeltaOps <= 0 {
		opts.MaxDeltaOps = DefaultMaxDeltaOps
	}
	opts.MinDeltaOps = min(opts.MinDeltaOps, opts.MaxDeltaOps)
	if opts.HelloTimeout <= 0 {
		opts.HelloTimeout = 30 * time.Second
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = DefaultAckTimeout
	}
	if opts.UnknownNodeTimeout <= 0 {
		opts.UnknownNodeTimeout = DefaultUnknownNodeTimeout
	}
	if opts.MaxUnknownNodeStreams <= 0 {
		opts.MaxUnknownNodeStreams = DefaultMaxUnknownNodeStreams
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Server{
		src:      src,
		log:      opts.Logger,
		opts:     opts,
		hooks:    opts.Hooks,
		reg:      newRegistry(src, opts.Clock),
		shutdown: make(chan struct{}),
	}
}

// Shutdown ends every open stream with Unavailable (agents reconnect, to
// another replica if there is one) and refuses new ones. Call it before
// stopping the gRPC server so GracefulStop does not wait on streams that
// never end by themselves. Idempotent.
func (s *Server) Shutdown() {
	s.shutdownOnce.Do(func() { close(s.shutdown) })
}

func errShuttingDown() error {
	return closeErr(ReasonShutdown, codes.Unavailable, "control plane shutting down")
}

// UnknownNodeStreams is the number of streams waiting for a node that is
// not in the desired state.
func (s *Server) UnknownNodeStreams() int { return int(s.unknown.Load()) }

// Registry returns the registry of agents connected to this server.
func (s *Server) Registry() *Registry { return s.reg }

var _ vsplanev1.AgentServiceServer = (*Server)(nil)

// Connect serves one agent stream until the agent goes away, a protocol
// error occurs, or a newer stream for the same node replaces it.
func (s *Server) Connect(stream vsplanev1.AgentService_ConnectServer) error {
	select {
	case <-s.shutdown:
		return errShuttingDown()
	default:
	}
	sess, err := s.accept(stream)
	if err != nil {
		if s.hooks.OnReject != nil {
			s.hooks.OnReject(err)
		}
		return err
	}
	err = sess.run(stream)
	if s.hooks.OnDisconnect != nil {
		s.hooks.OnDisconnect(sess.node, err)
	}
	return err
}
