// Package fanout measures how the control plane fans one cluster out to many
// agents: a real kube-apiserver + etcd (kubeenv) holding S Services with E
// endpoints each and N Nodes, one control-plane replica as its own process
// (vsplane-controlplane, built by the run), and N agents in this process,
// each a real dataplane/client stream over TLS with its node's bound token,
// applying into a reconcile.Reconciler on an in-memory kernel.
//
// Run measures, in order: the cold start (every agent connects to a ready
// replica and acknowledges its full state), single EndpointSlice changes,
// a burst changing a share of the slices at once, and a reconnect storm
// (every stream cut and reopened with the versions held). It checks that
// every agent ends with exactly the expected IPVS state and that the storm
// resent nothing. See README.md; the tests are TestFanoutTiny (CI) and
// TestFanoutBench (build tag fanoutbench).
package fanout

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/e2e/kubeenv"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/internal/testpki"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// FullSize is the size issue #12 asks for.
var FullSize = Size{Nodes: 1000, Services: 10000, Endpoints: 10}

// Options configure Run. Zero fields get defaults.
type Options struct {
	Size Size
	// Changes is the number of single changes (default 20).
	Changes int
	// ChurnShare is the share of slices the burst changes (default 0.10);
	// BurstWriters write them concurrently (default 10).
	ChurnShare   float64
	BurstWriters int
	// CreateWriters create the cluster's objects concurrently (default 16).
	CreateWriters int
	// Timeout bounds each awaited phase (default 10m); ReadyTimeout the
	// control plane's start (default 10m).
	Timeout, ReadyTimeout time.Duration
	// VerifyAgents is how many agents' kernels are compared with the
	// expected state at the end, spread over the nodes (0: all).
	VerifyAgents int
	// ControlPlaneArgs are extra vsplane-controlplane flags (after the
	// benchmark's own: --kubeconfig, --listen, TLS files, --metrics-address "").
	ControlPlaneArgs []string
	// ControlPlaneEnv is extra environment (KEY=VALUE) of the control
	// plane's process, beside this process's own.
	ControlPlaneEnv []string
	// IdleWindow is how long the idle baseline (every agent connected,
	// nothing changing) is measured (default 5s).
	IdleWindow time.Duration
	// Out names the report: <Dir>/<Out>.json and .md (default "fanout").
	Out string
	// Dir is where the report goes (default bench/results at the
	// repository root; tests use a temporary directory).
	Dir string
	// Notes are added to the report.
	Notes []string
}

func (o *Options) defaults() {
	if o.Size == (Size{}) {
		o.Size = FullSize
	}
	if o.Size.Endpoints == 0 {
		o.Size.Endpoints = 10
	}
	if o.Changes == 0 {
		o.Changes = 20
	}
	if o.ChurnShare == 0 {
		o.ChurnShare = 0.10
	}
	if o.BurstWriters == 0 {
		o.BurstWriters = 10
	}
	if o.CreateWriters == 0 {
		o.CreateWriters = 16
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Minute
	}
	if o.Out == "" {
		o.Out = "fanout"
	}
	if o.IdleWindow == 0 {
		o.IdleWindow = 5 * time.Second
	}
}

// bench is one run.
type bench struct {
	t    testing.TB
	o    Options
	ctx  context.Context
	log  *zap.Logger
	clk  *clock
	rep  *Report
	root string
	dir  string

	env   *kubeenv.Env
	kube  kubernetes.Interface
	w     *world
	cp    *cpProc
	insp  vsplanev1.InspectServiceClient
	fleet *Fleet
	// kubeSvcIP is the default/kubernetes Service's ClusterIP (every node
	// gets its virtual server, without real servers).
	kubeSvcIP string
	cold      Counters
}

// Run sets up the cluster, runs every phase and writes the report. Any
// setup failure, timeout or correctness problem fails t; times are only
// reported.
func Run(t testing.TB, o Options) *Report {
	t.Helper()
	o.defaults()
	b := &bench{t: t, o: o, ctx: t.Context(), clk: newClock(),
		log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		rep: &Report{Time: time.Now().UTC().Format(time.RFC3339), Size: o.Size,
			Host: Host{CPUs: runtime.NumCPU(), LoadAvgBefore: measure.LoadAvg(), GoVersion: runtime.Version()}}}
	b.rep.Transport = "TLS with the test CA (internal/testpki, internal/tlsfiles), every agent authenticating with " +
		"a projected ServiceAccount token bound to a Pod on its node (TokenReview by the control plane), as in e2e/integration's auth test and e2e/cluster"
	b.rep.BytesMethod = "wire = bytes read by the agents' TCP sockets (a counting net.Conn under gRPC: Deltas with gRPC, " +
		"HTTP/2 and TLS framing, handshakes, keepalives); payload = proto.Size of every Delta the agents received (a tap between client and reconciler)"
	b.setup()
	b.coldStart()
	b.idle()
	b.singleChanges()
	b.burst()
	b.reconnect()
	b.verify()
	b.finish()
	return b.rep
}

func (b *bench) fatalf(format string, args ...any) {
	b.t.Helper()
	b.t.Fatalf(format, args...)
}

func (b *bench) problem(format string, args ...any) {
	b.t.Helper()
	msg := fmt.Sprintf(format, args...)
	b.rep.Problems = append(b.rep.Problems, msg)
	b.t.Errorf("%s", msg)
}

func (b *bench) setup() {
	t, ctx := b.t, b.ctx
	var err error
	if b.root, err = measure.RepoRoot("."); err != nil {
		b.fatalf("%v", err)
	}
	b.dir = t.TempDir()
	b.rep.Source = gitSource(ctx, b.root)
	type built struct {
		bin string
		err error
	}
	binc := make(chan built, 1)
	go func() {
		bin, err := buildControlPlane(ctx, b.root, b.dir)
		binc <- built{bin, err}
	}()

	b.env = kubeenv.StartForTestWith(t, kubeenv.Options{})
	rc := b.env.RESTConfig()
	rc.QPS = -1 // no client-side limit: the writers go as fast as the API server answers
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	if b.kube, err = kubernetes.NewForConfig(rc); err != nil {
		b.fatalf("%v", err)
	}
	b.w = newWorld(b.o.Size, b.kube)
	tokenDir := filepath.Join(b.dir, "tokens")
	if err := os.MkdirAll(tokenDir, 0o700); err != nil {
		b.fatalf("%v", err)
	}
	start := time.Now()
	tokenFiles, objects, err := b.w.create(ctx, b.o.CreateWriters, tokenDir)
	if err != nil {
		b.fatalf("creating the cluster: %v", err)
	}
	took := time.Since(start).Seconds()
	b.rep.Setup = Setup{Objects: objects, CreateSeconds: took, ObjectsPerSecond: float64(objects) / took, Writers: b.o.CreateWriters}
	t.Logf("created %d objects (%s) in %.1fs (%.0f/s)", objects, b.o.Size, took, float64(objects)/took)
	ks, err := b.kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		b.fatalf("default/kubernetes Service: %v", err)
	}
	b.kubeSvcIP = ks.Spec.ClusterIP

	// TLS and the control plane's own token (used here for inspection).
	ca, err := testpki.NewCA("vsplane fanout CA")
	if err != nil {
		b.fatalf("%v", err)
	}
	files, err := ca.WriteServer(b.dir)
	if err != nil {
		b.fatalf("%v", err)
	}
	cpTok, err := b.w.token(ctx, CPAccount, nil, nil)
	if err != nil {
		b.fatalf("%v", err)
	}
	cpTokFile := filepath.Join(b.dir, "controlplane.token")
	if err := os.WriteFile(cpTokFile, []byte(cpTok), 0o600); err != nil {
		b.fatalf("%v", err)
	}
	cli, err := tlsfiles.NewClient(files.CA, testpki.ServerName)
	if err != nil {
		b.fatalf("%v", err)
	}
	bin := <-binc
	if bin.err != nil {
		b.fatalf("%v", bin.err)
	}
	// --rollouts=false: SchedulerRollouts play no part in the fan-out, and
	// without them no CRD need be installed and no leader Lease is renewed
	// during the measurement.
	args := append([]string{"--kubeconfig", b.env.Kubeconfig, "--rollouts=false",
		"--tls-cert-file", files.Cert, "--tls-key-file", files.Key, "--tls-ca-file", files.CA}, b.o.ControlPlaneArgs...)
	if os.Getenv(ProfileEnv) != "" {
		args = append(args, "--profiling") // heap profiles (profile.go)
	}
	for attempt := 0; ; attempt++ {
		p, err := startControlPlane(bin.bin, b.dir, attempt, args, b.o.ControlPlaneEnv)
		if err != nil {
			b.fatalf("%v", err)
		}
		t.Cleanup(p.Stop)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("control plane log tail (%s):\n%s", p.logPath, p.LogTail(40))
			}
		})
		started := b.clk.now()
		conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())))
		if err != nil {
			b.fatalf("%v", err)
		}
		err = awaitServing(ctx, p, conn, b.o.ReadyTimeout)
		conn.Close()
		if err != nil && attempt < 2 && p.portLost() {
			continue
		}
		if err != nil {
			b.fatalf("%v", err)
		}
		b.cp = p
		b.rep.ControlPlane.ReadySeconds = secs(b.clk.now() - started)
		break
	}
	b.rep.ControlPlane.Args, b.rep.ControlPlane.Env = b.cp.Args, b.o.ControlPlaneEnv
	st, err := readProcStat(b.cp.Pid())
	if err != nil {
		b.fatalf("control plane /proc: %v", err)
	}
	b.rep.ControlPlane.ReadyCPUSeconds, b.rep.ControlPlane.RSSBytesWhenReady, b.rep.ControlPlane.PeakRSSWhenReady = st.CPUSeconds, st.RSSBytes, st.HWMBytes
	t.Logf("control plane (pid %d) serving after %.1fs, %.1f CPU s, RSS %s", b.cp.Pid(), b.rep.ControlPlane.ReadySeconds, st.CPUSeconds, human(st.RSSBytes))
	ic, err := dialInspection(b.cp.Addr, credentials.NewTLS(cli.Config()), cpTokFile)
	if err != nil {
		b.fatalf("%v", err)
	}
	t.Cleanup(func() { ic.Close() })
	b.insp = vsplanev1.NewInspectServiceClient(ic)

	if b.fleet, err = newFleet(ctx, b.cp.Addr, cli.Config(), b.w.nodes, tokenFiles, b.clk, b.log); err != nil {
		b.fatalf("%v", err)
	}
	// Runs before the control plane's and kubeenv's cleanups.
	t.Cleanup(b.fleet.StopAll)
}

// sample is the state of every counter at one moment.
type sample struct {
	t                     int64
	c                     Counters
	cp                    procStat
	self, apiserver, etcd float64
	reviews               int64
	reviewErr             error
	cpHeap, cpNextGC      int64
}

func (b *bench) sample() sample {
	s := sample{t: b.clk.now(), c: b.fleet.Counters(), self: selfCPU()}
	s.cp, _ = readProcStat(b.cp.Pid())
	s.cpHeap, s.cpNextGC, _ = b.cp.heap(b.ctx)
	if pid := childByName("kube-apiserver"); pid > 0 {
		st, _ := readProcStat(pid)
		s.apiserver = st.CPUSeconds
	}
	if pid := childByName("etcd"); pid > 0 {
		st, _ := readProcStat(pid)
		s.etcd = st.CPUSeconds
	}
	s.reviews, s.reviewErr = b.tokenReviews()
	return s
}

func (b *bench) cost(s0, s1 sample, seconds float64) PhaseCost {
	d := s1.c.Sub(s0.c)
	if s0.reviewErr != nil || s1.reviewErr != nil {
		b.t.Logf("counting TokenReviews: %v %v", s0.reviewErr, s1.reviewErr)
	}
	return PhaseCost{Seconds: seconds, WireBytesToAgents: d.WireIn, WireBytesFromAgents: d.WireOut,
		PayloadBytes: d.PayloadBytes, Deltas: d.Deltas, Resources: d.Resources, Removed: d.Removed, NACKs: d.NACKs,
		ControlPlaneCPUSeconds: s1.cp.CPUSeconds - s0.cp.CPUSeconds, TestProcessCPUSeconds: s1.self - s0.self,
		APIServerCPUSeconds: s1.apiserver - s0.apiserver, EtcdCPUSeconds: s1.etcd - s0.etcd,
		TokenReviews: s1.reviews - s0.reviews, ControlPlaneRSSBytes: s1.cp.RSSBytes, ControlPlanePeakRSSBytes: s1.cp.HWMBytes,
		ControlPlaneHeapAllocBytes: s1.cpHeap, ControlPlaneNextGCBytes: s1.cpNextGC}
}

// tokenReviews is the API server's count of TokenReview requests
// (apiserver_request_total, from its /metrics).
func (b *bench) tokenReviews() (int64, error) {
	raw, err := b.kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(b.ctx)
	if err != nil {
		return 0, err
	}
	var n float64
	for _, l := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `resource="tokenreviews"`) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", l, err)
		}
		n += v
	}
	return int64(n), nil
}

func (b *bench) coldStart() {
	targets := map[string]string{wire.NodeSettingsResource: ""}
	for _, s := range b.w.svcs {
		targets[s.resource()] = s.ips[0]
	}
	s0 := b.sample()
	ws := b.fleet.Watch(targets, true)
	start := b.clk.now()
	stopHeaps := b.profileHeaps("cold", 3*time.Second)
	if err := b.fleet.StartAll(b.ctx, true); err != nil {
		b.fatalf("%v", err)
	}
	if err := ws.Wait(b.ctx, b.o.Timeout); err != nil {
		b.fatalf("cold start: %v", err)
	}
	stopHeaps()
	s1 := b.sample()
	failures := b.fleet.StreamEnds()
	b.fleet.Unwatch(ws)
	b.cold = s1.c.Sub(s0.c)
	last := ws.LastAck()
	var sync, firstRecv []float64
	var firstAll int64
	for a := range last {
		sync = append(sync, secs(last[a]-start))
		acked, recv := ws.FirstDelta(a)
		firstAll = max(firstAll, acked-start)
		firstRecv = append(firstRecv, secs(recv-start))
	}
	n := int64(len(last))
	cs := ColdStart{PhaseCost: b.cost(s0, s1, secs(slices.Max(last)-start)), AllFirstDeltaSeconds: secs(firstAll)}
	cs.AgentSyncP50Seconds, cs.AgentSyncP99Seconds = quantile(sync, 0.5), quantile(sync, 0.99)
	cs.FirstDeltaReceivedP50Seconds, cs.FirstDeltaReceivedMaxSeconds = quantile(firstRecv, 0.5), slices.Max(firstRecv)
	cs.WireBytesPerAgent, cs.PayloadBytesPerAgent = cs.WireBytesToAgents/n, cs.PayloadBytes/n
	cs.DeltasPerAgent = float64(cs.Deltas) / float64(n)
	cs.StreamFailures = failures
	b.rep.ColdStart = cs
	b.t.Logf("cold start: %d agents in sync after %.2fs (first Deltas received within %.2fs, p50 %.2fs; acknowledged within %.2fs), %s on the wire, %s payload, %d Deltas, control plane %.2f CPU s",
		n, cs.Seconds, cs.FirstDeltaReceivedMaxSeconds, cs.FirstDeltaReceivedP50Seconds, cs.AllFirstDeltaSeconds, human(cs.WireBytesToAgents), human(cs.PayloadBytes), cs.Deltas, cs.ControlPlaneCPUSeconds)
	b.awaitInSync("after the cold start")
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	cs = b.rep.ColdStart
	cs.AgentHeapBytes = int64(m.HeapAlloc)
	cs.AgentHeapPerAgent = cs.AgentHeapBytes / n
	cs.AgentHeapPerAgentService = cs.AgentHeapPerAgent / int64(max(1, b.o.Size.Services))
	b.rep.ColdStart = cs
	b.t.Logf("live heap of this process after the cold start: %s (%s per agent, %d B per agent x Service)",
		human(cs.AgentHeapBytes), human(cs.AgentHeapPerAgent), cs.AgentHeapPerAgentService)
}

// idle measures what the control plane and the others cost with every agent
// connected and nothing changing: the baseline the phases' CPU compares to.
func (b *bench) idle() {
	s0 := b.sample()
	t := time.NewTimer(b.o.IdleWindow)
	select {
	case <-b.ctx.Done():
		t.Stop()
		b.fatalf("%v", b.ctx.Err())
	case <-t.C:
	}
	s1 := b.sample()
	b.rep.Idle = b.cost(s0, s1, secs(s1.t-s0.t))
	b.t.Logf("idle for %.1fs: control plane %.3f CPU s (%.1f%% of a core), %s to the agents",
		b.rep.Idle.Seconds, b.rep.Idle.ControlPlaneCPUSeconds, 100*b.rep.Idle.ControlPlaneCPUSeconds/b.rep.Idle.Seconds, human(b.rep.Idle.WireBytesToAgents))
}

// idleCPU is the control plane's idle CPU over seconds.
func (b *bench) idleCPU(seconds float64) float64 {
	if b.rep.Idle.Seconds == 0 {
		return 0
	}
	return b.rep.Idle.ControlPlaneCPUSeconds / b.rep.Idle.Seconds * seconds
}

func (b *bench) singleChanges() {
	S, E := b.o.Size.Services, b.o.Size.Endpoints
	sc := SingleChange{Changes: b.o.Changes}
	var all, allRecv, allSent []float64
	stopProfile := b.profilePhase("single")
	s0 := b.sample()
	for k := range b.o.Changes {
		i, j := (k*S)/b.o.Changes, k%E
		ip := b.w.newIP(i)
		name := b.w.svcs[i].resource()
		c0 := b.fleet.Counters()
		ws := b.fleet.Watch(map[string]string{name: ip}, false)
		sent := b.clk.now()
		if err := b.w.replace(b.ctx, i, j, ip); err != nil {
			b.fatalf("%v", err)
		}
		resp := b.clk.now()
		if err := ws.Wait(b.ctx, b.o.Timeout); err != nil {
			b.fatalf("change %d (%s): %v", k, name, err)
		}
		d := b.fleet.Counters().Sub(c0)
		b.fleet.Unwatch(ws)
		var lat []float64
		for a := range b.fleet.Agents() {
			lat = append(lat, ms(ws.Ack(name, a)-resp))
			allRecv = append(allRecv, ms(ws.Received(name, a)-resp))
			allSent = append(allSent, ms(ws.Ack(name, a)-sent))
		}
		all = append(all, lat...)
		cs := ChangeStats{Service: name, WireBytes: d.WireIn, PayloadBytes: d.PayloadBytes, Deltas: d.Deltas}
		cs.P50MS, cs.P99MS, cs.MaxMS = quantile(lat, 0.5), quantile(lat, 0.99), slices.Max(lat)
		sc.PerChange = append(sc.PerChange, cs)
	}
	s1 := b.sample()
	stopProfile()
	sc.Total = b.cost(s0, s1, secs(s1.t-s0.t))
	sc.Samples = len(all)
	sc.LatencyP50MS, sc.LatencyP99MS, sc.LatencyMaxMS = quantile(all, 0.5), quantile(all, 0.99), slices.Max(all)
	sc.ReceivedP50MS, sc.ReceivedP99MS = quantile(allRecv, 0.5), quantile(allRecv, 0.99)
	sc.FromSentP50MS, sc.FromSentP99MS = quantile(allSent, 0.5), quantile(allSent, 0.99)
	n := float64(b.o.Changes)
	sc.WireBytesPerChange = float64(sc.Total.WireBytesToAgents) / n
	sc.PayloadBytesPerChange = float64(sc.Total.PayloadBytes) / n
	sc.DeltasPerChange = float64(sc.Total.Deltas) / n
	sc.CPUSecondsPerChange = sc.Total.ControlPlaneCPUSeconds / n
	sc.CPUSecondsPerChangeNetOfIdle = (sc.Total.ControlPlaneCPUSeconds - b.idleCPU(sc.Total.Seconds)) / n
	b.rep.SingleChange = sc
	b.t.Logf("single change x%d: p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d (agent, change) samples (received: p50 %.1f ms, p99 %.1f ms); %s wire, %.1f Deltas, %.3f control-plane CPU s per change",
		b.o.Changes, sc.LatencyP50MS, sc.LatencyP99MS, sc.LatencyMaxMS, sc.Samples, sc.ReceivedP50MS, sc.ReceivedP99MS, human(int64(sc.WireBytesPerChange)), sc.DeltasPerChange, sc.CPUSecondsPerChange)
}

func (b *bench) burst() {
	S, E := b.o.Size.Services, b.o.Size.Endpoints
	step := max(1, int(math.Round(1/b.o.ChurnShare)))
	var idx []int
	for i := step / 2; i < S; i += step {
		idx = append(idx, i)
	}
	targets := map[string]string{}
	ips := make([]string, len(idx))
	for m, i := range idx {
		ips[m] = b.w.newIP(i)
		targets[b.w.svcs[i].resource()] = ips[m]
	}
	sent, resp := make([]int64, len(idx)), make([]int64, len(idx))
	stopProfile := b.profilePhase("burst")
	s0 := b.sample()
	ws := b.fleet.Watch(targets, false)
	start := b.clk.now()
	var next atomic.Int64
	g, gctx := errgroup.WithContext(b.ctx)
	for range b.o.BurstWriters {
		g.Go(func() error {
			for {
				m := int(next.Add(1) - 1)
				if m >= len(idx) {
					return nil
				}
				sent[m] = b.clk.now()
				if err := b.w.replace(gctx, idx[m], m%E, ips[m]); err != nil {
					return err
				}
				resp[m] = b.clk.now()
			}
		})
	}
	if err := g.Wait(); err != nil {
		b.fatalf("burst: %v", err)
	}
	written := b.clk.now()
	if err := ws.Wait(b.ctx, b.o.Timeout); err != nil {
		b.fatalf("burst: %v", err)
	}
	s1 := b.sample()
	stopProfile()
	b.fleet.Unwatch(ws)
	bu := Burst{Slices: len(idx), Writers: b.o.BurstWriters, WriteSeconds: secs(written - start)}
	var lat, recv, fromSent []float64
	var last int64
	for m, i := range idx {
		name := b.w.svcs[i].resource()
		for a := range b.fleet.Agents() {
			at := ws.Ack(name, a)
			last = max(last, at)
			if at < resp[m] {
				bu.AcksBeforeResponse++
			}
			lat = append(lat, ms(at-resp[m]))
			recv = append(recv, ms(ws.Received(name, a)-resp[m]))
			fromSent = append(fromSent, ms(at-sent[m]))
		}
	}
	bu.ReceivedP50MS, bu.ReceivedP99MS = quantile(recv, 0.5), quantile(recv, 0.99)
	bu.FromSentP50MS, bu.FromSentP99MS = quantile(fromSent, 0.5), quantile(fromSent, 0.99)
	bu.PhaseCost = b.cost(s0, s1, secs(last-start))
	bu.ConvergeSeconds = bu.Seconds
	bu.Samples = len(lat)
	bu.LatencyP50MS, bu.LatencyP99MS, bu.LatencyMaxMS = quantile(lat, 0.5), quantile(lat, 0.99), slices.Max(lat)
	b.rep.Burst = bu
	b.t.Logf("burst of %d slices (%d writers, written in %.2fs): p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d samples; all converged %.2fs after the first write; %s wire, %d Deltas",
		bu.Slices, bu.Writers, bu.WriteSeconds, bu.LatencyP50MS, bu.LatencyP99MS, bu.LatencyMaxMS, bu.Samples, bu.ConvergeSeconds, human(bu.WireBytesToAgents), bu.Deltas)
}

// reconnect cuts every agent's stream and reopens them all at once, twice:
// first with new clients (every agent process restarted with its saved
// state), then with the same clients (a replica lost); both resume by
// system version.
func (b *bench) reconnect() {
	b.awaitInSync("before the restart storm")
	b.rep.StreamFailuresBeforeStorm = b.fleet.StreamEnds() - b.rep.ColdStart.StreamFailures
	b.rep.RestartStorm = b.storm("restart storm", true)
	b.awaitInSync("before the reconnect storm")
	b.rep.Reconnect = b.storm("reconnect storm", false)
	b.rep.HelloBytesRatio = float64(b.rep.Reconnect.WireBytesFromAgents) / float64(max(b.rep.RestartStorm.WireBytesFromAgents, 1))
}

func (b *bench) storm(name string, fresh bool) Reconnect {
	ends := b.fleet.StreamEnds()
	b.fleet.StopAll()
	s0 := b.sample()
	ws := b.fleet.Watch(nil, true)
	start := b.clk.now()
	stopHeaps := b.profileHeaps(strings.ReplaceAll(name, " ", "-"), 300*time.Millisecond)
	if err := b.fleet.StartAll(b.ctx, fresh); err != nil {
		b.fatalf("%v", err)
	}
	if err := ws.Wait(b.ctx, b.o.Timeout); err != nil {
		b.fatalf("%s: %v", name, err)
	}
	stopHeaps()
	s1 := b.sample()
	b.fleet.Unwatch(ws)
	var last int64
	for a := range b.fleet.Agents() {
		acked, _ := ws.FirstDelta(a)
		last = max(last, acked)
	}
	rc := Reconnect{PhaseCost: b.cost(s0, s1, secs(last-start)), FreshClients: fresh}
	rc.WireRatio = float64(rc.WireBytesToAgents) / float64(b.cold.WireIn)
	rc.BothWaysRatio = float64(rc.WireBytesToAgents+rc.WireBytesFromAgents) / float64(b.cold.WireIn)
	rc.PayloadRatio = float64(rc.PayloadBytes) / float64(b.cold.PayloadBytes)
	b.t.Logf("%s: %d agents back in sync after %.2fs; %s wire (%.4f%% of the cold start's %s), %d resources and %d removals resent, %d TokenReviews; %s from the agents (Hellos)",
		name, len(b.fleet.Agents()), rc.Seconds, human(rc.WireBytesToAgents), 100*rc.WireRatio, human(b.cold.WireIn), rc.Resources, rc.Removed, rc.TokenReviews, human(rc.WireBytesFromAgents))
	if rc.Resources != 0 || rc.Removed != 0 {
		b.problem("the %s resent %d resources and %d removals the agents already held (want none)", name, rc.Resources, rc.Removed)
	}
	rc.StreamFailures = b.fleet.StreamEnds() - ends
	return rc
}

func (b *bench) finish() {
	st, err := readProcStat(b.cp.Pid())
	if err != nil {
		b.problem("control plane /proc after the run: %v (did it exit? %s)", err, b.cp.LogTail(10))
	}
	cp := &b.rep.ControlPlane
	cp.CPUSecondsTotal, cp.PeakRSSBytes, cp.RSSBytesAtEnd = st.CPUSeconds, st.HWMBytes, st.RSSBytes
	b.rep.Host.LoadAvgAfter = measure.LoadAvg()
	if self, err := readProcStat(os.Getpid()); err == nil {
		b.rep.Host.TestProcessPeakRSSBytes = self.HWMBytes
	}
	b.rep.Goals = []Goal{
		goal("single change p99 (write response -> every agent's Ack)", b.rep.SingleChange.LatencyP99MS, 250, "ms"),
		goal(fmt.Sprintf("%.0f%% burst p99 (write response -> Ack, per agent and Service)", 100*b.o.ChurnShare), b.rep.Burst.LatencyP99MS, 1000, "ms"),
		goal("reconnect storm bytes, both ways / cold-start bytes to agents (wire)", 100*b.rep.Reconnect.BothWaysRatio, 1, "%"),
	}
	b.rep.Notes = append(b.rep.Notes, b.o.Notes...)
	b.rep.Notes = append(b.rep.Notes,
		"Agents, writers and the harness share one process (test_process_cpu_seconds); the control plane is its own process (vsplane-controlplane with its default flags plus the ones in control_plane.args, with control_plane.env if set); CPU from /proc/<pid>/stat, peak RSS = VmHWM.",
		"Latencies are taken in this process on one monotonic clock: a write's time is when the API server's response arrived, an Ack's when the agent's Apply returned and the client sends it.",
		"At most GOMAXPROCS agents apply at once (a semaphore around the reconciler's Apply): with all of them runnable the gRPC transport goroutines starved (keepalive and TLS-handshake timeouts, retried streams) in early runs; the wait for a slot is part of the agent's time, after 'received'.",
		"Agents run the reconciler with a 1h full-reconcile period (as the integration tests' agents), so no periodic full reconcile runs during the measurement.",
		"Every agent's apply work runs here, on the same cores as the control plane, the API server and etcd (real nodes apply on their own CPUs): compare test_process_cpu_seconds with control_plane_cpu_seconds per phase to see where the time went; 'received' latencies stop before the agent's own apply.",
		fmt.Sprintf("The machine is shared (load average %s before, %s after): absolute times may be inflated.", b.rep.Host.LoadAvgBefore, b.rep.Host.LoadAvgAfter))
	for _, h := range b.rep.Headlines() {
		b.t.Log(h)
	}
	dir := b.o.Dir
	if dir == "" {
		dir = filepath.Join(b.root, "bench", "results")
	}
	if err := b.rep.write(dir, b.o.Out); err != nil {
		b.t.Errorf("writing the report: %v", err)
	} else {
		b.t.Logf("wrote %s.{json,md}", filepath.Join(dir, b.o.Out))
	}
}
