// Package app wires one control-plane replica: watch (one informer per kind)
// → engine (model + translator) → snapshot store → agent streams and the
// inspection service on one gRPC server, plus a Prometheus endpoint.
// cmd/vsplane-controlplane only parses flags; tests run the same wiring.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/engine"
	"github.com/vsplane/vsplane/controlplane/inspect"
	cpmetrics "github.com/vsplane/vsplane/controlplane/metrics"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
	"github.com/vsplane/vsplane/internal/grpcserver"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Config configures a replica.
type Config struct {
	// Kube is the API server client.
	Kube kubernetes.Interface
	// GRPCListener serves the agent stream, inspection, health and reflection.
	GRPCListener net.Listener
	// MetricsListener, if set, serves /metrics.
	MetricsListener net.Listener
	// Watch tunes the bounded-frequency recomputation (min/max interval).
	Watch watch.Options
	// Translate is the cluster-wide configuration of every node's state.
	Translate translate.Config
	// Stream tunes the agent streams (hooks are chained after the replica's own).
	Stream stream.Options
	Logger *zap.Logger
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
}

// New builds a replica; Run starts it.
func New(cfg Config) (*Replica, error) {
	if cfg.Kube == nil || cfg.GRPCListener == nil {
		return nil, errors.New("controlplane: Kube client and GRPCListener are required")
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	store := snapshot.NewStore()
	eng, err := engine.New(engine.Config{Translate: cfg.Translate, Metrics: reg}, store, log.Named("engine"))
	if err != nil {
		return nil, fmt.Errorf("controlplane: engine: %w", err)
	}
	metrics, err := cpmetrics.New(reg, nil)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	sopts := cfg.Stream
	if sopts.Logger == nil {
		sopts.Logger = log.Named("stream")
	}
	feed := inspect.NewFeed(0) // WatchDeltas and per-resource NACK errors
	sopts.Hooks = metrics.Hooks(feed.Hooks(cfg.Stream.Hooks))
	streams := stream.NewServer(stream.Adapt[snapshot.Subscription](store), sopts)
	metrics.Track(streams.Registry(), store)
	insp := inspect.NewServer(inspect.Config{Agents: streams.Registry(), Snapshots: store, Problems: eng, Feed: feed})
	gs, err := grpcserver.New(grpcserver.Options{Logger: log.Named("grpc"), Registerer: reg},
		func(r grpc.ServiceRegistrar) {
			vsplanev1.RegisterAgentServiceServer(r, streams)
			vsplanev1.RegisterInspectServiceServer(r, insp)
		})
	if err != nil {
		return nil, fmt.Errorf("controlplane: grpc server: %w", err)
	}
	watcher, err := watch.New(cfg.Kube, eng, cfg.Watch, log.Named("watch"))
	if err != nil {
		return nil, fmt.Errorf("controlplane: watch: %w", err)
	}
	return &Replica{
		cfg:      cfg,
		log:      log,
		Store:    store,
		Engine:   eng,
		Watcher:  watcher,
		Streams:  streams,
		GRPC:     gs,
		Registry: reg,
		feed:     feed,
		Metrics:  metrics,
	}, nil
}

// Run serves until ctx ends, then stops the streams (agents stay fail-static
// and reconnect to another replica) and the servers.
func (r *Replica) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreCanceled(r.Watcher.Run(ctx)) })
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
