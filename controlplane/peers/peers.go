// Package peers finds the other replicas of the control plane and keeps a
// gRPC connection to each, for the fleet-wide inspection view (any replica
// answers for every agent), which the rollout leader's gates read too.
//
// Why peers and not a status object per node: every replica already
// computes the same desired state, so only the agents' reports are local to
// one replica. Asking the (few) peers when someone inspects costs the API
// server nothing (no per-node writes, no extra watch events for every
// replica); discovery is one namespaced, label-selected EndpointSlice watch.
//
//	replica A ── ListAgents{SCOPE_REPLICA} ──▶ replica B, replica C (parallel, bounded wait)
//	   ▲ discovery: EndpointSlices of the peer Service (or a static list)
package peers

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"

	"go.uber.org/zap"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"google.golang.org/grpc"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Peers is the set of other replicas. Safe for concurrent use.
type Peers struct {
	self string
	dial []grpc.DialOption
	log  *zap.Logger

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // address -> connection
}

// New returns a Peers that excludes self (this replica's advertised
// address) and dials with opts (credentials).
func New(self string, log *zap.Logger, opts ...grpc.DialOption) *Peers {
	if log == nil {
		log = zap.NewNop()
	}
	return &Peers{self: self, dial: opts, log: log, conns: map[string]*grpc.ClientConn{}}
}

// Self is this replica's advertised address.
func (p *Peers) Self() string { return p.self }

// Set replaces the peer addresses (self is ignored); connections to gone
// peers are closed, new ones dialled lazily by gRPC.
func (p *Peers) Set(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	want := map[string]bool{}
	for _, a := range addrs {
		if a != "" && a != p.self {
			want[a] = true
		}
	}
	changed := false
	for a, c := range p.conns {
		if !want[a] {
			_ = c.Close()
			delete(p.conns, a)
			changed = true
		}
	}
	for a := range want {
		if _, ok := p.conns[a]; ok {
			continue
		}
		c, err := grpc.NewClient(a, p.dial...)
		if err != nil {
			p.log.Warn("cannot set up a peer connection", zap.String("peer", a), zap.Error(err))
			continue
		}
		p.conns[a] = c
		changed = true
	}
	if changed {
		p.log.Info("control-plane peers", zap.Strings("peers", slices.Sorted(maps.Keys(p.conns))))
	}
}

// Clients returns an InspectService client per peer address.
func (p *Peers) Clients() map[string]vsplanev1.InspectServiceClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]vsplanev1.InspectServiceClient, len(p.conns))
	for a, c := range p.conns {
		out[a] = vsplanev1.NewInspectServiceClient(c)
	}
	return out
}

// Close closes every peer connection.
func (p *Peers) Close() {
	p.Set(nil)
}

// Watch keeps the peers equal to the ready endpoints of the EndpointSlices
// of Service namespace/service (label kubernetes.io/service-name), each at
// that slice's port named portName, until ctx ends. One namespaced,
// label-selected watch; the control plane's Pods are the endpoints.
func (p *Peers) Watch(ctx context.Context, client kubernetes.Interface, namespace, service, portName string) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + service
		}))
	inf := f.Discovery().V1().EndpointSlices().Informer()
	update := func() { p.Set(addresses(inf.GetStore().List(), portName)) }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { update() },
		UpdateFunc: func(any, any) { update() },
		DeleteFunc: func(any) { update() },
	}); err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	<-ctx.Done()
	return nil
}

// addresses are host:port of the ready endpoints of slices at portName.
func addresses(objs []any, portName string) []string {
	var out []string
	for _, o := range objs {
		es, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		var port int32
		for _, pt := range es.Ports {
			if pt.Name != nil && *pt.Name == portName && pt.Port != nil {
				port = *pt.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				out = append(out, net.JoinHostPort(a, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
