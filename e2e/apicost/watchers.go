package apicost

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/watch"
)

// Content types a watcher's client asks for.
const (
	// ContentProtobuf is what kube-proxy asks for (its ClientConnection
	// default).
	ContentProtobuf = "application/vnd.kubernetes.protobuf"
	// ContentJSON is client-go's default, what vsplane-controlplane asked
	// for before it set protobuf.
	ContentJSON = "application/json"
)

// conns counts the connections the watchers' clients dial.
type conns struct{ n atomic.Int64 }

// client returns a clientset with its own HTTP client and so its own
// connection: the custom Dial makes client-go's transport cache hand out a
// new transport (see transport.tlsConfigKey). contentType "" keeps
// client-go's default (JSON).
func (c *conns) client(base *rest.Config, contentType string) (*rest.Config, *http.Client, error) {
	cfg := rest.CopyConfig(base)
	cfg.ContentType = contentType
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.n.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("apicost: HTTP client: %w", err)
	}
	return cfg, hc, nil
}

// stripper replaces informer objects by one shared stub per (kind, key,
// resourceVersion) holding only name, namespace and resourceVersion, so a
// thousand watchers' caches fit in memory. It runs in the client after the
// API server sent and the client decoded the whole object: the API server's
// cost, which is what is measured, is unchanged.
type stripper struct{ m sync.Map }

func (s *stripper) transform(obj any) (any, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return obj, nil // a tombstone: keep as is
	}
	var kind string
	switch obj.(type) {
	case *corev1.Service:
		kind = "svc"
	case *discoveryv1.EndpointSlice:
		kind = "slice"
	case *corev1.Node:
		kind = "node"
	case *networkingv1.ServiceCIDR:
		kind = "cidr"
	default:
		return obj, nil
	}
	key := kind + "/" + m.GetNamespace() + "/" + m.GetName() + "@" + m.GetResourceVersion()
	if v, ok := s.m.Load(key); ok {
		return v, nil
	}
	meta := metav1.ObjectMeta{Namespace: m.GetNamespace(), Name: m.GetName(), ResourceVersion: m.GetResourceVersion()}
	var stub any
	switch obj.(type) {
	case *corev1.Service:
		stub = &corev1.Service{ObjectMeta: meta}
	case *discoveryv1.EndpointSlice:
		stub = &discoveryv1.EndpointSlice{ObjectMeta: meta}
	case *corev1.Node:
		stub = &corev1.Node{ObjectMeta: meta}
	case *networkingv1.ServiceCIDR:
		stub = &networkingv1.ServiceCIDR{ObjectMeta: meta}
	}
	v, _ := s.m.LoadOrStore(key, stub)
	return v, nil
}

// proxyWatcher watches what kube-proxy (v1.35+, cmd/kube-proxy/app/server.go
// and pkg/proxy/node.go) watches, through four informer factories on one
// client as kube-proxy does:
//   - Services with label selector !service.kubernetes.io/service-proxy-name
//     and field selector spec.clusterIP!=None;
//   - EndpointSlices with label selector !service.kubernetes.io/headless;
//   - ServiceCIDRs (MultiCIDRServiceAllocator is GA), unfiltered;
//   - its own Node, field selector metadata.name=<node>.
type proxyWatcher struct {
	node        string
	hc          *http.Client
	factories   []informers.SharedInformerFactory
	svcs        cache.SharedIndexInformer
	slices      cache.SharedIndexInformer
	synced      []cache.InformerSynced
	sliceEvents atomic.Int64 // update notifications of slices
	svcEvents   atomic.Int64 // and of Services
	cancel      context.CancelFunc
}

// kube-proxy's selectors.
var (
	proxyServiceLabels = mustSelector(model.LabelServiceProxyName)
	proxySliceLabels   = mustSelector(model.LabelHeadless)
	proxyServiceFields = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
)

func mustSelector(notKey string) string {
	r, err := labels.NewRequirement(notKey, selection.DoesNotExist, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*r).String()
}

func newProxyWatcher(base *rest.Config, cs *conns, strip *stripper, node string) (*proxyWatcher, error) {
	cfg, hc, err := cs.client(base, ContentProtobuf)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	p := &proxyWatcher{node: node, hc: hc}
	// Informers are built with no indexers (the factory's default adds a
	// namespace index): it only costs this process memory.
	svcF := informers.NewSharedInformerFactory(kube, 0)
	p.svcs = svcF.InformerFor(&corev1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.LabelSelector, o.FieldSelector = proxyServiceLabels, proxyServiceFields
		})
	})
	sliceF := informers.NewSharedInformerFactory(kube, 0)
	p.slices = sliceF.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.LabelSelector = proxySliceLabels
		})
	})
	plainF := informers.NewSharedInformerFactory(kube, 0)
	cidrs := plainF.InformerFor(&networkingv1.ServiceCIDR{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return networkinginformers.NewFilteredServiceCIDRInformer(c, resync, cache.Indexers{}, nil)
	})
	nodeF := informers.NewSharedInformerFactory(kube, 0)
	nodes := nodeF.InformerFor(&corev1.Node{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredNodeInformer(c, resync, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
		})
	})
	p.factories = []informers.SharedInformerFactory{svcF, sliceF, plainF, nodeF}
	counted := map[cache.SharedIndexInformer]*atomic.Int64{p.svcs: &p.svcEvents, p.slices: &p.sliceEvents}
	for _, inf := range []cache.SharedIndexInformer{p.svcs, p.slices, cidrs, nodes} {
		if err := inf.SetTransform(strip.transform); err != nil {
			return nil, err
		}
		n := counted[inf]
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, _ any) {
				if n != nil {
					n.Add(1)
				}
			},
		})
		if err != nil {
			return nil, err
		}
		p.synced = append(p.synced, reg.HasSynced)
	}
	return p, nil
}

// start runs the informers until run ends (or stop) and waits until every
// handler has been given its initial list, or wait ends. Like kube-proxy
// (its NodeManager waits for its Node before anything else starts), the
// Node informer syncs first, so the other watches share its HTTP/2
// connection instead of racing to dial their own.
func (p *proxyWatcher) start(run, wait context.Context) error {
	run, p.cancel = context.WithCancel(run)
	nodeF := p.factories[len(p.factories)-1]
	nodeF.Start(run.Done())
	if !cache.WaitForCacheSync(wait.Done(), p.synced[len(p.synced)-1]) {
		return fmt.Errorf("apicost: watcher of %s: its Node did not sync: %w", p.node, context.Cause(wait))
	}
	for _, f := range p.factories[:len(p.factories)-1] {
		f.Start(run.Done())
	}
	if !cache.WaitForCacheSync(wait.Done(), p.synced...) {
		return fmt.Errorf("apicost: watcher of %s did not sync: %w", p.node, context.Cause(wait))
	}
	return nil
}

func (p *proxyWatcher) stop() {
	if p.cancel != nil {
		p.cancel()
	}
	for _, f := range p.factories {
		f.Shutdown()
	}
	p.hc.CloseIdleConnections()
}

// seen reports whether the caches hold the final version of every object w
// changed, and the handlers were told of at least as many updates as were
// written since the marks.
func (p *proxyWatcher) seen(w *want, sliceMark, svcMark int64) bool {
	if p.sliceEvents.Load()-sliceMark < int64(w.sliceUpdates) || p.svcEvents.Load()-svcMark < int64(w.serviceUpdates) {
		return false
	}
	return storeHas(p.slices.GetStore(), w.sliceRV) && storeHas(p.svcs.GetStore(), w.serviceRV)
}

func storeHas(s cache.Store, rvs map[string]string) bool {
	for key, rv := range rvs {
		obj, ok, _ := s.GetByKey(key)
		if !ok {
			return false
		}
		m, ok := obj.(metav1.Object)
		if !ok || m.GetResourceVersion() != rv {
			return false
		}
	}
	return true
}

// cpWatcher is the vsplane control plane's watch (controlplane/watch, the
// informers a replica runs, SchedulerRollouts included) feeding a sink that
// keeps the latest converted slices and Services.
type cpWatcher struct {
	w      *watch.Watcher
	kube   kubernetes.Interface
	hc     *http.Client
	sink   *latestSink
	cancel context.CancelFunc
	done   chan error
}

func newCPWatcher(base *rest.Config, cs *conns, contentType string, log *zap.Logger) (*cpWatcher, error) {
	cfg, hc, err := cs.client(base, contentType)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	c := &cpWatcher{kube: kube, hc: hc, sink: newLatestSink(), done: make(chan error, 1)}
	if c.w, err = watch.New(kube, c.sink, watch.Options{Rollouts: true, Dynamic: dyn}, log); err != nil {
		return nil, err
	}
	return c, nil
}

// start runs the watch and returns once its first batch (the whole
// cluster) reached the sink.
func (c *cpWatcher) start(ctx context.Context, timeout time.Duration) error {
	// One request first, so the watches share one HTTP/2 connection
	// rather than each dialing its own at once (a replica has talked to
	// the API server before its watch starts).
	if _, err := c.kube.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("apicost: server version: %w", err)
	}
	ctx, c.cancel = context.WithCancel(ctx)
	go func() { c.done <- c.w.Run(ctx) }()
	return await(ctx, timeout, "control-plane watch synced", func() bool { return c.sink.batches.Load() > 0 })
}

func (c *cpWatcher) stop() error {
	if c.cancel == nil {
		return nil // never started
	}
	c.cancel()
	err := <-c.done
	c.hc.CloseIdleConnections()
	return err
}

// seen reports whether the sink holds every object w changed as it was
// last written.
func (c *cpWatcher) seen(w *want) bool {
	c.sink.mu.Lock()
	defer c.sink.mu.Unlock()
	for name, ips := range w.sliceIPs {
		es := c.sink.slices[name]
		if es == nil || len(es.Endpoints) != len(ips) {
			return false
		}
		for i, ep := range es.Endpoints {
			if ep.Address.String() != ips[i] {
				return false
			}
		}
	}
	for name, rev := range w.serviceRev {
		if svc := c.sink.services[name]; svc == nil || svc.Labels[labelRev] != rev {
			return false
		}
	}
	return true
}

// latestSink keeps the current converted value of every slice and Service
// of the benchmark's namespace.
type latestSink struct {
	batches  atomic.Int64
	mu       sync.Mutex
	slices   map[string]*model.EndpointSlice
	services map[string]*model.Service
}

func newLatestSink() *latestSink {
	return &latestSink{slices: map[string]*model.EndpointSlice{}, services: map[string]*model.Service{}}
}

func (s *latestSink) Apply(_ context.Context, ch *watch.Changes) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, c := range ch.Slices {
		if k.Namespace != Namespace {
			continue
		}
		if c.Current == nil || c.Current.Value == nil {
			delete(s.slices, k.Name)
			continue
		}
		s.slices[k.Name] = c.Current.Value
	}
	for k, c := range ch.Services {
		if k.Namespace != Namespace {
			continue
		}
		if c.Current == nil || c.Current.Value == nil {
			delete(s.services, k.Name)
			continue
		}
		s.services[k.Name] = c.Current.Value
	}
	s.batches.Add(1)
	return nil
}

// await polls cond (every 50 ms, then up to every 500 ms) until it holds,
// ctx ends or timeout passes.
func await(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	interval := 50 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("apicost: %s: not within %v", what, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apicost: %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
		interval = min(2*interval, 500*time.Millisecond)
	}
	return nil
}

// pending drops the watchers that are done from ws (in place), so a wait
// over many watchers asks each only until it is done.
func pending[T any](ws []T, done func(T) bool) []T {
	return slices.DeleteFunc(ws, done)
}
