// Package watch watches Services, EndpointSlices and Nodes through one
// SharedInformerFactory (one watch per kind), coalesces their changes in
// per-kind change trackers and hands batches to a Sink from a
// bounded-frequency runner.
package watch

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/controlplane/model"
)

// Changes is one batch of coalesced changes. Only objects whose converted
// form changed appear; a key maps to its net change since the previous batch.
type Changes struct {
	Services map[model.ServiceKey]Change[model.Service]
	Slices   map[model.SliceKey]Change[model.EndpointSlice]
	Nodes    map[string]Change[model.Node]
	// Namespaces (their labels select Services for rollouts) and
	// SchedulerRollouts (only with Options.Rollouts).
	Namespaces map[string]Change[model.Namespace]
	Rollouts   map[string]Change[model.Rollout]
	// Periodic is set on the runs made because MaxInterval passed without one.
	Periodic bool
}

// Empty reports whether the batch carries no object change.
func (c *Changes) Empty() bool {
	return len(c.Services) == 0 && len(c.Slices) == 0 && len(c.Nodes) == 0 && len(c.Namespaces) == 0 && len(c.Rollouts) == 0
}

// Sink consumes batches. Apply is called from one goroutine at a time, only
// after all three informers have synced (so the first batch holds the whole
// cluster). If Apply returns an error the same changes are delivered again
// after Options.RetryInterval, merged with any newer ones.
type Sink interface {
	Apply(ctx context.Context, changes *Changes) error
}

// PendingSink is a Sink that spreads work over several Apply calls (the
// engine checks a periodic resync in chunks, so real changes never wait
// behind all of it). While Pending reports true the watcher calls Apply
// again after the coalescing gap (at most MinInterval), with whatever
// changes arrived (maybe none).
type PendingSink interface {
	Sink
	Pending() bool
}

// Options tune the watcher; zero values take the defaults.
type Options struct {
	// MinInterval (default 100ms) is the longest wait between two batches
	// while changes keep coming; after a cheap batch the wait is 4x its
	// duration (see runner), so an idle control plane sends at once.
	MinInterval   time.Duration
	MaxInterval   time.Duration // default 1h: a (periodic) batch at least this often
	RetryInterval time.Duration // default 1s: after a failed Apply
	Clock         clock.WithTicker
	// Rollouts also watches SchedulerRollouts (vsplane.io/v1alpha1) through
	// Dynamic; the CRD must be installed, or the watch never syncs.
	Rollouts bool
	Dynamic  dynamic.Interface
}

func (o *Options) defaults() {
	if o.MinInterval <= 0 {
		o.MinInterval = 100 * time.Millisecond
	}
	if o.MaxInterval <= 0 {
		o.MaxInterval = time.Hour
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// Watcher owns the informers, the trackers and the runner.
type Watcher struct {
	opts     Options
	log      *zap.Logger
	sink     Sink
	factory  informers.SharedInformerFactory
	services *tracker[model.ServiceKey, model.Service]
	slices   *tracker[model.SliceKey, model.EndpointSlice]
	nodes    *tracker[string, model.Node]
	nss      *tracker[string, model.Namespace]
	rollouts *tracker[string, model.Rollout]
	runner   *runner
	// dynFactory watches SchedulerRollouts (nil without Options.Rollouts);
	// RolloutLister reads its cache.
	dynFactory dynamicinformer.DynamicSharedInformerFactory
	rolloutInf cache.SharedIndexInformer
	synced     atomic.Bool
	// handlers report when each handler has been given every object of the
	// initial list; the informer's own HasSynced only covers its store, and
	// handler notifications are delivered asynchronously after that.
	handlers []cache.ResourceEventHandlerRegistration
	ctx      context.Context // for Apply; set by Run
}

// New builds a Watcher; nothing runs until Run.
func New(client kubernetes.Interface, sink Sink, opts Options, log *zap.Logger) (*Watcher, error) {
	opts.defaults()
	w := &Watcher{
		opts:     opts,
		log:      log,
		sink:     sink,
		services: newTracker[model.ServiceKey, model.Service](),
		slices:   newTracker[model.SliceKey, model.EndpointSlice](),
		nodes:    newTracker[string, model.Node](),
		nss:      newTracker[string, model.Namespace](),
		rollouts: newTracker[string, model.Rollout](),
	}
	w.runner = newRunner(w.sync, opts.MinInterval, opts.MaxInterval, opts.RetryInterval, opts.Clock)
	w.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slimForCache))
	// Like kube-proxy: Services/slices handed to another proxy, and headless
	// slices, are filtered by the API server. Per-informer selectors keep it
	// to one factory without filtering Nodes.
	noProxy, err := labels.NewRequirement(model.LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("watch: label selector: %w", err)
	}
	noHeadless, err := labels.NewRequirement(model.LabelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("watch: label selector: %w", err)
	}
	svcSel := labels.NewSelector().Add(*noProxy)
	sliceSel := svcSel.Add(*noHeadless)
	svcInf := w.factory.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{},
			func(o *metav1.ListOptions) { o.LabelSelector = svcSel.String() })
	})
	sliceInf := w.factory.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{},
			func(o *metav1.ListOptions) { o.LabelSelector = sliceSel.String() })
	})
	nodeInf := w.factory.Core().V1().Nodes().Informer()
	nsInf := w.factory.Core().V1().Namespaces().Informer()
	handlers := []struct {
		inf cache.SharedIndexInformer
		f   func(old, cur any)
	}{
		{svcInf, kindHandler[corev1.Service, model.ServiceKey, model.Service]{w: w, tracker: w.services,
			typed: typed[corev1.Service], key: serviceKey, convert: model.ConvertService}.on},
		{sliceInf, kindHandler[discoveryv1.EndpointSlice, model.SliceKey, model.EndpointSlice]{w: w, tracker: w.slices,
			typed: typed[discoveryv1.EndpointSlice], key: sliceKey, convert: model.ConvertEndpointSlice, triggerTime: sliceTriggerTime}.on},
		{nodeInf, kindHandler[corev1.Node, string, model.Node]{w: w, tracker: w.nodes,
			typed: typed[corev1.Node], key: (*corev1.Node).GetName, convert: model.ConvertNode}.on},
		{nsInf, kindHandler[corev1.Namespace, string, model.Namespace]{w: w, tracker: w.nss,
			typed: typed[corev1.Namespace], key: (*corev1.Namespace).GetName, convert: model.ConvertNamespace}.on},
	}
	if opts.Rollouts {
		if opts.Dynamic == nil {
			return nil, fmt.Errorf("watch: rollouts need a dynamic client")
		}
		w.dynFactory = dynamicinformer.NewDynamicSharedInformerFactory(opts.Dynamic, 0)
		w.rolloutInf = w.dynFactory.ForResource(v1alpha1.Resource).Informer()
		if err := w.rolloutInf.SetTransform(slimForCache); err != nil {
			return nil, fmt.Errorf("watch: rollout informer transform: %w", err)
		}
		handlers = append(handlers, struct {
			inf cache.SharedIndexInformer
			f   func(old, cur any)
		}{w.rolloutInf, kindHandler[v1alpha1.SchedulerRollout, string, model.Rollout]{w: w, tracker: w.rollouts,
			typed: toRollout, key: (*v1alpha1.SchedulerRollout).GetName, convert: model.ConvertRollout}.on})
	}
	for _, h := range handlers {
		reg, err := h.inf.AddEventHandler(handler(h.f))
		if err != nil {
			return nil, fmt.Errorf("watch: adding event handler: %w", err)
		}
		w.handlers = append(w.handlers, reg)
	}
	return w, nil
}

// Run starts the informers, waits for their initial lists, then delivers
// batches to the sink until ctx is done. It returns an error if the caches
// cannot sync before ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	w.ctx = ctx
	w.factory.Start(ctx.Done())
	defer w.factory.Shutdown()
	if w.dynFactory != nil {
		w.dynFactory.Start(ctx.Done())
		defer w.dynFactory.Shutdown()
	}
	for typ, ok := range w.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("watch: cache for %v did not sync", typ)
		}
	}
	if w.dynFactory != nil {
		for gvr, ok := range w.dynFactory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("watch: cache for %v did not sync (is the CRD installed?)", gvr)
			}
		}
	}
	// The first batch must hold the whole cluster: wait until our handlers,
	// not just the caches, have seen every listed object.
	synced := make([]cache.InformerSynced, 0, len(w.handlers))
	for _, h := range w.handlers {
		synced = append(synced, h.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("watch: event handlers did not receive the initial lists: %w", ctx.Err())
	}
	w.synced.Store(true)
	w.log.Info("informer caches synced",
		zap.Int("services", w.services.len()), zap.Int("endpointSlices", w.slices.len()), zap.Int("nodes", w.nodes.len()))
	w.runner.Run()
	w.runner.loop(ctx)
	return nil
}

// Synced reports whether the initial lists have been received.
func (w *Watcher) Synced() bool { return w.synced.Load() }

// sync drains the trackers into one batch for the sink.
func (w *Watcher) sync(periodic bool) error {
	ch := &Changes{Services: w.services.take(), Slices: w.slices.take(), Nodes: w.nodes.take(),
		Namespaces: w.nss.take(), Rollouts: w.rollouts.take(), Periodic: periodic}
	if ch.Empty() && !periodic && !w.sinkPending() {
		return nil
	}
	if err := w.sink.Apply(w.ctx, ch); err != nil {
		w.log.Error("applying changes failed; will retry", zap.Error(err),
			zap.Int("services", len(ch.Services)), zap.Int("endpointSlices", len(ch.Slices)), zap.Int("nodes", len(ch.Nodes)))
		w.services.requeue(ch.Services)
		w.slices.requeue(ch.Slices)
		w.nodes.requeue(ch.Nodes)
		w.nss.requeue(ch.Namespaces)
		w.rollouts.requeue(ch.Rollouts)
		return err
	}
	if w.sinkPending() {
		w.runner.Run() // the next chunk, after the coalescing gap
	}
	return nil
}

// Trigger asks for a run soon (after the coalescing gap) even without
// object changes, for work the sink holds itself (a PendingSink whose
// Pending is true: new settings). Before the initial sync it does nothing:
// the first run comes anyway.
func (w *Watcher) Trigger() { w.request(true) }

func (w *Watcher) sinkPending() bool {
	p, ok := w.sink.(PendingSink)
	return ok && p.Pending()
}

func (w *Watcher) request(pending bool) {
	// Before the initial sync the first run is requested by Run itself.
	if pending && w.synced.Load() {
		w.runner.Run()
	}
}

// kindHandler records one informer's events (O: its Kubernetes type) in
// the tracker of their model type T. The old object is converted only when
// the tracker needs it: when no change of its key is pending (a pending
// change keeps its first Previous).
type kindHandler[O any, K comparable, T any] struct {
	w       *Watcher
	tracker *tracker[K, T]
	typed   func(obj any) *O // the object; nil if absent or not an O
	key     func(*O) K
	convert func(*O) (*T, []model.Problem)
	// triggerTime is when the object says it changed, if it says so
	// (nil: never); otherwise the change happened now.
	triggerTime func(*O) (time.Time, bool)
}

// on records the event old → cur (nil = absent).
func (h kindHandler[O, K, T]) on(old, cur any) {
	o, c := h.typed(old), h.typed(cur)
	ref := c
	if ref == nil {
		ref = o
	}
	if ref == nil {
		return
	}
	trigger := h.w.opts.Clock.Now()
	if h.triggerTime != nil {
		if t, ok := h.triggerTime(ref); ok {
			trigger = t
		}
	}
	prev := func() *Observed[T] { return observe(o, h.convert) }
	h.w.request(h.tracker.update(h.key(ref), prev, observe(c, h.convert), trigger))
}

// typed is obj as an *O; nil if absent or of another type.
func typed[O any](obj any) *O {
	o, _ := obj.(*O)
	return o
}

func serviceKey(s *corev1.Service) model.ServiceKey {
	return model.ServiceKey{Namespace: s.Namespace, Name: s.Name}
}

func sliceKey(s *discoveryv1.EndpointSlice) model.SliceKey {
	return model.SliceKey{Namespace: s.Namespace, Name: s.Name}
}

// sliceTriggerTime is the EndpointSlice's
// endpoints.kubernetes.io/last-change-trigger-time, if set and valid.
func sliceTriggerTime(s *discoveryv1.EndpointSlice) (time.Time, bool) {
	if v := s.Annotations[model.AnnotationTriggerTime]; v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// toRollout converts an informer object (unstructured) to the typed
// SchedulerRollout; nil if absent or not convertible.
func toRollout(obj any) *v1alpha1.SchedulerRollout {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u == nil {
		return nil
	}
	var r v1alpha1.SchedulerRollout
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
		return nil
	}
	return &r
}

// Rollouts returns the SchedulerRollouts in the watch's cache (typed), for
// the rollout controller; nil without Options.Rollouts.
func (w *Watcher) Rollouts() []*v1alpha1.SchedulerRollout {
	if w.rolloutInf == nil {
		return nil
	}
	var out []*v1alpha1.SchedulerRollout
	for _, o := range w.rolloutInf.GetStore().List() {
		if r := toRollout(o); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// observe converts a Kubernetes object; nil stays nil (absent).
func observe[K any, T any](obj *K, conv func(*K) (*T, []model.Problem)) *Observed[T] {
	if obj == nil {
		return nil
	}
	v, p := conv(obj)
	return &Observed[T]{Value: v, Problems: p}
}

// handler adapts f(old, cur) to informer callbacks (nil = absent), unwrapping
// delete tombstones.
func handler(f func(old, cur any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { f(nil, obj) },
		UpdateFunc: func(old, cur any) { f(old, cur) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			f(obj, nil)
		},
	}
}
