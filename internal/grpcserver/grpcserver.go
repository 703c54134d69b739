// Package grpcserver builds the *grpc.Server every vsplane gRPC endpoint uses:
// logging and panic-recovery interceptors (go-grpc-middleware v2), Prometheus
// server metrics, the standard health service and server reflection (so that
// `grpcurl -plaintext HOST:PORT list` works), and keepalive settings suited to
// long-lived agent streams.
package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// Options configure New. The zero value is usable (no logging, no metrics).
type Options struct {
	// Logger receives request logs and recovered panics; nil means zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the gRPC server metrics (grpc_server_*); nil skips
	// metrics entirely.
	Registerer prometheus.Registerer
	// Keepalive overrides DefaultKeepalive when non-nil.
	Keepalive *keepalive.ServerParameters
	// KeepalivePolicy overrides DefaultKeepalivePolicy when non-nil.
	KeepalivePolicy *keepalive.EnforcementPolicy
	// LogPayloads logs every message sent/received on streams at debug level.
	// Off by default: agent streams carry large deltas.
	LogPayloads bool
	// MaxRecvMsgSize bounds one received message; 0 means DefaultMaxRecvMsgSize.
	// An agent's Hello carries one name/version pair per resource it holds.
	MaxRecvMsgSize int
	// MaxConcurrentStreams bounds the streams of one connection; 0 means
	// DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// MaxConnectionAge, if set, ends each connection after about this long
	// (gRPC adds ±10% jitter), after MaxConnectionAgeGrace for open streams:
	// agents then reconnect, to any replica, so they spread again after a
	// rollout.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// TLS, if set, serves TLS with it (see internal/tlsfiles); nil serves
	// plaintext (the caller decides where that is allowed).
	TLS *tls.Config
	// Authorize, if set, is called before every call of the registered
	// services (not health checks, not reflection, which reveals only the
	// API's shape); an error (a gRPC status) ends the call with it.
	Authorize func(ctx context.Context, fullMethod string) error
	// StartNotServing makes the health service report NOT_SERVING (overall
	// and per service) until SetServing(true): for servers that must finish
	// some work before they can answer (a control-plane replica's first full
	// computation).
	StartNotServing bool
	// ServerOptions are appended after the ones New builds.
	ServerOptions []grpc.ServerOption
}

// DefaultKeepalive pings idle connections so dead agents (node crashed, NAT
// timeout) are noticed within about a minute and half-open TCP connections do
// not keep a stale registry entry forever. Streams themselves never expire.
var DefaultKeepalive = keepalive.ServerParameters{
	Time:    30 * time.Second,
	Timeout: 20 * time.Second,
}

// DefaultKeepalivePolicy lets clients ping as often as every 10 s even without
// active RPCs (the agent client pings every 30 s).
var DefaultKeepalivePolicy = keepalive.EnforcementPolicy{
	MinTime:             10 * time.Second,
	PermitWithoutStream: true,
}

// DefaultMaxRecvMsgSize (64 MiB) is sized to the largest legitimate message,
// an agent's Hello: one name/version pair per resource it holds, at most
// ~380 bytes each (a 325-byte name, a 32-byte version, framing), so 64 MiB
// fits ~175k Services on one node, beyond Kubernetes' tested 10k Services
// per cluster; gRPC's own default (4 MiB) would reject ~11k.
const DefaultMaxRecvMsgSize = 64 << 20

// DefaultMaxConcurrentStreams bounds the streams of one connection: an
// agent opens one, grpcurl one per call.
const DefaultMaxConcurrentStreams = 64

// Server is a configured grpc.Server plus the pieces callers may need later.
type Server struct {
	*grpc.Server
	// Health is the standard health service; the overall status ("") and
	// every registered service start SERVING (NOT_SERVING with
	// Options.StartNotServing); SetServing flips them all.
	Health *health.Server
	// Metrics is nil when Options.Registerer was nil.
	Metrics *grpcprom.ServerMetrics
}

// New builds the server, calls register for the caller's services, then
// registers health and reflection and pre-initialises the metrics for every
// registered method. Registering metrics twice on the same Registerer is an
// error (returned, not a panic).
func New(opts Options, register ...func(grpc.ServiceRegistrar)) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	kp := DefaultKeepalive
	if opts.Keepalive != nil {
		kp = *opts.Keepalive
	}
	if opts.MaxConnectionAge > 0 {
		kp.MaxConnectionAge = opts.MaxConnectionAge
		kp.MaxConnectionAgeGrace = opts.MaxConnectionAgeGrace
	}
	maxStreams := opts.MaxConcurrentStreams
	if maxStreams == 0 {
		maxStreams = DefaultMaxConcurrentStreams
	}
	kep := DefaultKeepalivePolicy
	if opts.KeepalivePolicy != nil {
		kep = *opts.KeepalivePolicy
	}

	var metrics *grpcprom.ServerMetrics
	if opts.Registerer != nil {
		metrics = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
		if err := opts.Registerer.Register(metrics); err != nil {
			return nil, fmt.Errorf("register gRPC server metrics: %w", err)
		}
	}

	// A stream (an agent's) is logged when it opens and when it ends; a
	// unary call (inspection: grpcurl, kubectl vsplane, polling scripts)
	// once, when it finishes, with its code and duration.
	streamEvents := []logging.LoggableEvent{logging.StartCall, logging.FinishCall}
	unaryEvents := []logging.LoggableEvent{logging.FinishCall}
	if opts.LogPayloads {
		streamEvents = append(streamEvents, logging.PayloadReceived, logging.PayloadSent)
		unaryEvents = append(unaryEvents, logging.StartCall, logging.PayloadReceived, logging.PayloadSent)
	}
	unaryLogOpts := []logging.Option{logging.WithLogOnEvents(unaryEvents...)}
	streamLogOpts := []logging.Option{logging.WithLogOnEvents(streamEvents...)}
	rlog := log.Named("grpc")
	recoveryOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		rlog.Error("panic in gRPC handler", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		return status.Errorf(codes.Internal, "internal error (panic recovered): %v", p)
	})
	zl := InterceptorLogger(rlog)

	// Order: metrics outermost (count everything), then logging (sees the
	// final code, including Internal from a recovered panic), recovery innermost.
	var unary []grpc.UnaryServerInterceptor
	var streams []grpc.StreamServerInterceptor
	if metrics != nil {
		unary = append(unary, metrics.UnaryServerInterceptor())
		streams = append(streams, metrics.StreamServerInterceptor())
	}
	// Health checks (kubelet probes every few seconds) are not logged.
	notHealth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service != healthpb.Health_ServiceDesc.ServiceName
	})
	unary = append(unary, selector.UnaryServerInterceptor(logging.UnaryServerInterceptor(zl, unaryLogOpts...), notHealth),
		recovery.UnaryServerInterceptor(recoveryOpt))
	streams = append(streams, selector.StreamServerInterceptor(logging.StreamServerInterceptor(zl, streamLogOpts...), notHealth),
		recovery.StreamServerInterceptor(recoveryOpt))
	if az := opts.Authorize; az != nil {
		// After logging, so refused calls are logged with their code.
		unary = append(unary, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if open(info.FullMethod) {
				return h(ctx, req)
			}
			if err := az(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		})
		streams = append(streams, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if open(info.FullMethod) {
				return h(srv, ss)
			}
			if err := az(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		})
	}

	maxRecv := opts.MaxRecvMsgSize
	if maxRecv <= 0 {
		maxRecv = DefaultMaxRecvMsgSize
	}
	so := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecv),
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(streams...),
		grpc.KeepaliveParams(kp),
		grpc.KeepaliveEnforcementPolicy(kep),
		grpc.ForceServerCodecV2(newCodec()),
		// Each connection returns its write buffer to a pool after a
		// flush: a replica holds a thousand mostly idle agent streams.
		grpc.SharedWriteBuffer(true),
		// Agents send little (Acks, statuses; a Hello at most once per
		// stream), and TLS buffers a record anyway: 4 KiB instead of
		// gRPC's 32 KiB read buffer per connection is 28 MiB less for
		// 1,000 agents (e2e/fanout heap profile).
		grpc.ReadBufferSize(4 << 10),
	}
	if opts.TLS != nil {
		so = append(so, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	so = append(so, opts.ServerOptions...)
	gs := grpc.NewServer(so...)

	for _, r := range register {
		if r == nil {
			return nil, errors.New("grpcserver.New: nil register func")
		}
		r(gs)
	}
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	srv := &Server{Server: gs, Health: hs, Metrics: metrics}
	srv.SetServing(!opts.StartNotServing)
	reflection.Register(gs)
	if metrics != nil {
		metrics.InitializeMetrics(gs)
	}
	return srv, nil
}

// SetServing sets the overall health status ("") and every registered
// service's to SERVING or NOT_SERVING.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.Health.SetServingStatus("", st)
	for name := range s.Server.GetServiceInfo() {
		s.Health.SetServingStatus(name, st)
	}
}

// open reports whether a method needs no authorization: health checks
// (probes) and reflection (the API's shape, no data).
func open(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

// Stop marks the server NOT_SERVING, then stops gracefully, forcing after
// timeout (long-lived streams would otherwise block GracefulStop forever).
// It returns at the latest 2×timeout after the call even if a handler never
// returns (connections are closed by then; the stuck handler leaks).
func (s *Server) Stop(timeout time.Duration) {
	s.Health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.Server.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(timeout):
	}
	s.Server.Stop()
	select {
	case <-done:
	case <-time.After(timeout):
	}
}

// InterceptorLogger adapts zap to the go-grpc-middleware logging.Logger.
func InterceptorLogger(l *zap.Logger) logging.Logger {
	return logging.LoggerFunc(func(_ context.Context, lvl logging.Level, msg string, fields ...any) {
		f := make([]zap.Field, 0, len(fields)/2)
		for i := 0; i+1 < len(fields); i += 2 {
			key, ok := fields[i].(string)
			if !ok {
				key = fmt.Sprint(fields[i])
			}
			f = append(f, zap.Any(key, fields[i+1]))
		}
		ll := l.WithOptions(zap.AddCallerSkip(1))
		switch lvl {
		case logging.LevelDebug:
			ll.Debug(msg, f...)
		case logging.LevelInfo:
			ll.Info(msg, f...)
		case logging.LevelWarn:
			ll.Warn(msg, f...)
		case logging.LevelError:
			ll.Error(msg, f...)
		default:
			ll.Info(msg, f...)
		}
	})
}
