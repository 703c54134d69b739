// Package engine ties the control plane together: it consumes coalesced
// changes from watch, keeps the cluster model, recomputes only the Services
// a change touches (once per distinct per-node variant) and writes the
// per-node snapshot store.
package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// DefaultMaxBatch bounds the writes committed to the store at once.
const DefaultMaxBatch = 1 << 16

// DefaultResyncSlotsPerApply bounds the periodic self-check's share of one
// Apply: Services x nodes written (about 0.3 s of work on a 2-core machine).
const DefaultResyncSlotsPerApply = 1 << 17

// Config configures the engine.
type Config struct {
	// Translate is the cluster-wide configuration passed to the translator.
	Translate translate.Config
	// Metrics, if set, receives the engine's metrics.
	Metrics prometheus.Registerer
	// ResyncSlotsPerApply: a periodic resync rechecks every Service, a
	// chunk per Apply of at most this many Services x nodes, so changes
	// never wait behind the whole of it (default DefaultResyncSlotsPerApply;
	// at least one Service per Apply).
	ResyncSlotsPerApply int
	// MaxBatch bounds the store writes committed at once, and so the
	// transient memory of a large Apply (default DefaultMaxBatch). Nodes
	// being filled are staged (snapshot.Batch.StageNode), so no reader sees
	// a node before all of it is committed, whatever this size.
	MaxBatch int
}

// Engine implements watch.Sink. Apply must not be called concurrently with
// itself (watch guarantees this); the query methods may be called any time.
type Engine struct {
	cfg   Config
	log   *zap.Logger
	store *snapshot.Store

	mu         sync.RWMutex
	services   map[model.ServiceKey]*serviceEntry
	sliceOwner map[model.SliceKey]model.ServiceKey
	nodes      map[string]*nodeEntry
	namespaces map[string]*model.Namespace
	rollouts   map[string]*model.Rollout
	// reached: the rollouts that decide schedulers, newest first (rollouts.go).
	reached   []reached
	conflicts *conflicts
	// resync: Services the current periodic self-check has still to redo.
	resync []model.ServiceKey

	// nextMu guards next: fleet settings SetTranslate left for the next
	// Apply (settings.go). Separate from mu so SetTranslate never waits for
	// a running Apply.
	nextMu sync.Mutex
	next   *translate.Config

	invalid      *prometheus.CounterVec
	applySeconds prometheus.Histogram
	translations prometheus.Counter
}

type serviceEntry struct {
	svc           *model.Service
	svcProblems   []model.Problem
	slices        map[model.SliceKey]*model.EndpointSlice
	sliceProblems map[model.SliceKey][]model.Problem
	// conflictProblems: cross-Service conflicts this Service loses (set by
	// recompute; see conflicts).
	conflictProblems []model.Problem
	// Derived by recompute, reused for nodes that appear later.
	in       translate.Input
	variants translate.Variants
	// shared caches one resource per variant key nodes share (every key
	// but "node/..."); reset whenever the Service is recomputed (not by a
	// rollout step: recomputeOn).
	shared map[string]*vsplanev1.Resource
	// rolloutVersion identifies the rollouts in.Rollouts was derived from.
	rolloutVersion string
}

type nodeEntry struct {
	node *model.Node
}

var _ watch.PendingSink = (*Engine)(nil)

// New returns an engine writing to store. It fails only if registering the
// metrics fails.
func New(cfg Config, store *snapshot.Store, log *zap.Logger) (*Engine, error) {
	cfg.Translate = cfg.Translate.WithDefaults()
	if cfg.ResyncSlotsPerApply <= 0 {
		cfg.ResyncSlotsPerApply = DefaultResyncSlotsPerApply
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	e := &Engine{
		cfg:        cfg,
		log:        log,
		store:      store,
		services:   map[model.ServiceKey]*serviceEntry{},
		sliceOwner: map[model.SliceKey]model.ServiceKey{},
		nodes:      map[string]*nodeEntry{},
		namespaces: map[string]*model.Namespace{},
		rollouts:   map[string]*model.Rollout{},
		conflicts:  newConflicts(),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_controlplane_invalid_objects_total",
			Help: "Kubernetes objects (or parts of them) skipped because the translator cannot use them.",
		}, []string{"kind", "reason"}),
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vsplane_controlplane_apply_seconds",
			Help:    "Time to apply one batch of changes to the model and the store.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		translations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vsplane_controlplane_translations_total",
			Help: "Service translations computed (one per distinct per-node variant).",
		}),
	}
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{e.invalid, e.applySeconds, e.translations} {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("engine: registering metrics: %w", err)
			}
		}
	}
	return e, nil
}

// Apply updates the model from one batch and writes every affected
// (node, resource) to the store: nodes first (so Services see the new node
// set), then EndpointSlices and Services mark what to recompute, then the
// dirty Services and the nodes to fill are written.
func (e *Engine) Apply(_ context.Context, ch *watch.Changes) error {
	start := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()

	b := batches.Get().(*snapshot.Batch)
	defer func() { b.Reset(); batches.Put(b) }() // nothing of this Apply left in it
	w := &work{dirty: map[model.ServiceKey]time.Time{}, fresh: map[string]struct{}{}, b: b}
	settings := e.takeTranslate()
	e.applyNodes(w, ch.Nodes)
	e.applySettings(w, settings, ch.Nodes)
	e.applySlices(w, ch.Slices)
	e.applyServices(w, ch.Services)
	e.applyRollouts(w, ch)
	if ch.Periodic {
		e.startResync(w)
	}
	for _, key := range e.resyncChunk() {
		w.markDirty(key, time.Time{})
	}
	changed := e.write(w)

	e.applySeconds.Observe(time.Since(start).Seconds())
	if e.log.Core().Enabled(zap.DebugLevel) {
		e.log.Debug("applied changes", zap.Int("services", len(ch.Services)), zap.Int("endpointSlices", len(ch.Slices)),
			zap.Int("nodes", len(ch.Nodes)), zap.Int("recomputed", len(w.dirty)), zap.Int("recomputedOnSomeNodes", len(w.nodesOnly)), zap.Int("storeChanges", changed),
			zap.Duration("took", time.Since(start)))
	}
	return nil
}

// work is what one Apply has to write, and the state that lives only as
// long as the Apply.
type work struct {
	// dirty: Services to recompute, with their earliest trigger.
	dirty map[model.ServiceKey]time.Time
	// fresh: nodes that get every Service (new, or zone/addresses changed),
	// staged and published whole.
	fresh map[string]struct{}
	// nodesOnly: Services to recompute on these nodes only (a rollout step
	// reached or left them; rollouts.go), unless also dirty. The sets are
	// shared between Services and not modified.
	nodesOnly map[model.ServiceKey]map[string]struct{}
	// b holds the writes not yet committed (write commits it in chunks).
	b *snapshot.Batch
	// parts: per Service, the sub-messages its variants built in this
	// Apply share (share.go). Dropped with the Apply: kept, the pools would
	// cost more than the sharing they could still bring to a later one.
	parts map[*serviceEntry]*partPool
}

// batches recycles the batches' storage from one Apply to the next: a
// change writes one resource per node, so a fresh batch would grow to the
// node count on every Apply. Only empty batches are put back.
var batches = sync.Pool{New: func() any { return new(snapshot.Batch) }}

// partsOf returns the part pool of se for this Apply, creating it.
func (w *work) partsOf(se *serviceEntry) *partPool {
	p := w.parts[se]
	if p == nil {
		if w.parts == nil {
			w.parts = map[*serviceEntry]*partPool{}
		}
		p = &partPool{}
		w.parts[se] = p
	}
	return p
}

func (w *work) markDirty(k model.ServiceKey, t time.Time) {
	if old, ok := w.dirty[k]; !ok || (!t.IsZero() && t.Before(old)) {
		w.dirty[k] = t
	}
}

// applyNodes updates the node set and node settings.
func (e *Engine) applyNodes(w *work, nodes map[string]watch.Change[model.Node]) {
	for name, c := range nodes {
		report(e, c.Current)
		if c.Current == nil || c.Current.Value == nil {
			if _, ok := e.nodes[name]; ok {
				delete(e.nodes, name)
				w.b.RemoveNode(name)
			}
			continue
		}
		n := c.Current.Value
		old, had := e.nodes[name]
		e.nodes[name] = &nodeEntry{node: n}
		// A new node gets every Service; so does one whose zone (topology
		// may select other endpoints) or addresses (load-balancer
		// source-range entries) changed. Either way its whole state is
		// staged and published at the end of this Apply, so no agent ever
		// sees it half-filled (snapshot package doc).
		if !had || old.node.Zone != n.Zone || !slices.Equal(old.node.Addresses, n.Addresses) {
			w.b.StageNode(name, c.Trigger)
			w.fresh[name] = struct{}{}
		}
		e.setNodeSettings(w.b, n, c.Trigger)
	}
	if len(nodes) > 0 && e.conflicts.setNodeAddresses(e.nodes) {
		// An external IP may now equal (or no longer equal) a node address.
		for _, k := range e.conflicts.extIPServices() {
			w.markDirty(k, time.Time{})
		}
	}
}

// applySlices moves EndpointSlices between their Services' entries.
func (e *Engine) applySlices(w *work, changes map[model.SliceKey]watch.Change[model.EndpointSlice]) {
	for key, c := range changes {
		report(e, c.Current)
		if owner, ok := e.sliceOwner[key]; ok {
			if se := e.services[owner]; se != nil {
				delete(se.slices, key)
				delete(se.sliceProblems, key)
				e.gc(owner, se)
			}
			delete(e.sliceOwner, key)
			w.markDirty(owner, c.Trigger)
		}
		if c.Current == nil || c.Current.Value == nil {
			continue
		}
		sl := c.Current.Value
		se := e.entry(sl.Service)
		se.slices[key] = sl
		if len(c.Current.Problems) > 0 {
			se.sliceProblems[key] = c.Current.Problems
		}
		e.sliceOwner[key] = sl.Service
		w.markDirty(sl.Service, c.Trigger)
	}
}

// applyServices records Service changes and the conflicts they move.
func (e *Engine) applyServices(w *work, changes map[model.ServiceKey]watch.Change[model.Service]) {
	for key, c := range changes {
		report(e, c.Current)
		se := e.entry(key)
		se.svc, se.svcProblems = nil, nil
		if c.Current != nil {
			se.svc, se.svcProblems = c.Current.Value, c.Current.Problems
		}
		trig := c.Trigger
		e.conflicts.update(key, se.svc, func(other model.ServiceKey) { w.markDirty(other, trig) })
		e.gc(key, se)
		w.markDirty(key, c.Trigger)
	}
}

// startResync begins the periodic self-check: every Service is recomputed,
// a chunk per Apply (see resyncChunk); unchanged content costs no
// notifications because the store compares versions. A resync still
// running restarts.
func (e *Engine) startResync(w *work) {
	e.resync = e.resync[:0]
	for key := range e.services {
		e.resync = append(e.resync, key)
	}
	slices.SortFunc(e.resync, compareKeys)
	for _, ne := range e.nodes {
		e.setNodeSettings(w.b, ne.node, time.Time{})
	}
}

// write recomputes the dirty Services, fills and publishes the fresh nodes
// and commits; large batches (initial sync, a node joining) go in chunks of
// MaxBatch to bound the transient memory: fresh nodes are staged, so no
// reader sees them before they are complete. It returns the store changes.
func (e *Engine) write(w *work) int {
	changed := 0
	commit := func(force bool) {
		if force || w.b.Len() >= e.cfg.MaxBatch {
			changed += e.store.Commit(w.b).Changed
			w.b.Reset()
		}
	}
	for key, trig := range w.dirty {
		e.recompute(w, key, trig)
		commit(false)
	}
	for key, nodes := range w.nodesOnly {
		if _, all := w.dirty[key]; !all {
			e.recomputeOn(w, key, nodes)
			commit(false)
		}
	}
	for name := range w.fresh {
		e.fillNode(w, e.nodes[name].node)
		commit(false)
	}
	for name := range w.fresh {
		w.b.PublishNode(name)
	}
	commit(true)
	return changed
}

// resyncChunk takes the next Services of a running periodic resync: as
// many as fit ResyncSlotsPerApply node slots, at least one.
func (e *Engine) resyncChunk() []model.ServiceKey {
	if len(e.resync) == 0 {
		return nil
	}
	n := min(len(e.resync), max(1, e.cfg.ResyncSlotsPerApply/max(1, len(e.nodes))))
	chunk := e.resync[:n]
	e.resync = e.resync[n:]
	return chunk
}

// Pending reports whether a periodic resync has Services left or new fleet
// settings wait (SetTranslate); the watcher then calls Apply again
// (watch.PendingSink).
func (e *Engine) Pending() bool {
	if e.settingsPending() {
		return true
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.resync) > 0
}

func compareKeys(a, b model.ServiceKey) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// entry returns (creating) the entry of a Service.
func (e *Engine) entry(k model.ServiceKey) *serviceEntry {
	se := e.services[k]
	if se == nil {
		se = &serviceEntry{slices: map[model.SliceKey]*model.EndpointSlice{}, sliceProblems: map[model.SliceKey][]model.Problem{}}
		e.services[k] = se
	}
	return se
}

// gc drops an entry nothing refers to any more (after its resources were
// deleted by recompute; recompute handles a missing entry as "deleted").
func (e *Engine) gc(k model.ServiceKey, se *serviceEntry) {
	if se.svc == nil && len(se.slices) == 0 && len(se.svcProblems) == 0 {
		delete(e.services, k)
	}
}

// recompute translates Service k once per variant and sets it on every
// known node except the fresh ones (they get everything in fillNode).
func (e *Engine) recompute(w *work, k model.ServiceKey, trig time.Time) {
	name := snapshot.ServiceName(k.Namespace, k.Name)
	se := e.services[k]
	if se == nil || se.svc == nil {
		if se != nil {
			se.in, se.variants, se.shared = translate.Input{}, translate.Variants{}, nil
			se.conflictProblems = nil
		}
		for n := range e.nodes {
			if _, ok := w.fresh[n]; !ok {
				w.b.Delete(n, name)
			}
		}
		return
	}
	e.derive(se)
	se.shared = nil
	for n, ne := range e.nodes {
		if _, ok := w.fresh[n]; ok {
			continue
		}
		if r := e.variantFor(w, se, ne.node); r != nil {
			w.b.Set(n, r, trig)
		}
	}
}

// recomputeOn translates Service k again for the given nodes only: the
// others' resources cannot change (rollouts.go says when). The cached
// shared variants stay: only the rollouts' node sets changed, not what a
// variant key stands for (the same rollouts with the same schedulers and
// flags), so a step translates only the node-specific variants of the
// nodes it reached.
func (e *Engine) recomputeOn(w *work, k model.ServiceKey, nodes map[string]struct{}) {
	se := e.services[k]
	if se == nil || se.svc == nil {
		e.recompute(w, k, time.Time{})
		return
	}
	e.derive(se)
	for n := range nodes {
		ne := e.nodes[n]
		if ne == nil {
			continue
		}
		if _, ok := w.fresh[n]; ok {
			continue
		}
		if r := e.variantFor(w, se, ne.node); r != nil {
			w.b.Set(n, r, time.Time{})
		}
	}
}

// fillNode sets every Service on a node that just appeared (or whose zone
// changed), reusing each Service's common variant. The node's change (given
// to StageNode) is the trigger: an old Service first sent to a new node is
// not old news for it.
func (e *Engine) fillNode(w *work, n *model.Node) {
	for k, se := range e.services {
		if se.svc == nil {
			w.b.Delete(n.Name, snapshot.ServiceName(k.Namespace, k.Name))
			continue
		}
		if se.in.Service == nil { // not derived yet (cannot happen after recompute, kept for safety)
			e.derive(se)
		}
		if r := e.variantFor(w, se, n); r != nil {
			w.b.Fill(n.Name, r) // the trigger StageNode got: the node's change
		}
	}
}

// derive computes the translator input of se: its Service, what it loses
// to other Services, its slices and every problem (conversion and
// conflict). Conflict problems are logged and counted when they change.
func (e *Engine) derive(se *serviceEntry) {
	lost, conflictProblems := e.conflicts.resolve(se.svc)
	if !slices.Equal(conflictProblems, se.conflictProblems) {
		for _, p := range conflictProblems {
			if !slices.Contains(se.conflictProblems, p) {
				e.invalid.WithLabelValues(p.Kind, string(p.Reason)).Inc()
				e.log.Warn("conflicting service", zap.String("object", p.Object), zap.String("reason", string(p.Reason)), zap.String("detail", p.Detail))
			}
		}
		se.conflictProblems = conflictProblems
	}
	se.in = translate.Input{Service: se.svc, Conflicts: lost, Slices: sortedSlices(se.slices), Problems: problemStrings(se)}
	se.in.Rollouts, se.rolloutVersion = e.rolloutsFor(se.svc)
	se.variants = translate.VariantsOf(se.in)
}

// variantFor returns the resource of se for node n: the cached value of
// n's variant key, or a fresh translation (always for "node/..." keys),
// its parts shared with the other variants of se this Apply built.
func (e *Engine) variantFor(w *work, se *serviceEntry, n *model.Node) *vsplanev1.Resource {
	key := se.variants.Key(n)
	shared := translate.Shared(key)
	if r, ok := se.shared[key]; ok && shared {
		return r
	}
	st := translate.Service(se.in, n, e.cfg.Translate)
	e.translations.Inc()
	w.partsOf(se).share(st)
	r, err := snapshot.NewServiceResource(st)
	if err != nil {
		// Only a proto encoding failure can get here; record it loudly.
		e.log.Error("building service resource failed", zap.Stringer("service", se.svc.Key), zap.String("node", n.Name), zap.Error(err))
		e.invalid.WithLabelValues("Service", "encode_error").Inc()
		return nil
	}
	if shared {
		if se.shared == nil {
			se.shared = map[string]*vsplanev1.Resource{}
		}
		se.shared[key] = r
	}
	return r
}

func (e *Engine) setNodeSettings(b *snapshot.Batch, n *model.Node, trig time.Time) {
	r, err := snapshot.NewNodeSettingsResource(translate.NodeSettings(n, e.cfg.Translate))
	if err != nil {
		e.log.Error("building node settings failed", zap.String("node", n.Name), zap.Error(err))
		e.invalid.WithLabelValues("Node", "encode_error").Inc()
		return
	}
	b.Set(n.Name, r, trig)
}

// report logs and counts the problems of a converted object.
func report[T any](e *Engine, o *watch.Observed[T]) {
	if o == nil {
		return
	}
	for _, p := range o.Problems {
		e.invalid.WithLabelValues(p.Kind, string(p.Reason)).Inc()
		e.log.Warn("invalid object", zap.String("kind", p.Kind), zap.String("object", p.Object),
			zap.String("reason", string(p.Reason)), zap.String("detail", p.Detail), zap.Bool("partial", p.Dropped))
	}
}

func sortedSlices(m map[model.SliceKey]*model.EndpointSlice) []*model.EndpointSlice {
	out := make([]*model.EndpointSlice, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *model.EndpointSlice) int { return cmp.Compare(a.Key.Name, b.Key.Name) })
	return out
}

func problemStrings(se *serviceEntry) []string {
	var out []string
	for _, p := range se.svcProblems {
		out = append(out, p.String())
	}
	for _, p := range se.conflictProblems {
		out = append(out, p.String())
	}
	keys := make([]model.SliceKey, 0, len(se.sliceProblems))
	for k := range se.sliceProblems {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b model.SliceKey) int { return cmp.Compare(a.Name, b.Name) })
	for _, k := range keys {
		for _, p := range se.sliceProblems[k] {
			out = append(out, p.String())
		}
	}
	return out
}

// Problems returns the conversion problems of a Service and its
// EndpointSlices (nil if none), for the inspection API.
func (e *Engine) Problems(k model.ServiceKey) []model.Problem {
	e.mu.RLock()
	defer e.mu.RUnlock()
	se := e.services[k]
	if se == nil {
		return nil
	}
	out := slices.Clone(se.svcProblems)
	out = append(out, se.conflictProblems...)
	for _, ps := range se.sliceProblems {
		out = append(out, ps...)
	}
	return out
}

// AllProblems returns the problems of every Service that has any.
func (e *Engine) AllProblems() map[model.ServiceKey][]model.Problem {
	e.mu.RLock()
	keys := make([]model.ServiceKey, 0)
	for k, se := range e.services {
		if len(se.svcProblems) > 0 || len(se.sliceProblems) > 0 || len(se.conflictProblems) > 0 {
			keys = append(keys, k)
		}
	}
	e.mu.RUnlock()
	out := make(map[model.ServiceKey][]model.Problem, len(keys))
	for _, k := range keys {
		if p := e.Problems(k); len(p) > 0 {
			out[k] = p
		}
	}
	return out
}

// Counts describe the model's size.
type Counts struct{ Services, Nodes int }

// Counts returns how many Services (programmed) and Nodes the model holds.
func (e *Engine) Counts() Counts {
	e.mu.RLock()
	defer e.mu.RUnlock()
	c := Counts{Nodes: len(e.nodes)}
	for _, se := range e.services {
		if se.svc != nil {
			c.Services++
		}
	}
	return c
}
