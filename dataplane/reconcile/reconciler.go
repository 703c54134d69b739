// Package reconcile is the agent's reconciler: it holds the node's desired
// state (the resources received from the control plane) and makes the
// kernel match it, like kube-proxy's IPVS proxier but incrementally.
//
//	Delta ──Apply──▶ store (resources + indexes) ──touched items──▶ kernel
//	                                     ▲                          │
//	                       Run: every period / retry backoff ───────┘ full compare
//
// Files, in the order of the README: apply.go (incremental apply: Apply),
// full.go (full reconcile), retry.go (backoff of failed resources),
// drain.go (graceful drain), run.go (the loop that runs them), status.go
// (per-resource outcomes, Stats); the desired state in desired.go,
// validate.go, store.go, nodeport.go and maxelem.go; the kernel side in
// pass.go, known.go, queue.go, prefetch.go and one file per kind of kernel
// object (ipvs.go, addresses.go, ipsets.go, iptables.go, sysctl.go).
//
// Contract:
//   - Fail-static: New and Run do nothing to the kernel until the first
//     Apply. Nothing is ever flushed; items already right are not written.
//   - Apply applies only the items (virtual servers, destinations, bound
//     addresses, ipset entries) the changed resources touch, then
//     re-renders iptables and restores once per family if it changed. The
//     first Apply instead compares everything with the kernel and removes
//     what the agent owns but nobody wants (deleted while it was down).
//   - Ownership: a virtual server is the agent's when a resource wants it,
//     when it was programmed by this process, or (after the first Apply)
//     when its address is bound to kube-ipvs0. Virtual servers and bound
//     addresses inside excludeCIDRs are never deleted. The kube-proxy sets
//     (KUBE-*, KUBE-6-*) are entirely the agent's.
//   - Nothing from the wire reaches the kernel, an iptables-restore payload
//     or a log line unchecked (validate.go): a bad value is a NACK naming
//     the field and only its part is skipped; a resource with a bad name
//     or version is refused whole.
//   - A failing item fails the resources that own or touched it (NACK with
//     the kernel's message); every other item is still applied. Failed
//     resources are retried by Run with exponential backoff.
//   - Graceful drain (drain.go): a TCP real server nobody wants is kept at
//     weight 0 while it has connections, checked every DrainCheckInterval
//     and deleted when drained or after MaxDrain; UDP/SCTP ones go at once.
//     A restarted agent keeps draining the weight-0 leftovers it finds.
//   - Apply, Versions, Reconcile, CheckDrains, Draining, Stats and Status
//     are safe for concurrent use.
package reconcile

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/wire"
)

// Config configures a Reconciler.
type Config struct {
	// Period of the full reconcile (default 30s); a non-zero
	// NodeSettings.reconcile_period_seconds overrides it.
	Period time.Duration
	// RetryBase and RetryMax bound the retry backoff of failed resources
	// (defaults min(1s, Period) and Period).
	RetryBase, RetryMax time.Duration
	// Families managed by the agent (default IPv4 only).
	Families []kernel.Family
	// Now is the clock (default time.Now); tests may replace it.
	Now func() time.Time
	// DrainCheckInterval is how often draining real servers are checked
	// for connections (default 5s; kube-proxy: 1 min).
	DrainCheckInterval time.Duration
	// MaxDrain bounds a drain: a real server still holding connections
	// this long after its drain started is deleted (default 10 min;
	// kube-proxy has no bound).
	MaxDrain time.Duration
	// ProbeInterval is how often, between full reconciles, the virtual
	// servers (without real servers), the managed sets' entry counts and
	// the iptables fingerprints are checked for outside drift (probe.go;
	// default 5s, negative disables).
	ProbeInterval time.Duration

	// Schedulers are the IPVS schedulers virtual servers and the node
	// default may name (the list the agent reports in Hello). Empty: read
	// once from the kernel (IPVS.Schedulers) at the first Apply, and again
	// at each Apply while that read fails (names are then only checked
	// for shape).
	Schedulers []string

	// NumCPU scales the conntrack table (nf_conntrack_max = max_per_core x
	// NumCPU, at least min); default runtime.NumCPU().
	NumCPU int

	// maxElem overrides the hash sets' maxelem in the admission (tests).
	maxElem uint32
}

// Reconciler implements the agent stream client's Applier (dataplane/client).
// Its state is grouped by concern, each type in the file of its concern;
// mu guards all of it.
type Reconciler struct {
	k        kernel.Kernel // every write goes through tracker (prefetch.go)
	cfg      Config
	log      *zap.Logger
	families familySet

	// fullMu serializes full reconciles: each reads the kernel without mu
	// while tracker records the writes made meanwhile (prefetch.go).
	fullMu  sync.Mutex
	tracker *writeTracker
	// dumpFailed logs the first failed one-read dump of destinations.
	dumpFailed sync.Once

	mu         sync.Mutex
	desired    *store          // the resources and their indexes (store.go)
	nodePort   nodePortAddrs   // what NodePort markers expand over (nodeport.go)
	marks      *inClusterMarks // fwmark servers of in-cluster clients (incluster.go)
	admission  setAdmission    // who fits in a full ipset (maxelem.go)
	schedulers schedulerList   // what the kernel offers (apply.go)
	known      knownKernel     // what the kernel holds (known.go)
	status     resourceStatus  // applied / failed / recovered (status.go)
	full       fullSchedule    // first Delta seen, last full reconcile (full.go)
	probe      driftProbe      // between full reconciles (probe.go)
	applies    uint64          // Deltas applied (writeGeneration)
	retry      retryBackoff    // (retry.go)
	drains     drainSet        // (drain.go)
	rendered   renderMemo      // the last iptables renderings (iptables.go)
	stats      Stats           // (status.go)

	wake chan struct{} // a deadline moved: Run recomputes its sleep (run.go)
	// removals: addresses reported removed, not yet looked at (own lock:
	// the watcher must not wait for mu; addrwatch.go).
	removals removalNotes
}

// New returns a Reconciler over k. It does not touch the kernel.
func New(k kernel.Kernel, cfg Config, log *zap.Logger) (*Reconciler, error) {
	if k.IPVS == nil || k.IPSets == nil || k.Links == nil || k.IPTables == nil || k.Sysctl == nil {
		return nil, errors.New("reconcile: every kernel subsystem is required")
	}
	if cfg.Period < 0 || cfg.RetryBase < 0 || cfg.RetryMax < 0 || cfg.DrainCheckInterval < 0 || cfg.MaxDrain < 0 {
		return nil, errors.New("reconcile: negative durations")
	}
	if cfg.NumCPU <= 0 {
		cfg.NumCPU = runtime.NumCPU()
	}
	if cfg.DrainCheckInterval == 0 {
		cfg.DrainCheckInterval = 5 * time.Second
	}
	if cfg.MaxDrain == 0 {
		cfg.MaxDrain = 10 * time.Minute
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = wire.DefaultDriftProbeInterval
	}
	if cfg.Period == 0 {
		cfg.Period = wire.DefaultReconcilePeriod
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase = min(time.Second, cfg.Period)
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = max(cfg.Period, cfg.RetryBase)
	}
	if cfg.RetryMax < cfg.RetryBase {
		return nil, fmt.Errorf("reconcile: RetryMax %v < RetryBase %v", cfg.RetryMax, cfg.RetryBase)
	}
	if len(cfg.Families) == 0 {
		cfg.Families = []kernel.Family{kernel.FamilyIPv4}
	}
	for _, f := range cfg.Families {
		if !f.Valid() {
			return nil, fmt.Errorf("reconcile: bad family %v", f)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = zap.NewNop()
	}
	var scheds []string
	if len(cfg.Schedulers) > 0 {
		scheds = slices.Compact(slices.Sorted(slices.Values(cfg.Schedulers)))
	}
	tracker := &writeTracker{}
	return &Reconciler{
		k: tracker.wrap(k), cfg: cfg, log: log, families: slices.Compact(slices.Sorted(slices.Values(cfg.Families))),
		tracker:    tracker,
		desired:    newStore(),
		marks:      newInClusterMarks(defaultSettings().masqueradeBit),
		admission:  setAdmission{refused: map[setRef]map[string]bool{}, maxElem: cfg.maxElem},
		schedulers: schedulerList{names: scheds},
		known:      newKnownKernel(),
		status:     newResourceStatus(),
		retry:      retryBackoff{base: cfg.RetryBase, max: cfg.RetryMax},
		drains:     newDrainSet(cfg.DrainCheckInterval, cfg.MaxDrain),
		rendered:   renderMemo{},
		stats:      Stats{RepairsByKind: map[string]uint64{}, DrainOps: map[string]uint64{}},
		wake:       make(chan struct{}, 1),
	}, nil
}
