// Package agent wires the node agent: a kernel (real Linux or in-memory), the
// reconciler that makes it match the desired state, and the stream client that
// receives that state from the control plane. It is the agent's one
// composition root: FromCommandLine turns vsplane-agent's parsed command line
// (agentconfig.ParseCommandLine) into a Config and New builds the agent from
// it; cmd/vsplane-agent only parses and runs. Tests run the same wiring
// in-process.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/dataplane/client"
	"github.com/vsplane/vsplane/dataplane/healthcheck"
	"github.com/vsplane/vsplane/dataplane/inspect"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
	dpmetrics "github.com/vsplane/vsplane/dataplane/metrics"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/profiling"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Version is the agent version sent in Hello; set at build time with
// -ldflags "-X github.com/vsplane/vsplane/dataplane/agent.Version=...".
var Version = "dev"

// Config configures an agent.
type Config struct {
	// ProcessStart is when the process started (ProcessStart()); the cold
	// start's timeline is logged from it. Zero: from New's start.
	ProcessStart time.Time
	// ControlPlane lists the control-plane replicas' gRPC addresses
	// (host:port); every reconnect tries another one.
	ControlPlane []string
	// TLS verifies the control plane (internal/tlsfiles.Client); nil means
	// plaintext, which New allows only when every control-plane address is
	// a loopback one (local development, in-process tests).
	TLS *tls.Config
	// TokenFile holds the agent's projected ServiceAccount token (audience
	// "vsplane"), re-read at every (re)connect; requires TLS.
	TokenFile string
	// FirstDeltaTimeout, MaxRemovalShare and RemovalConfirmation are passed
	// to the client (zero: its defaults).
	FirstDeltaTimeout   time.Duration
	MaxRemovalShare     float64
	RemovalConfirmation time.Duration
	// NodeName is this node's Kubernetes Node name.
	NodeName string
	// Kernel to program; nil means the real Linux kernel of this network
	// namespace (see NewLinuxKernel).
	Kernel *kernel.Kernel
	// Reconcile configures the reconciler (period, families, retry).
	Reconcile reconcile.Config
	// DetectIPv6 adds IPv6 to Reconcile.Families when the node has a global
	// IPv6 address on an interface other than lo and kube-ipvs0 (what
	// kube-proxy's dual-stack detection amounts to); the decision is logged
	// and reported in Capabilities.ipv6.
	DetectIPv6 bool
	// BackoffBase and BackoffMax bound reconnect delays (client defaults if 0).
	BackoffBase, BackoffMax time.Duration
	// StateDir keeps the applied resources across restarts (a tmpfs such as
	// /run/vsplane); empty disables it and a restart resyncs everything.
	StateDir string
	// MetricsListener, if set, serves /metrics, /healthz and /livez (and
	// /debug/pprof/ with Profiling).
	MetricsListener net.Listener
	Profiling       bool
	// HealthzListener, if set, serves only /healthz and /livez: kube-proxy's
	// --healthz-bind-address (0.0.0.0:10256), which load balancers probe.
	HealthzListener net.Listener
	// InspectListener, if set, serves the read-only AgentInspectService
	// (gRPC with reflection and health; see dataplane/inspect). Keep it on
	// loopback or a Unix socket: it has no authentication.
	InspectListener net.Listener
	// Metrics is the registry the agent's metrics go to and /metrics serves;
	// nil means a new one with the Go and process collectors. Separate
	// registries let several in-process agents (tests) coexist.
	Metrics *prometheus.Registry
	Logger  *zap.Logger
	// OnStreamEnd is passed to the client (tests).
	OnStreamEnd func(error)
	// HealthCheckNodePorts serves the health-check node ports of
	// externalTrafficPolicy: Local Services (dataplane/healthcheck) on this
	// network namespace's NodePort addresses. Off by default so in-process
	// test agents sharing a namespace do not compete for ports; the
	// vsplane-agent command turns it on.
	HealthCheckNodePorts bool

	// healthListen replaces the health-check servers' listen (tests).
	healthListen func(network, address string) (net.Listener, error)
}

// Agent is a running node agent.
type Agent struct {
	cfg        Config
	kernel     kernel.Kernel
	state      *persistentApplier
	Reconciler *reconcile.Reconciler
	Client     *client.Client
	coldStart  *coldStart
	// Metrics holds the agent's metrics and health state.
	Metrics  *dpmetrics.Agent
	registry *prometheus.Registry
	inspect  *inspect.Server
	log      *zap.Logger
	// health serves health-check node ports (nil: disabled); healthSync is
	// signalled after every Apply.
	health     *healthcheck.Server
	healthSync chan struct{}
	// heldRemoval is what the client's mass-removal guard holds (nil: none).
	heldRemoval atomic.Pointer[vsplanev1.HeldRemoval]
	statusKick  chan struct{}
}

// New builds an agent. With a nil cfg.Kernel it opens the real kernel, which
// fails with a clear message when IPVS is unusable.
func New(ctx context.Context, cfg Config) (*Agent, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("agent: node name is required")
	}
	if len(cfg.ControlPlane) == 0 {
		return nil, errors.New("agent: control plane address is required")
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("node", cfg.NodeName))
	cold := newColdStart(cfg.ProcessStart, log)
	if cfg.ProcessStart.IsZero() {
		cold.start = time.Now()
	} else {
		cold.mark("startup") // runtime, main, command line, TLS files
	}
	var k kernel.Kernel
	if cfg.Kernel != nil {
		k = *cfg.Kernel
	} else {
		var err error
		if k, err = NewLinuxKernel(ctx, log); err != nil {
			return nil, err
		}
	}
	cold.mark("kernel")
	if cfg.DetectIPv6 && !slices.Contains(cfg.Reconcile.Families, kernel.FamilyIPv6) {
		families := slices.Clone(cfg.Reconcile.Families)
		if len(families) == 0 {
			families = []kernel.Family{kernel.FamilyIPv4} // the reconciler's default
		}
		has, addr, err := hasIPv6(k.Links)
		switch {
		case err != nil:
			log.Warn("cannot tell whether the node has IPv6; managing IPv4 only (set --ipv6 to decide)", zap.Error(err))
		case has:
			log.Info("node has a global IPv6 address: managing IPv4 and IPv6", zap.String("address", addr))
			families = append(families, kernel.FamilyIPv6)
		default:
			log.Info("node has no global IPv6 address: managing IPv4 only")
		}
		cfg.Reconcile.Families = families
	}
	rec, err := reconcile.New(k, cfg.Reconcile, log.Named("reconcile"))
	if err != nil {
		return nil, fmt.Errorf("agent: reconciler: %w", err)
	}
	a := &Agent{cfg: cfg, kernel: k, Reconciler: rec, log: log, coldStart: cold, healthSync: make(chan struct{}, 1), statusKick: make(chan struct{}, 1)}
	if cfg.InspectListener != nil {
		if a.inspect, err = inspect.New(rec, inspect.Readers{IPVS: k.IPVS, Links: k.Links, IPSets: k.IPSets, IPTables: k.IPTables}); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
	}
	var applier client.Applier = rec
	if cfg.StateDir != "" {
		if a.state, err = newPersistentApplier(rec, cfg.StateDir, log.Named("state")); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		applier = a.state
	}
	if a.registry = cfg.Metrics; a.registry == nil {
		a.registry = prometheus.NewRegistry()
		a.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	period := cfg.Reconcile.Period
	if period == 0 {
		period = defaultReconcilePeriod
	}
	a.Metrics, err = dpmetrics.New(a.registry, dpmetrics.Options{
		// kube-proxy: unhealthy when a queued update waits 2× the sync period.
		HealthTimeout: 2 * period,
		Families:      familyNames(cfg.Reconcile.Families),
		Stats: func() dpmetrics.Stats {
			s := rec.Stats()
			var saveFailures uint64
			if a.state != nil {
				saveFailures = a.state.SaveFailures()
			}
			return dpmetrics.Stats{StateSaveFailures: saveFailures, FullReconciles: s.FullReconciles, LastFullReconcile: s.LastFullReconcile,
				RepairsByKind: s.RepairsByKind, FailedResources: s.FailedResources,
				Draining: s.Draining, DrainsCompleted: s.DrainsCompleted, DrainsTimedOut: s.DrainsTimedOut,
				RestoreFailures:          byFamilyName(s.RestoreFailures),
				NoLocalEndpointsInternal: s.NoLocalEndpointsInternal, NoLocalEndpointsExternal: s.NoLocalEndpointsExternal,
				StaleFlowsDeleted: s.StaleFlowsDeleted, StaleFlowSweepErrors: s.StaleFlowSweepErrors}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	applier = a.Metrics.Wrap(applier)
	if cfg.HealthCheckNodePorts {
		a.health = healthcheck.New(healthcheck.Config{Logger: log.Named("healthcheck"), ProxyHealthy: a.Metrics.Healthy,
			Listen: cfg.healthListen})
		applier = notifyApplier{Applier: applier, ch: a.healthSync}
	}
	var targets []string
	for _, t := range cfg.ControlPlane {
		if t = strings.TrimSpace(t); t != "" {
			targets = append(targets, t)
		}
	}
	ccfg := client.Config{
		Targets:      targets,
		NodeName:     cfg.NodeName,
		AgentVersion: Version,
		Capabilities: a.capabilities,
		Applier:      applier,
		Logger:       log.Named("client"),
		BackoffBase:  cfg.BackoffBase,
		BackoffMax:   cfg.BackoffMax,
		OnStreamEnd:  cfg.OnStreamEnd,
		Trace:        func(s client.Step) { cold.mark(string(s)) },

		FirstDeltaTimeout:   cfg.FirstDeltaTimeout,
		MaxRemovalShare:     cfg.MaxRemovalShare,
		RemovalConfirmation: cfg.RemovalConfirmation,
		OnRemovalHeld: func(h *vsplanev1.HeldRemoval) {
			a.heldRemoval.Store(h)
			a.Metrics.RemovalHeld(h)
			a.statusNow()
		},
	}
	if cfg.TLS != nil {
		ccfg.Credentials = credentials.NewTLS(cfg.TLS)
	} else if bad := nonLoopback(targets); len(bad) > 0 {
		return nil, fmt.Errorf("agent: control plane %v is not on loopback: TLS (a CA to verify it) is required", bad)
	}
	if cfg.TokenFile != "" {
		if cfg.TLS == nil {
			return nil, errors.New("agent: the token is only sent over TLS")
		}
		ccfg.Token = bearer.File{Path: cfg.TokenFile}
	}
	if a.Client, err = client.New(ccfg); err != nil {
		return nil, fmt.Errorf("agent: client: %w", err)
	}
	cold.mark("wiring") // reconciler, state file, metrics, client
	return a, nil
}

// hasIPv6 reports whether the node has a global unicast IPv6 address on an
// interface other than lo and kernel.DummyDevice (the one vsplane binds Service
// addresses to).
func hasIPv6(links kernel.Links) (bool, string, error) {
	addrs, err := links.LocalAddresses()
	if err != nil {
		return false, "", err
	}
	for _, a := range addrs {
		ip := a.Prefix.Addr()
		if a.Interface == "lo" || a.Interface == kernel.DummyDevice || !ip.Is6() || ip.Is4In6() || !ip.IsGlobalUnicast() {
			continue
		}
		return true, a.Interface + " " + ip.String(), nil
	}
	return false, "", nil
}

// nonLoopback returns the targets whose host is not a loopback address.
func nonLoopback(targets []string) []string {
	var bad []string
	for _, t := range targets {
		host, _, err := net.SplitHostPort(t)
		if err != nil {
			bad = append(bad, t)
			continue
		}
		ip, err := netip.ParseAddr(host)
		if host != "localhost" && (err != nil || !ip.IsLoopback()) {
			bad = append(bad, t)
		}
	}
	return bad
}

// NewLinuxKernel opens every kernel subsystem of the caller's network
// namespace. IPVS is probed (a dummy virtual server is added and read back)
// because opening the netlink family succeeds even without the module.
// The whole process must be in that namespace (as the agent always is):
// the iptables tools are probed from another goroutine, and later run from
// any.
func NewLinuxKernel(ctx context.Context, log *zap.Logger) (kernel.Kernel, error) {
	// Finding the iptables backend runs tools (a process start each: about
	// 0.2 s in the VM test bed); it goes on while the netlink handles open.
	type iptResult struct {
		ipt *linux.IPTables
		err error
	}
	iptc := make(chan iptResult, 1)
	go func() {
		ipt, err := linux.NewIPTables(ctx, linux.IPTablesOptions{Logger: log.Named("iptables")})
		iptc <- iptResult{ipt, err}
	}()
	// Netlink handles bind to the creating thread's namespace; the agent runs
	// in one namespace, but pin the thread while opening them anyway.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ipvs, err := linux.NewIPVS(linux.IPVSOptions{Logger: log.Named("ipvs")})
	if err != nil {
		return kernel.Kernel{}, err
	}
	links, err := linux.NewLinks()
	if err != nil {
		return kernel.Kernel{}, fmt.Errorf("links: %w", err)
	}
	sets, err := linux.NewIPSets()
	if err != nil {
		return kernel.Kernel{}, fmt.Errorf("ipsets: %w", err)
	}
	ct, err := linux.NewConntrack()
	if err != nil {
		return kernel.Kernel{}, fmt.Errorf("conntrack: %w", err)
	}
	r := <-iptc
	ipt, err := r.ipt, r.err
	if err != nil {
		return kernel.Kernel{}, fmt.Errorf("iptables: %w", err)
	}
	return kernel.Kernel{IPVS: ipvs, IPSets: sets, Links: links, IPTables: ipt, Sysctl: linux.NewSysctl(linux.DefaultSysctlRoot), Conntrack: ct}, nil
}

// capabilities describes the node's kernel for the Hello.
func (a *Agent) capabilities() *vsplanev1.Capabilities {
	caps := &vsplanev1.Capabilities{Ipv6: slices.Contains(a.cfg.Reconcile.Families, kernel.FamilyIPv6)}
	if scheds, err := a.kernel.IPVS.Schedulers(); err == nil {
		// Sctp stays false until it is probed (SCTP virtual servers come
		// with the full-semantics work); never claim what was not checked.
		caps.IpvsSchedulers = scheds
	} else {
		a.log.Warn("cannot list IPVS schedulers", zap.Error(err))
	}
	if v, err := a.kernel.Sysctl.KernelVersion(); err == nil {
		caps.KernelVersion = v.Raw
	}
	caps.IptablesBackend = string(a.kernel.IPTables.Info().Backend)
	return caps
}

// Run runs the reconciler loop, the stream client and (if configured) the
// metrics/health and inspection servers until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreCanceled(a.Reconciler.Run(ctx)) })
	a.watchAddresses(ctx)
	g.Go(func() error { return ignoreCanceled(a.Client.Run(ctx)) })
	g.Go(func() error { a.reportStatus(ctx); return nil })
	if a.state != nil {
		g.Go(func() error { a.state.run(ctx); return nil })
	}
	if a.inspect != nil {
		g.Go(func() error { return inspect.Serve(ctx, a.cfg.InspectListener, a.inspect, a.log.Named("inspect")) })
	}
	if a.health != nil {
		g.Go(func() error { a.runHealthChecks(ctx); return nil })
	}
	if a.cfg.MetricsListener != nil {
		serveHTTP(ctx, g, a.cfg.MetricsListener, a.httpHandler(true))
	}
	if a.cfg.HealthzListener != nil {
		serveHTTP(ctx, g, a.cfg.HealthzListener, a.httpHandler(false))
	}
	return g.Wait()
}

// watchAddresses hands the addresses removed from the node's interfaces
// to the reconciler, which repairs a removed Service address at once
// (reconcile/addrwatch.go). A kernel that cannot watch leaves it to the
// periodic full reconcile, as before.
func (a *Agent) watchAddresses(ctx context.Context) {
	w, ok := a.kernel.Links.(kernel.AddressWatcher)
	if !ok {
		return
	}
	if err := w.WatchRemovedAddresses(ctx, a.Reconciler.AddressRemoved); err != nil {
		a.log.Warn("cannot watch address removals: a removed Service address waits for the next full reconcile", zap.Error(err))
	}
}

// serveHTTP serves h on ln in g until ctx ends.
func serveHTTP(ctx context.Context, g *errgroup.Group, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	})
}

// defaultReconcilePeriod is reconcile.Config's default Period.
const defaultReconcilePeriod = wire.DefaultReconcilePeriod

// The agent looks at its status every statusPoll and sends it when it changed
// (a drain started or ended, connection counts moved, a kernel error), and at
// least every statusRefresh so the control plane's view never goes stale.
const (
	statusPoll    = time.Second
	statusRefresh = 30 * time.Second
)

// reportStatus hands the reconciler's status to the client, which sends it on
// the stream (and again after every reconnect).
func (a *Agent) reportStatus(ctx context.Context) {
	t := time.NewTicker(statusPoll)
	defer t.Stop()
	var last *vsplanev1.AgentStatus
	var lastSent time.Time
	for {
		st := a.Reconciler.Status()
		st.HeldRemoval = a.heldRemoval.Load()
		if a.health != nil {
			// Bind failures of health-check node ports are node problems the
			// control plane should see.
			errs := a.health.Errors()
			for _, k := range slices.Sorted(maps.Keys(errs)) {
				st.KernelErrors = append(st.KernelErrors, errs[k])
			}
		}
		if last == nil || !proto.Equal(st, last) || time.Since(lastSent) >= statusRefresh {
			a.Client.SetStatus(st)
			last, lastSent = st, time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.statusKick:
		}
	}
}

// statusNow makes reportStatus look at the status at once.
func (a *Agent) statusNow() {
	select {
	case a.statusKick <- struct{}{}:
	default:
	}
}

// httpHandler serves Prometheus metrics and kube-proxy's /healthz and /livez
// (503 once a received Delta waited more than 2× the reconcile period;
// /healthz also while the node settings say the Node is being deleted).
func (a *Agent) httpHandler(metrics bool) http.Handler {
	mux := http.NewServeMux()
	if metrics {
		mux.Handle("/metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{}))
		if a.cfg.Profiling {
			profiling.Register(mux)
		}
	}
	mux.Handle("/healthz", a.Metrics.NodeHealthzHandler(a.Reconciler.NodeEligible))
	mux.Handle("/livez", a.Metrics.LivezHandler())
	return mux
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// healthResync bounds how long a health-check server waits for a retry of
// a failed bind or for NodePort address changes seen by full reconciles.
const healthResync = 5 * time.Second

// runHealthChecks keeps the health-check servers in line with the applied
// Services: after every Apply and every healthResync, until ctx ends.
func (a *Agent) runHealthChecks(ctx context.Context) {
	t := time.NewTicker(healthResync)
	defer t.Stop()
	defer a.health.Close()
	for {
		a.syncHealthChecks()
		select {
		case <-ctx.Done():
			return
		case <-a.healthSync:
		case <-t.C:
		}
	}
}

// syncHealthChecks runs one Sync of the health-check servers.
func (a *Agent) syncHealthChecks() {
	checks := a.Reconciler.HealthChecks()
	svcs := make([]healthcheck.Service, 0, len(checks))
	for _, c := range checks {
		svcs = append(svcs, healthcheck.Service{Namespace: c.Namespace, Name: c.Name, Port: c.Port,
			IPv4: c.IPv4, IPv6: c.IPv6, LocalEndpoints4: c.LocalEndpoints4, LocalEndpoints6: c.LocalEndpoints6})
	}
	var addrs []netip.Addr // nil: all addresses, as kube-proxy without --nodeport-addresses
	if np, restricted := a.Reconciler.NodePortAddresses(); restricted {
		addrs = append([]netip.Addr{}, np...)
	}
	a.health.Sync(svcs, addrs)
}

// notifyApplier signals ch after every Apply.
type notifyApplier struct {
	client.Applier
	ch chan struct{}
}

func (n notifyApplier) Apply(ctx context.Context, d *vsplanev1.Delta) *vsplanev1.Ack {
	ack := n.Applier.Apply(ctx, d)
	select {
	case n.ch <- struct{}{}:
	default:
	}
	return ack
}

// familyName is kube-proxy's name of a family in metrics and health
// bodies (v1.IPFamily: "IPv4", "IPv6").
func familyName(f kernel.Family) string {
	if f == kernel.FamilyIPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// familyNames names families in order; none means the reconciler's
// default (IPv4), which dpmetrics.Options also defaults to.
func familyNames(fams []kernel.Family) []string {
	var out []string
	for _, f := range fams {
		out = append(out, familyName(f))
	}
	return out
}

func byFamilyName(m map[kernel.Family]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for f, n := range m {
		out[familyName(f)] += n
	}
	return out
}
