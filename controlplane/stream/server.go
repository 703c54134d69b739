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
//     desired (removed). This first Delta is ALWAYS sent for a known node, even
//     when it carries nothing: an empty first Delta means "you are in sync".
//     replace_all is never set; removals are always explicit.
//   - If the node is unknown to the Source, the stream stays open and nothing
//     is sent (the agent stays fail-static) until the node appears; then a
//     full diff is sent. If a known node disappears, nothing is removed; the
//     next appearance triggers a full diff again.
//   - Afterwards every Subscription signal adds names to a dirty set. At most
//     MaxInFlight Deltas are unacknowledged; while waiting, changes coalesce,
//     so a slow agent gets fewer, larger Deltas.
//   - A name is sent when its desired version differs from the version last
//     sent on this stream (or reported in Hello). A NACKed version is
//     remembered and not resent until the desired version changes. A NACK
//     fails the resources its errors name; a NACK with no errors, or with an
//     error whose name is empty, fails every resource of its Delta.
//   - The agent retries failed resources itself. When a retry applies a
//     NACKed version, AgentStatus.recovered says so and that version counts
//     as acknowledged (it is still not resent).
//   - A new stream for a node closes the older one with Aborted.
package stream

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Options configure a Server.
type Options struct {
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
	// MaxInFlight is the number of Deltas that may be unacknowledged at once;
	// 0 means 1.
	MaxInFlight int
	// HelloTimeout bounds the wait for the first message; 0 means 30s.
	HelloTimeout time.Duration
	// Hooks observe streams (metrics).
	Hooks Hooks
}

// Server implements vsplanev1.AgentServiceServer.
type Server struct {
	vsplanev1.UnimplementedAgentServiceServer

	src          Source
	log          *zap.Logger
	maxInFlight  int
	helloTimeout time.Duration
	hooks        Hooks
	reg          *Registry

	shutdownOnce sync.Once
	shutdown     chan struct{}
}

// NewServer returns a Server that streams src's per-node state.
func NewServer(src Source, opts Options) *Server {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	mif := opts.MaxInFlight
	if mif <= 0 {
		mif = 1
	}
	ht := opts.HelloTimeout
	if ht <= 0 {
		ht = 30 * time.Second
	}
	return &Server{
		helloTimeout: ht,
		src:          src,
		log:          log.Named("stream"),
		maxInFlight:  mif,
		hooks:        opts.Hooks,
		reg:          newRegistry(src),
		shutdown:     make(chan struct{}),
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
	return status.Error(codes.Unavailable, "control plane shutting down")
}

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
		return err
	}
	err = sess.run()
	if s.hooks.OnDisconnect != nil {
		s.hooks.OnDisconnect(sess.node, err)
	}
	return err
}
