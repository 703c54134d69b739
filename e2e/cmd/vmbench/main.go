// Command vmbench measures the agent's reconciler on the real kernel of the
// network namespace it runs in (the apply-time measurement). It is a static binary run
// inside the QEMU test bed (e2e/vmbench drives it), in a fresh node namespace:
//
//	vmbench --services N [--changes K] [--removes R]
//
// It uses agent.NewLinuxKernel + reconcile.New directly (no control plane):
//
//  1. cold start: one ReplaceAll Delta with N ClusterIP Services into an empty
//     kernel (one TCP port each, ClusterIP 198.18.x.y, 2 endpoints in
//     198.19.0.0/16);
//  2. K Deltas that each change one endpoint of one Service (a different
//     Service each time): median/p90 per Apply, kernel_operations of one;
//  3. R times: add one extra Service, then remove it (the removal unbinds its
//     address from kube-ipvs0 while N others stay bound).
//
// --endpoints sets the endpoints per Service (default 2). --unbatched makes
// every batched kernel path one netlink request per item (IPVS writes,
// ipset entry writes, kube-ipvs0 binds/unbinds: the path before batching,
// the baseline). --chunk-ops K applies the cold start as consecutive Deltas of
// at most K estimated kernel operations each, like the control plane's
// bounded Deltas, and reports each Service's latency from the start of the
// burst to the Ack of the Delta that carried it.
//
// The result is one JSON object on stdout; logs go to stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vmbench"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// maxServices keeps every ClusterIP inside 198.18.0.0/16 (250 per /24,
// third octet 0..254, the extra Service takes 198.18.255.1).
const maxServices = 250 * 255

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "vmbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("vmbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("services", 1000, "ClusterIP Services applied at cold start (1.."+fmt.Sprint(maxServices)+")")
	changes := fs.Int("changes", 50, "one-endpoint-change Applies to time (>= 1)")
	removes := fs.Int("removes", 10, "add+remove pairs of one extra Service to time (>= 0)")
	endpoints := fs.Int("endpoints", 2, "endpoints per Service (2..90)")
	unbatched := fs.Bool("unbatched", false, "one netlink request per kernel write: IPVS, ipset entries and kube-ipvs0 addresses (the baseline before batching)")
	chunkOps := fs.Int("chunk-ops", 0, "apply the cold start as Deltas of at most this many estimated kernel operations (0: one Delta)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the cold start to this file (a diagnosis aid)")
	fullPasses := fs.Int("full-passes", 0, "periodic full reconciles to time after the changes, nothing changing (>= 0)")
	passProfile := fs.String("pass-cpuprofile", "", "write a CPU profile of the full reconciles to this file (a diagnosis aid)")
	quietProfile := fs.String("quiet-cpuprofile", "", "write a CPU profile of the --quiet window to this file (a diagnosis aid)")
	quiet := fs.Duration("quiet", 0, "then run the reconciler's own loop this long, nothing changing (a full pass every 30 s, the drift probe every 5 s: the agent's defaults), and report its CPU")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *n < 1 || *n > maxServices {
		return fmt.Errorf("--services %d: must be 1..%d", *n, maxServices)
	}
	if *changes < 1 || *removes < 0 || *fullPasses < 0 || *quiet < 0 {
		return errors.New("--changes must be >= 1, --removes, --full-passes and --quiet >= 0")
	}
	if *endpoints < 2 || *endpoints > 90 {
		return fmt.Errorf("--endpoints %d: must be 2..90", *endpoints)
	}
	if *chunkOps < 0 {
		return fmt.Errorf("--chunk-ops %d: must be >= 0", *chunkOps)
	}
	eps = *endpoints
	log, err := zap.NewProductionConfig().Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	log = log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))

	t0 := time.Now()
	k, err := agent.NewLinuxKernel(ctx, log)
	if err != nil {
		return fmt.Errorf("open kernel: %w", err)
	}
	// Run (the periodic full pass and the drift probe) is started only for
	// --quiet, so the period matters only then: the agent's default.
	if *unbatched {
		k.IPVS = oneByOne{k.IPVS}
		k.IPSets = oneByOneSets{k.IPSets}
		k.Links = oneByOneLinks{k.Links}
	}
	r, err := reconcile.New(k, reconcile.Config{}, log)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	res := vmbench.Result{Services: *n, Changes: *changes, Removes: *removes, KernelOpenMS: ms(time.Since(t0)),
		Endpoints: *endpoints, Unbatched: *unbatched, ChunkOps: *chunkOps, FullPasses: *fullPasses}

	svcs := make([]*vsplanev1.Resource, *n)
	for i := range svcs {
		svcs[i] = service(i, 0)
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	err = coldStart(ctx, r, svcs, *chunkOps, &res)
	stop()
	if err != nil {
		return err
	}

	// Each change moves the second endpoint of a different Service (a
	// stride walk, so not always the same entries) to a new address.
	times := make([]time.Duration, 0, *changes)
	for c := range *changes {
		i := (c * 7919) % *n
		d, ack, err := apply(ctx, r, &vsplanev1.Delta{Nonce: fmt.Sprint("change-", c),
			Resources: []*vsplanev1.Resource{service(i, c+1)}})
		if err != nil {
			return fmt.Errorf("change %d: %w", c, err)
		}
		times = append(times, d)
		if c == *changes/2 {
			res.ChangeOps = ack.GetKernelOperations()
		}
	}
	res.ChangeMedianMS, res.ChangeP90MS = ms(vmbench.Quantile(times, 0.5)), ms(vmbench.Quantile(times, 0.9))
	res.ChangeMinMS, res.ChangeMaxMS = ms(slices.Min(times)), ms(slices.Max(times))

	times = times[:0]
	extra := service(-1, 0)
	for c := range *removes {
		if _, _, err := apply(ctx, r, &vsplanev1.Delta{Nonce: fmt.Sprint("add-", c), Resources: []*vsplanev1.Resource{extra}}); err != nil {
			return fmt.Errorf("add extra %d: %w", c, err)
		}
		d, ack, err := apply(ctx, r, &vsplanev1.Delta{Nonce: fmt.Sprint("rm-", c), Removed: []string{extra.GetName()}})
		if err != nil {
			return fmt.Errorf("remove extra %d: %w", c, err)
		}
		times = append(times, d)
		res.RemoveOps = ack.GetKernelOperations()
	}
	if len(times) > 0 {
		res.RemoveMedianMS, res.RemoveP90MS = ms(vmbench.Quantile(times, 0.5)), ms(vmbench.Quantile(times, 0.9))
	}

	if err := timeFullPasses(ctx, r, *fullPasses, *passProfile, &res); err != nil {
		return err
	}
	if err := timeQuiet(ctx, r, *quiet, *quietProfile, &res); err != nil {
		return err
	}

	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// timeFullPasses runs n periodic full reconciles of the unchanged state (what
// the agent does every period while nothing changes) and records each one's
// wall time, the process's CPU time and the bytes allocated. A pass that
// finds something to repair is an error: nothing changed.
func timeFullPasses(ctx context.Context, r *reconcile.Reconciler, n int, profile string, res *vmbench.Result) error {
	if n == 0 {
		return nil
	}
	stop, err := startCPUProfile(profile)
	if err != nil {
		return err
	}
	defer stop()
	before := r.Stats()
	var walls, cpus []time.Duration
	var allocs []uint64
	for range n {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		c0, err := measure.SelfCPU()
		if err != nil {
			return err
		}
		start := time.Now()
		r.Reconcile(ctx)
		wall := time.Since(start)
		c1, err := measure.SelfCPU()
		if err != nil {
			return err
		}
		runtime.ReadMemStats(&m1)
		walls, cpus, allocs = append(walls, wall), append(cpus, c1-c0), append(allocs, m1.TotalAlloc-m0.TotalAlloc)
	}
	after := r.Stats()
	if got := after.FullReconciles - before.FullReconciles; got != uint64(n) {
		return fmt.Errorf("full passes: %d ran, want %d", got, n)
	}
	if rep := after.DriftRepaired - before.DriftRepaired; rep != 0 {
		return fmt.Errorf("full passes over an unchanged kernel repaired %d things: %v", rep, after.RepairsByKind)
	}
	for i := range walls {
		res.FullPassMS = append(res.FullPassMS, ms(walls[i]))
		res.FullPassCPUMS = append(res.FullPassCPUMS, ms(cpus[i]))
		res.FullPassAllocMB = append(res.FullPassAllocMB, float64(allocs[i])/1e6)
	}
	res.FullPassMedianMS, res.FullPassCPUMedianMS = ms(vmbench.Quantile(walls, 0.5)), ms(vmbench.Quantile(cpus, 0.5))
	return nil
}

// timeQuiet runs the reconciler's loop for d with nothing changing and
// records the process's CPU time over it and the full passes it ran. Drift
// repaired is an error: nothing changed.
func timeQuiet(ctx context.Context, r *reconcile.Reconciler, d time.Duration, profile string, res *vmbench.Result) error {
	if d == 0 {
		return nil
	}
	stop, err := startCPUProfile(profile)
	if err != nil {
		return err
	}
	defer stop()
	before := r.Stats()
	c0, err := measure.SelfCPU()
	if err != nil {
		return err
	}
	qctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := r.Run(qctx); err != nil {
		return err
	}
	c1, err := measure.SelfCPU()
	if err != nil {
		return err
	}
	after := r.Stats()
	if rep := after.DriftRepaired - before.DriftRepaired; rep != 0 {
		return fmt.Errorf("quiet: %d things repaired with nothing changing: %v", rep, after.RepairsByKind)
	}
	res.QuietSeconds, res.QuietCPUMS = d.Seconds(), ms(c1-c0)
	res.QuietFullPasses = after.FullReconciles - before.FullReconciles
	return nil
}

// startCPUProfile starts a CPU profile written to path ("": none) and
// returns what stops it.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// oneByOne, oneByOneSets and oneByOneLinks send every write of a batch as
// its own netlink request (a batch of one: one round trip per write): the
// baseline the batched paths are measured against.
type oneByOne struct{ kernel.IPVS }

func (o oneByOne) Apply(ops []kernel.IPVSOp) []error { return eachOp(ops, o.IPVS.Apply) }

type oneByOneSets struct{ kernel.IPSets }

func (o oneByOneSets) ApplyEntries(ops []kernel.EntryOp) []error {
	return eachOp(ops, o.IPSets.ApplyEntries)
}

type oneByOneLinks struct{ kernel.Links }

func (o oneByOneLinks) ApplyAddresses(dev string, ops []kernel.AddressOp) []error {
	return eachOp(ops, func(b []kernel.AddressOp) []error { return o.Links.ApplyAddresses(dev, b) })
}

// eachOp applies ops as batches of one.
func eachOp[T any](ops []T, apply func([]T) []error) []error {
	errs := make([]error, len(ops))
	for i := range ops {
		errs[i] = apply(ops[i : i+1])[0]
	}
	return errs
}

// coldStart applies svcs into the empty kernel, as one Delta or as
// consecutive Deltas of at most chunkOps estimated operations (whole
// Services), and records the times in res.
func coldStart(ctx context.Context, r *reconcile.Reconciler, svcs []*vsplanev1.Resource, chunkOps int, res *vmbench.Result) error {
	var chunks [][]*vsplanev1.Resource
	if chunkOps == 0 {
		chunks = [][]*vsplanev1.Resource{svcs}
	} else {
		var cur []*vsplanev1.Resource
		budget := 0
		for _, s := range svcs {
			c := stream.ResourceCost(s)
			if len(cur) > 0 && budget+c > chunkOps {
				chunks, cur, budget = append(chunks, cur), nil, 0
			}
			cur, budget = append(cur, s), budget+c
		}
		chunks = append(chunks, cur)
	}
	res.ColdOps = map[string]uint32{}
	var lat []time.Duration
	start := time.Now()
	for i, c := range chunks {
		// The first Delta of an agent carries the whole state (replace_all);
		// the later ones add to it.
		took, ack, err := apply(ctx, r, &vsplanev1.Delta{Nonce: fmt.Sprint("cold-", i), Resources: c, ReplaceAll: i == 0})
		if err != nil {
			return fmt.Errorf("cold start Delta %d of %d: %w", i+1, len(chunks), err)
		}
		at := time.Since(start)
		if i == 0 {
			res.FirstAckedMS = ms(at)
		}
		for range c {
			lat = append(lat, at)
		}
		var writes uint64
		for op, n := range ack.GetKernelOperations() {
			res.ColdOps[op] += n
			writes += uint64(n)
		}
		res.ColdWrites += writes
		res.ColdDeltaMS = append(res.ColdDeltaMS, ms(took))
		res.ColdDeltaWrites = append(res.ColdDeltaWrites, writes)
	}
	total := time.Since(start)
	res.ColdMS, res.ColdDeltas = ms(total), len(chunks)
	res.ColdWritesPerSec = float64(res.ColdWrites) / total.Seconds()
	res.BurstP50MS, res.BurstP99MS, res.BurstMaxMS = ms(vmbench.Quantile(lat, 0.5)), ms(vmbench.Quantile(lat, 0.99)), ms(slices.Max(lat))
	return nil
}

// apply runs one Delta and times it; a NACK is an error.
func apply(ctx context.Context, r *reconcile.Reconciler, d *vsplanev1.Delta) (time.Duration, *vsplanev1.Ack, error) {
	start := time.Now()
	ack := r.Apply(ctx, d)
	took := time.Since(start)
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		return took, ack, fmt.Errorf("not acked (%v): %v", ack.GetStatus(), ack.GetErrors())
	}
	return took, ack, nil
}

// eps is the endpoints per Service (--endpoints).
var eps = 2

// service builds ClusterIP Service i (i = -1: the extra one at 198.18.255.1)
// like the control plane would: one TCP virtual server on port 80 with eps
// endpoints and its KUBE-CLUSTER-IP entry. gen picks the last endpoint, so
// gen != previous gen is a one-endpoint change.
func service(i, gen int) *vsplanev1.Resource {
	name, vip := fmt.Sprint("bench-", i), fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)
	if i < 0 {
		name, vip = "bench-extra", "198.18.255.1"
		i = 0
	}
	last := fmt.Sprintf("198.19.%d.%d", 100+gen%100, i%250+1)
	var rss []*vsplanev1.RealServer
	for j := range eps - 1 {
		rss = append(rss, &vsplanev1.RealServer{Address: fmt.Sprintf("198.19.%d.%d", 1+j, i%250+1), Port: 8080, Weight: 1, Ready: true})
	}
	rss = append(rss, &vsplanev1.RealServer{Address: last, Port: 8080, Weight: 1, Ready: true})
	vs := &vsplanev1.VirtualServer{
		Kind:        vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP,
		Address:     vip,
		Family:      vsplanev1.IPFamily_IP_FAMILY_IPV4,
		Port:        80,
		Protocol:    vsplanev1.Protocol_PROTOCOL_TCP,
		Binding:     vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS,
		RealServers: rss,
	}
	return &vsplanev1.Resource{
		Name:    "service/default/" + name,
		Version: fmt.Sprint(gen),
		Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
			Namespace:      "default",
			Name:           name,
			VirtualServers: []*vsplanev1.VirtualServer{vs},
			IpsetEntries: []*vsplanev1.IPSetEntry{{
				Set: vsplanev1.IPSet_IP_SET_CLUSTER_IP, Family: vsplanev1.IPFamily_IP_FAMILY_IPV4,
				Ip: vip, Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
			}},
		}},
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
