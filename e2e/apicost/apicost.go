// Package apicost measures what Service proxying costs the API server: N
// kube-proxy-like watchers (one per node, each with its own connection,
// watching what kube-proxy watches) against one vsplane control-plane
// watch (controlplane/watch, the informers a replica runs), on a real
// kube-apiserver + etcd (kubeenv) holding S Services with one EndpointSlice
// of E endpoints each and N Nodes.
//
// Every scenario runs alone on the same API server: start its watchers and
// wait until they synced, apply the same churn (K EndpointSlice updates,
// each replacing one endpoint, and a few Service updates), wait until every
// watcher holds the last version of every changed object, and take the
// difference of the API server's own metrics (watch events and their bytes,
// LIST requests and bytes) over the start and over the churn. A first
// scenario with no watcher measures the API server's own watchers, which
// the churn numbers are also given without.
//
// The tests are TestAPICostTiny (CI) and TestAPICostBench (build tag
// apicostbench, full size, writes bench/results/apicost.{json,md}).
package apicost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/e2e/measure"
)

// Size is a benchmark size: Watchers (= Nodes), Services, and Endpoints per
// Service (one EndpointSlice each).
type Size struct {
	Watchers  int `json:"watchers"`
	Services  int `json:"services"`
	Endpoints int `json:"endpoints_per_service"`
}

func (s Size) String() string {
	return fmt.Sprintf("%d watchers x %d Services x %d endpoints", s.Watchers, s.Services, s.Endpoints)
}

// FullSize is the size issue #12 asks for.
var FullSize = Size{Watchers: 1000, Services: 10000, Endpoints: 10}

// Options configure Run; zero fields get defaults.
type Options struct {
	Size Size
	// SliceUpdates is K (default 1,000); ServiceUpdates default K/100, at
	// least 1.
	SliceUpdates, ServiceUpdates int
	// Writers write the cluster and the churn concurrently (default 8).
	Writers int
	// StartConcurrency is how many kube-proxy-like watchers start (and
	// sync) at once (default 20); kube-proxies of a cluster do not all
	// start in the same second either.
	StartConcurrency int
	// Timeout bounds each awaited phase (default 10m).
	Timeout time.Duration
	// OutDir receives apicost.json and apicost.md ("" writes nothing).
	OutDir string
	// Notes are added to the report.
	Notes []string
	// Logger (default: a test logger at info level).
	Logger *zap.Logger
}

func (o *Options) defaults(t testing.TB) {
	if o.Size == (Size{}) {
		o.Size = FullSize
	}
	if o.SliceUpdates <= 0 {
		o.SliceUpdates = 1000
	}
	if o.ServiceUpdates <= 0 {
		o.ServiceUpdates = max(1, o.SliceUpdates/100)
	}
	if o.Writers <= 0 {
		o.Writers = 8
	}
	if o.StartConcurrency <= 0 {
		o.StartConcurrency = 20
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
}

// Scenario names.
const (
	ScenarioBaseline       = "baseline"
	ScenarioControlPlane   = "vsplane-controlplane"
	ScenarioControlPlanePB = "vsplane-controlplane-protobuf"
	ScenarioKubeProxy      = "kube-proxy-like"
)

// methodNotes describe the method in every report.
var methodNotes = []string{
	"kube-proxy-like watcher: what kube-proxy (cmd/kube-proxy/app/server.go, v1.35+) watches, each with its own client and HTTP/2 connection, protobuf (kube-proxy's default content type): " +
		"Services (label !service.kubernetes.io/service-proxy-name, field spec.clusterIP!=None), EndpointSlices (label !service.kubernetes.io/headless), ServiceCIDRs, and its own Node (field metadata.name=<node>, synced first as kube-proxy's NodeManager does). " +
		"After decoding, each object is reduced to name/namespace/resourceVersion in the client (informer transform) so N caches fit in memory; the API server's side is unchanged.",
	"vsplane control plane: controlplane/watch.New as a replica runs it (Services and EndpointSlices with kube-proxy's label selectors, all Nodes, all Namespaces, SchedulerRollouts), into a sink that keeps the converted objects. " +
		"The -protobuf row is the same watch with kube-proxy's encoding, what vsplane-controlplane asks for since this benchmark showed JSON cost about twice the bytes; the JSON row is its client before that. The ratios compare protobuf with protobuf.",
	"Watch bytes are apiserver_watch_events_sizes_sum: the encoded objects as the API server counts them, before TLS and HTTP/2 framing. Watch events include BOOKMARKs (one per watch at the end of its initial stream, and periodic ones).",
	"Convergence: a kube-proxy-like watcher is done when its caches hold the resourceVersion of the last write of every changed slice and Service and its handlers were told of at least as many updates; the control plane when its sink holds every changed slice's endpoints and Service's label. Polled, no sleeps.",
}

// bench is one run's state.
type bench struct {
	t     testing.TB
	opts  Options
	log   *zap.Logger
	env   *kubeenv.Env
	admin kubernetes.Interface
	world *world
	rep   *Report
	pid   int // kube-apiserver's, for its CPU time; 0 if not found
	// watches are the open watches per resource before any scenario: a
	// scenario starts when its predecessor's watches are gone.
	watches map[Resource]float64
}

// Run runs every scenario and returns the report (also written to
// Options.OutDir). Setup failures fail t; a scenario that does not
// converge is a problem in the report.
func Run(t testing.TB, opts Options) *Report {
	t.Helper()
	opts.defaults(t)
	ctx := t.Context()
	b := &bench{t: t, opts: opts, log: opts.Logger, rep: &Report{
		Time: time.Now().UTC().Format(time.RFC3339), Size: opts.Size,
		SliceUpdates: opts.SliceUpdates, ServiceUpdates: opts.ServiceUpdates,
		Metrics: []string{metricWatchEvents, metricWatchSizes + "_sum/_count", metricDispatched,
			metricRequests + `{verb="LIST"}`, metricResponseSizes + `_sum/_count{verb="LIST"}`, metricLongRunning + `{verb="WATCH"}`},
		Host:  Host{CPUs: runtime.NumCPU(), LoadAvgBefore: measure.LoadAvg(), GoVersion: runtime.Version()},
		Notes: append(slices.Clone(opts.Notes), methodNotes...),
	}}
	b.env = kubeenv.StartForTestWith(t, kubeenv.Options{Logger: b.log.Named("kubeenv")})
	b.rep.Host.KubeBinDir = filepath.Base(filepath.Dir(b.env.BinDir))
	if pid, err := apiserverPID(b.env); err == nil {
		b.pid = pid
	} else {
		b.rep.Notes = append(b.rep.Notes, "kube-apiserver CPU and memory not measured: "+err.Error())
	}
	root, err := measure.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.env.InstallCRDs(ctx, filepath.Join(root, "deploy", "crds")); err != nil {
		t.Fatal(err)
	}
	cfg := b.env.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	if b.admin, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	b.world = newWorld(opts.Size, b.admin)
	t0 := time.Now()
	n, err := b.world.create(ctx, opts.Writers)
	if err != nil {
		t.Fatal(err)
	}
	b.rep.Setup = Setup{Objects: n, Seconds: since(t0), Writers: opts.Writers}
	b.log.Info("cluster created", zap.Int("objects", n), zap.Duration("took", time.Since(t0)))
	s0, err := scrape(ctx, b.admin)
	if err != nil {
		t.Fatal(err)
	}
	b.watches = s0.Watches

	for _, sc := range []struct {
		name, desc string
		run        func(context.Context, *ScenarioResult) error
	}{
		{ScenarioBaseline, "no watcher: the API server's own watchers only", b.runBaseline},
		{ScenarioControlPlane, "one vsplane control-plane watch (controlplane/watch with SchedulerRollouts), JSON as vsplane-controlplane's client asks today", b.runControlPlane(ContentJSON)},
		{ScenarioControlPlanePB, "the same watch with a protobuf client, as kube-proxy's", b.runControlPlane(ContentProtobuf)},
		{ScenarioKubeProxy, fmt.Sprintf("%d kube-proxy-like watchers, one client and connection each, protobuf", opts.Size.Watchers), b.runKubeProxy},
	} {
		res := &ScenarioResult{Name: sc.name, Description: sc.desc}
		b.log.Info("scenario", zap.String("name", sc.name))
		if err := b.awaitQuiet(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sc.run(ctx, res); err != nil {
			b.rep.Problems = append(b.rep.Problems, fmt.Sprintf("%s: %v", sc.name, err))
		}
		b.rep.Scenarios = append(b.rep.Scenarios, res)
		b.log.Info("scenario done", zap.String("name", sc.name),
			zap.Float64("churnWatchEvents", res.Churn.Total.WatchEvents), zap.Float64("churnWatchBytes", res.Churn.Total.WatchBytes))
	}
	b.rep.Host.LoadAvgAfter = measure.LoadAvg()
	b.rep.finish()
	if opts.OutDir != "" {
		if err := b.rep.write(opts.OutDir); err != nil {
			t.Errorf("writing the report: %v", err)
		}
	}
	for _, l := range b.rep.summary() {
		t.Log(l)
	}
	return b.rep
}

// awaitQuiet waits until the open watches of the watched resources are
// back to what they were before any scenario (the previous scenario's
// watchers are gone).
func (b *bench) awaitQuiet(ctx context.Context) error {
	var last Scrape
	var err error
	ok := func() bool {
		if last, err = scrape(ctx, b.admin); err != nil {
			return true
		}
		for _, r := range watchedResources {
			if last.Watches[r] > b.watches[r] {
				return false
			}
		}
		return true
	}
	if werr := await(ctx, b.opts.Timeout, "previous scenario's watches closed", ok); werr != nil {
		return werr
	}
	return err
}

// phase runs start (the scenario's watchers until synced) and then the
// churn with converged as its end, scraping the metrics around both.
func (b *bench) phase(ctx context.Context, res *ScenarioResult, start func() error, converged func(*want) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m0, err := scrape(ctx, b.admin)
	if err != nil {
		return err
	}
	cpu0, rss0 := b.apiserverStats()
	t0 := time.Now()
	if err := start(); err != nil {
		return err
	}
	res.SyncSeconds = since(t0)
	m1, err := scrape(ctx, b.admin)
	if err != nil {
		return err
	}
	cpu1, rss1 := b.apiserverStats()
	res.Initial = m1.delta(m0)
	res.APIServer.SyncCPUSeconds = cpu1 - cpu0
	res.APIServer.RSSBytesBefore, res.APIServer.RSSBytesSynced = rss0, rss1

	t1 := time.Now()
	w, err := b.world.churn(ctx, b.opts.SliceUpdates, b.opts.ServiceUpdates, b.opts.Writers)
	if err != nil {
		return err
	}
	res.ChurnWriteSeconds = since(t1)
	if err := await(ctx, b.opts.Timeout, "every watcher saw the churn", func() bool { return converged(w) }); err != nil {
		return err
	}
	res.Converged = true
	res.ConvergeSeconds = since(t1)
	m2, err := scrape(ctx, b.admin)
	if err != nil {
		return err
	}
	cpu2, _ := b.apiserverStats()
	res.Churn = m2.delta(m1)
	res.APIServer.ChurnCPUSeconds = cpu2 - cpu1
	return nil
}

// baselineWait bounds the wait for the API server's own watchers.
const baselineWait = 15 * time.Second

func (b *bench) runBaseline(ctx context.Context, res *ScenarioResult) error {
	// The API server's own informers cannot be asked what they hold; the
	// churn is over for them when the metrics show one event per write for
	// slices and Services (one watcher each of its own, as v1.37 has). If
	// that does not come, the baseline is what came within baselineWait.
	var before Scrape
	var deadline time.Time
	start := func() (err error) {
		before, err = scrape(ctx, b.admin)
		return err
	}
	converged := func(w *want) bool {
		if deadline.IsZero() {
			deadline = time.Now().Add(baselineWait)
		}
		now, err := scrape(ctx, b.admin)
		if err != nil {
			return false
		}
		d := now.delta(before)
		if d.Of(resSlices).WatchEvents >= float64(w.sliceUpdates) && d.Of(resServices).WatchEvents >= float64(w.serviceUpdates) {
			return true
		}
		if time.Now().After(deadline) {
			b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("baseline: the API server's own watchers were sent fewer events than writes within %v: %+v", baselineWait, d.Total))
			return true
		}
		return false
	}
	return b.phase(ctx, res, start, converged)
}

func (b *bench) runControlPlane(contentType string) func(context.Context, *ScenarioResult) error {
	return func(ctx context.Context, res *ScenarioResult) (retErr error) {
		var cs conns
		res.Watchers, res.ContentType = 1, contentType
		c, err := newCPWatcher(b.env.RESTConfig(), &cs, contentType, b.log.Named("watch"))
		if err != nil {
			return err
		}
		defer func() {
			if err := c.stop(); err != nil && !errors.Is(err, context.Canceled) {
				retErr = errors.Join(retErr, err)
			}
			res.Connections = cs.n.Load()
		}()
		return b.phase(ctx, res, func() error { return c.start(ctx, b.opts.Timeout) }, c.seen)
	}
}

func (b *bench) runKubeProxy(ctx context.Context, res *ScenarioResult) error {
	var cs conns
	var strip stripper
	res.Watchers, res.ContentType = len(b.world.nodes), ContentProtobuf
	ws := make([]*proxyWatcher, len(b.world.nodes))
	defer func() {
		g := errgroup.Group{}
		g.SetLimit(50)
		for _, w := range ws {
			if w != nil {
				g.Go(func() error { w.stop(); return nil })
			}
		}
		_ = g.Wait()
		res.Connections = cs.n.Load()
	}()
	for i, n := range b.world.nodes {
		w, err := newProxyWatcher(b.env.RESTConfig(), &cs, &strip, n)
		if err != nil {
			return err
		}
		ws[i] = w
	}
	start := func() error {
		sctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
		defer cancel()
		g, gctx := errgroup.WithContext(sctx)
		g.SetLimit(b.opts.StartConcurrency)
		for _, w := range ws {
			g.Go(func() error { return w.start(ctx, gctx) })
		}
		return g.Wait()
	}
	sliceMarks, svcMarks := map[*proxyWatcher]int64{}, map[*proxyWatcher]int64{}
	var left []*proxyWatcher
	converged := func(w *want) bool {
		if left == nil {
			left = slices.Clone(ws)
		}
		left = pending(left, func(p *proxyWatcher) bool { return p.seen(w, sliceMarks[p], svcMarks[p]) })
		return len(left) == 0
	}
	// The marks are taken after the start: phase scrapes, then churns.
	startAndMark := func() error {
		if err := start(); err != nil {
			return err
		}
		for _, w := range ws {
			sliceMarks[w], svcMarks[w] = w.sliceEvents.Load(), w.svcEvents.Load()
		}
		return nil
	}
	return b.phase(ctx, res, startAndMark, converged)
}

// apiserverStats returns kube-apiserver's CPU seconds (user+system) and
// resident memory so far; zeros if its process is unknown.
func (b *bench) apiserverStats() (cpuSeconds float64, rssBytes int64) {
	if b.pid == 0 {
		return 0, 0
	}
	return procStats(b.pid)
}

// apiserverPID finds the env's kube-apiserver among this process's
// children by its --cert-dir (which is under the env's own directory).
func apiserverPID(env *kubeenv.Env) (int, error) {
	pids, err := measure.PIDs()
	if err != nil {
		return 0, err
	}
	want := "--cert-dir=" + filepath.Join(env.Dir, "apiserver-certs")
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == "kube-apiserver" && slices.Contains(args, want) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no kube-apiserver process with %s", want)
}

// procStats is pid's CPU seconds (utime+stime) and VmRSS in bytes, each
// zero if it cannot be read.
func procStats(pid int) (float64, int64) {
	st, _ := measure.ReadStat(pid)
	mem, _ := measure.ReadStatus(pid)
	return st.CPUSeconds(), mem.RSSBytes()
}

func since(t time.Time) float64 { return time.Since(t).Seconds() }
