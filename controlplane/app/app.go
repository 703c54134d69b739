// Package app wires one control-plane replica: watch (one informer per kind)
// → engine (model + translator) → snapshot store → agent streams and the
// inspection service on one gRPC server, plus a Prometheus endpoint.
// It is the control plane's one composition root: FromCommandLine turns
// vsplane-controlplane's parsed command line (config.ParseCommandLine) into
// a Config, and New builds the replica's API clients (from a rest.Config),
// TLS, agent authentication and peer credentials from it (clients.go);
// cmd/vsplane-controlplane only parses and runs. Tests run the same wiring
// with clients of their own.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/engine"
	"github.com/vsplane/vsplane/controlplane/inspect"
	cpmetrics "github.com/vsplane/vsplane/controlplane/metrics"
	"github.com/vsplane/vsplane/controlplane/peers"
	"github.com/vsplane/vsplane/controlplane/rollout"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
	"github.com/vsplane/vsplane/internal/grpcserver"
	"github.com/vsplane/vsplane/internal/profiling"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Config configures a replica.
type Config struct {
	// Kube is the API server client; nil: New builds it from REST.
	Kube kubernetes.Interface
	// REST is the API server's client configuration New builds the clients
	// that are not given from (clients.go): Kube (protobuf; QPS KubeAPIQPS,
	// burst twice that), Dynamic (JSON) when Rollouts, and with Security
	// the reviews' client (QPS AuthAPIQPS). A QPS <= 0 keeps REST's.
	REST                   *rest.Config
	KubeAPIQPS, AuthAPIQPS float64
	// Security, when set, has New load the serving certificate, authenticate
	// agents and authorize inspection through the API server, and call
	// peers over TLS with a token: each where TLS, AgentAuth, InspectAuth or
	// PeerDialOptions is not given. Nil (with those nil) serves plaintext
	// without authentication, which New allows only on a loopback listener.
	Security *Security
	// Rollouts enables SchedulerRollouts: the watch of vsplane.io/v1alpha1
	// (the CRD must be installed) through Dynamic (nil: built from REST),
	// and the leader-elected rollout controller (Lease RolloutLease,
	// "namespace/name"; identity Advertise or the hostname).
	Rollouts     bool
	Dynamic      dynamic.Interface
	RolloutLease string
	// RolloutTiming overrides the election and pass timing (tests).
	RolloutTiming *RolloutTiming
	// GRPCListener serves the agent stream, inspection, health and reflection.
	GRPCListener net.Listener
	// TLS serves GRPCListener with TLS (internal/tlsfiles). Nil serves
	// plaintext, which New allows only on a loopback listener.
	TLS *tls.Config
	// AgentAuth returns the node an agent stream's credentials belong to
	// (auth.Agents.Node); InspectAuth authorizes inspection calls
	// (auth.Inspectors.Authorize). Nil disables each, which New allows only
	// on a loopback listener.
	AgentAuth   func(ctx context.Context) (node string, err error)
	InspectAuth func(ctx context.Context) error
	// MetricsListener, if set, serves /metrics (and /debug/pprof/ with
	// Profiling).
	MetricsListener net.Listener
	Profiling       bool
	// Watch tunes the bounded-frequency recomputation (min/max interval).
	Watch watch.Options
	// Translate is the cluster-wide configuration of every node's state.
	Translate translate.Config
	// Reload, if set, polls the configuration file Translate came from: a
	// valid new version's fleet settings are applied live (Engine.SetTranslate,
	// then a recomputation); an invalid one is logged and not applied.
	Reload *config.Reloader
	// Stream tunes the agent streams (hooks are chained after the replica's
	// own; Ready is set by the replica).
	Stream stream.Options
	// Engine tunes the engine (batch size, resync chunks); Translate and
	// Metrics are set from this Config.
	Engine engine.Config
	// Advertise is this replica's gRPC address as its peers reach it (the
	// fleet-wide view excludes it from the peers); Peers are the others,
	// given statically, and/or PeerService ("namespace/name") whose
	// EndpointSlices (port PeerPortName, default "grpc") list the replicas.
	// Without either, inspection shows this replica's agents only.
	Advertise    string
	Peers        []string
	PeerService  string
	PeerPortName string
	// PeerDialOptions are the credentials to reach peers (default: none,
	// plaintext).
	PeerDialOptions []grpc.DialOption
	// MaxConnectionAge and MaxConnectionAgeGrace age out agent connections
	// so agents spread over the replicas again (zero: never).
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// CAPublishInterval is how often Security.CAConfigMap is compared with
	// the CA file (<= 0: DefaultCAPublishInterval).
	CAPublishInterval time.Duration
	Logger            *zap.Logger
}

// RolloutTiming is the leader election's and the controller's pace.
type RolloutTiming struct {
	LeaseDuration, RenewDeadline, RetryPeriod, Interval time.Duration
}

// Replica is one running control-plane replica.
type Replica struct {
	cfg      Config
	log      *zap.Logger
	Store    *snapshot.Store
	Engine   *engine.Engine
	Watcher  *watch.Watcher
	Streams  *stream.Server
	GRPC     *grpcserver.Server
	Registry *prometheus.Registry
	Metrics  *cpmetrics.ControlPlane
	feed     *inspect.Feed
	// Peers are the other replicas (nil without Config.Peers/PeerService).
	Peers *peers.Peers
	// Rollouts is the rollout controller (nil without Config.Rollouts).
	Rollouts *rollout.Controller
	// Inspect is the inspection service (tests call it directly).
	Inspect *inspect.Server
	// caPublisher keeps Security.CAConfigMap current (nil without it).
	caPublisher *caPublisher
	// ready is closed after the first full computation was committed.
	ready     chan struct{}
	readyOnce sync.Once
}

// New builds a replica; Run starts it.
func New(cfg Config) (*Replica, error) {
	if cfg.GRPCListener == nil {
		return nil, errors.New("controlplane: GRPCListener is required")
	}
	if err := buildClients(&cfg); err != nil {
		return nil, err
	}
	if cfg.Kube == nil {
		return nil, errors.New("controlplane: a Kube client or REST is required")
	}
	if (cfg.TLS == nil || cfg.AgentAuth == nil || cfg.InspectAuth == nil) && !isLoopback(cfg.GRPCListener.Addr()) {
		return nil, fmt.Errorf("controlplane: %s is not a loopback address: TLS, agent authentication and inspection authorization are required there", cfg.GRPCListener.Addr())
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	store := snapshot.NewStore()
	ecfg := cfg.Engine
	ecfg.Translate, ecfg.Metrics = cfg.Translate, reg
	eng, err := engine.New(ecfg, store, log.Named("engine"))
	if err != nil {
		return nil, fmt.Errorf("controlplane: engine: %w", err)
	}
	if cfg.Reload != nil {
		for _, c := range cfg.Reload.Collectors() {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("controlplane: config metrics: %w", err)
			}
		}
	}
	metrics, err := cpmetrics.New(reg)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	ready := make(chan struct{})
	sopts := cfg.Stream
	sopts.Ready = ready
	if cfg.AgentAuth != nil {
		sopts.Authenticate = cfg.AgentAuth
	}
	if sopts.Logger == nil {
		sopts.Logger = log.Named("stream")
	}
	feed := inspect.NewFeed(0) // WatchDeltas and per-resource NACK errors
	sopts.Hooks = metrics.Hooks(feed.Hooks(cfg.Stream.Hooks))
	streams := stream.NewServer(store, sopts)
	metrics.Track(streams.Registry(), store)
	icfg := inspect.Config{Agents: streams.Registry(), Snapshots: store, Problems: eng, Feed: feed}
	var fleet *peers.Peers
	if cfg.PeerService != "" && strings.Count(cfg.PeerService, "/") != 1 {
		return nil, fmt.Errorf("controlplane: peer service %q: want namespace/name", cfg.PeerService)
	}
	if len(cfg.Peers) > 0 || cfg.PeerService != "" {
		if cfg.Advertise == "" {
			return nil, errors.New("controlplane: peers need this replica's advertised address")
		}
		dial := cfg.PeerDialOptions
		if len(dial) == 0 {
			dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		}
		fleet = peers.New(cfg.Advertise, log.Named("peers"), dial...)
		fleet.Set(cfg.Peers)
		icfg.Peers = fleet
	}
	insp := inspect.NewServer(icfg)
	// NOT_SERVING (readiness probe) until the first full computation.
	gs, err := grpcserver.New(grpcserver.Options{Logger: log, Registerer: reg, StartNotServing: true,
		MaxConnectionAge: cfg.MaxConnectionAge, MaxConnectionAgeGrace: cfg.MaxConnectionAgeGrace,
		TLS: cfg.TLS, Authorize: inspectionOnly(cfg.InspectAuth)},
		func(r grpc.ServiceRegistrar) {
			vsplanev1.RegisterAgentServiceServer(r, streams)
			vsplanev1.RegisterInspectServiceServer(r, insp)
		})
	if err != nil {
		return nil, fmt.Errorf("controlplane: grpc server: %w", err)
	}
	r := &Replica{
		cfg:      cfg,
		log:      log,
		Store:    store,
		Engine:   eng,
		Streams:  streams,
		GRPC:     gs,
		Registry: reg,
		feed:     feed,
		Metrics:  metrics,
		ready:    ready,
		Peers:    fleet,
		Inspect:  insp,
	}
	if sec := cfg.Security; sec != nil && sec.CAConfigMap != "" {
		if r.caPublisher, err = newCAPublisher(cfg.Kube, sec.CAConfigMap, sec.CAFile, cfg.CAPublishInterval, log.Named("ca")); err != nil {
			return nil, err
		}
	}
	wopts := cfg.Watch
	wopts.Rollouts, wopts.Dynamic = cfg.Rollouts, cfg.Dynamic
	if r.Watcher, err = watch.New(cfg.Kube, readySink{eng, r.markReady}, wopts, log.Named("watch")); err != nil {
		return nil, fmt.Errorf("controlplane: watch: %w", err)
	}
	if cfg.Rollouts {
		if r.Rollouts, err = newRolloutController(cfg, r, insp, log); err != nil {
			return nil, err
		}
		insp.SetRollouts(r.Rollouts)
		if err := reg.Register(rollout.NewCollector(r.Watcher.Rollouts, r.Rollouts.Leading)); err != nil {
			return nil, fmt.Errorf("controlplane: rollout metrics: %w", err)
		}
	}
	return r, nil
}

func newRolloutController(cfg Config, r *Replica, insp *inspect.Server, log *zap.Logger) (*rollout.Controller, error) {
	ns, name, ok := strings.Cut(cfg.RolloutLease, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("controlplane: rollout lease %q: want namespace/name", cfg.RolloutLease)
	}
	id := cfg.Advertise
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, err
		}
		id = h
	}
	rc := rollout.Config{
		Kube: cfg.Kube, Dynamic: cfg.Dynamic, LeaseNamespace: ns, LeaseName: name, Identity: id,
		Rollouts: r.Watcher.Rollouts, Engine: r.Engine, Desired: r.Store, Problems: r.Engine.AllProblems,
		Agents: func(ctx context.Context, names []string) ([]*vsplanev1.AgentInfo, error) {
			resp, err := insp.ListAgents(ctx, &vsplanev1.ListAgentsRequest{VersionsOf: names})
			return resp.GetAgents(), err
		},
		Logger: log.Named("rollout"),
	}
	if t := cfg.RolloutTiming; t != nil {
		rc.LeaseDuration, rc.RenewDeadline, rc.RetryPeriod, rc.Interval = t.LeaseDuration, t.RenewDeadline, t.RetryPeriod, t.Interval
	}
	c, err := rollout.New(rc)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	return c, nil
}

// inspectionOnly applies authorize to InspectService calls; agent streams
// authenticate in the stream server (the node comes from the token).
func inspectionOnly(authorize func(context.Context) error) func(context.Context, string) error {
	if authorize == nil {
		return nil
	}
	prefix := "/" + vsplanev1.InspectService_ServiceDesc.ServiceName + "/"
	return func(ctx context.Context, method string) error {
		if strings.HasPrefix(method, prefix) {
			return authorize(ctx)
		}
		return nil
	}
}

// isLoopback reports whether a listener's address is a loopback one (or a
// Unix socket).
func isLoopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.Network() == "unix"
	}
	return tcp.IP.IsLoopback()
}

// Ready is closed once the replica serves: its informers synced and its
// first full computation is committed. Before that the health service
// says NOT_SERVING and agent streams are held (nothing is sent).
func (r *Replica) Ready() <-chan struct{} { return r.ready }

func (r *Replica) markReady() {
	r.readyOnce.Do(func() {
		close(r.ready)
		r.GRPC.SetServing(true)
		r.log.Info("first full computation committed; serving agents", zap.Int("nodes", len(r.Store.Nodes())))
	})
}

// readySink calls ready after the first successful Apply: the watcher's
// first batch holds the whole cluster (watch.Sink), so by then every node's
// complete state is in the store.
type readySink struct {
	*engine.Engine
	ready func()
}

func (s readySink) Apply(ctx context.Context, ch *watch.Changes) error {
	if err := s.Engine.Apply(ctx, ch); err != nil {
		return err
	}
	s.ready()
	return nil
}

// SetTranslate applies new fleet settings live: the engine switches to
// them on its next Apply, which it asks the watcher for, and every node
// receives what changed for it.
func (r *Replica) SetTranslate(c translate.Config) {
	r.Engine.SetTranslate(c)
	r.Watcher.Trigger()
}

// Run serves until ctx ends, then stops the streams (agents stay fail-static
// and reconnect to another replica) and the servers.
func (r *Replica) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreCanceled(r.Watcher.Run(ctx)) })
	if r.cfg.Reload != nil {
		g.Go(func() error {
			r.cfg.Reload.Run(ctx, r.SetTranslate)
			return nil
		})
	}
	if r.Rollouts != nil {
		g.Go(func() error {
			// Only a replica that serves (synced, first computation done)
			// may lead: it must see every rollout and node.
			select {
			case <-ctx.Done():
				return nil
			case <-r.ready:
			}
			return ignoreCanceled(r.Rollouts.Run(ctx))
		})
	}
	if r.caPublisher != nil {
		g.Go(func() error {
			r.caPublisher.run(ctx)
			return nil
		})
	}
	if r.Peers != nil {
		defer r.Peers.Close()
		if ns, name, ok := strings.Cut(r.cfg.PeerService, "/"); ok {
			port := r.cfg.PeerPortName
			if port == "" {
				port = "grpc"
			}
			g.Go(func() error { return r.Peers.Watch(ctx, r.cfg.Kube, ns, name, port) })
		}
	}
	g.Go(func() error {
		if err := r.GRPC.Serve(r.cfg.GRPCListener); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		r.Streams.Shutdown()
		r.feed.Close() // ends WatchDeltas calls so GracefulStop need not wait for them
		r.GRPC.Stop(5 * time.Second)
		return nil
	})
	if r.cfg.MetricsListener != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(r.Registry, promhttp.HandlerOpts{}))
		// Plain-HTTP probes for kubelet, whose gRPC probe cannot speak TLS:
		// /readyz is the gRPC health service's SERVING (synced and the
		// first full computation committed), /livez that the process serves.
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			select {
			case <-r.ready:
				fmt.Fprintln(w, "ok")
			default:
				http.Error(w, "not ready: informers syncing or first full computation pending", http.StatusServiceUnavailable)
			}
		})
		mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		if r.cfg.Profiling {
			profiling.Register(mux)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(r.cfg.MetricsListener); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	r.log.Info("control plane serving", zap.String("grpc", r.cfg.GRPCListener.Addr().String()))
	return g.Wait()
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
