package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/e2e/cluster"
)

// churn creates, changes and deletes other Services and their
// EndpointSlices at a steady pace (one write every churnInterval), so that
// convergence is checked against a moving target: creations (ClusterIP or
// NodePort, TCP or TCP+UDP), endpoint changes (a subset of the pods, one of
// them terminating now and then), type changes, session-affinity changes,
// deletions, and scheduler rollouts over them (one at a time: started,
// paused or resumed, aborted, deleted). One Service in three is dual-stack
// (an IPv6 slice beside the IPv4 one); one endpoint set in three carries
// zone hints; node2 changes zone (zone-b <-> zone-a) and gains or loses an
// ExternalIP address now and then. Its operations come from the seed (their timing from the
// machine); a write the apiserver refuses (down) is counted and skipped.
type churn struct {
	r      *run
	rng    *rand.Rand
	live   []string
	next   int
	counts map[string]int
	errors int
	// rollout is the live SchedulerRollout's name ("" when none).
	rollout  string
	rollouts int
	dyn      dynamic.Interface
	// dual: the live dual-stack Services. zones: each node's zone now.
	dual  map[string]bool
	zones map[string]string
}

// churnZones are the nodes' zones at the start (Options.Zones).
var churnZones = []string{"zone-a", "zone-b"}

// node2ExternalIP is the address the node op adds to and removes from
// node2's status (in the test range, on no interface: no traffic goes there).
const node2ExternalIP = "198.19.250.12"

// churnLabel marks the churn's Services: its rollouts select them, never the
// stable ones.
var churnLabel = map[string]string{"soak": "churn"}

// rolloutSchedulers are the schedulers a churn rollout moves to (the
// Services' own is rr).
var rolloutSchedulers = []string{"mh", "sh", "lc", "wrr"}

const (
	churnInterval = 3 * time.Second
	churnMax      = 8
)

var churnPods = []string{"pod-a", "pod-b", "pod-c", "pod-d"}

func newChurn(r *run, seed uint64) (*churn, error) {
	dyn, err := dynamic.NewForConfig(r.c.Env.RESTConfig())
	if err != nil {
		return nil, err
	}
	return &churn{r: r, rng: rand.New(rand.NewPCG(seed, 0x636875726e)), counts: map[string]int{}, dyn: dyn, // "churn"
		dual: map[string]bool{}, zones: map[string]string{"node1": churnZones[0], "node2": churnZones[1]}}, nil
}

func (ch *churn) run(ctx context.Context) {
	tick := time.NewTicker(churnInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		op := ch.pick()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := ch.do(wctx, op)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			ch.errors++
			continue
		}
		ch.counts[op]++
	}
}

func (ch *churn) pick() string {
	switch n := ch.rng.IntN(20); {
	case len(ch.live) < 2 || (n < 6 && len(ch.live) < churnMax):
		return "create"
	case n < 12:
		return "endpoints"
	case n < 14:
		return "type"
	case n < 15:
		return "affinity"
	case n < 17:
		return "rollout"
	case n < 18:
		return "node"
	default:
		return "delete"
	}
}

func (ch *churn) ports() []cluster.Port {
	if ch.rng.IntN(2) == 0 {
		return stablePorts[:1]
	}
	return stablePorts
}

// endpoints draws one to four of the pods, the first terminating (not
// ready) one time in four, all with their node's zone and a hint for it one
// time in three; dual adds each pod's IPv6 endpoint (v6).
func (ch *churn) endpoints(dual bool) (v4, v6 []cluster.Endpoint, err error) {
	pods := append([]string(nil), churnPods...)
	ch.rng.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
	hints := ch.rng.IntN(3) == 0
	for i, p := range pods[:1+ch.rng.IntN(len(pods))] {
		terminating := i == 0 && ch.rng.IntN(4) == 0
		for _, ipv6 := range []bool{false, true} {
			if ipv6 && !dual {
				continue
			}
			ep, err := ch.r.c.PodEndpoint(p, ipv6)
			if err != nil {
				return nil, nil, err
			}
			ep.NotReady, ep.Terminating = terminating, terminating
			if hints {
				ep.Zone = ch.zones[ep.Node]
				ep.HintZones = []string{ep.Zone}
			}
			if ipv6 {
				v6 = append(v6, ep)
			} else {
				v4 = append(v4, ep)
			}
		}
	}
	return v4, v6, nil
}

// applySlices writes name's IPv4 slice and, for a dual-stack Service, its
// IPv6 one.
func (ch *churn) applySlices(ctx context.Context, name string, ports []cluster.Port, v4, v6 []cluster.Endpoint) error {
	c := ch.r.c
	if err := c.ApplySlice(ctx, ns, name, name+"-vsplane", discoveryv1.AddressTypeIPv4, ports, v4); err != nil {
		return err
	}
	if !ch.dual[name] {
		return nil
	}
	return c.ApplySlice(ctx, ns, name, name+"-vsplane6", discoveryv1.AddressTypeIPv6, ports, v6)
}

func (ch *churn) do(ctx context.Context, op string) error {
	c := ch.r.c
	svcs := c.Kube.CoreV1().Services(ns)
	switch op {
	case "create":
		ch.next++
		name := fmt.Sprintf("churn-%d", ch.next)
		ports := ch.ports()
		dual := ch.rng.IntN(3) == 0
		v4, v6, err := ch.endpoints(dual)
		if err != nil {
			return err
		}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: churnLabel},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}}
		if dual {
			policy := corev1.IPFamilyPolicyRequireDualStack
			svc.Spec.IPFamilyPolicy = &policy
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		}
		for _, p := range ports {
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol,
				TargetPort: intstr.FromInt32(cluster.ServePort)})
		}
		if _, err := svcs.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return err
		}
		ch.live = append(ch.live, name)
		ch.dual[name] = dual
		return ch.applySlices(ctx, name, ports, v4, v6)
	case "rollout":
		return ch.doRollout(ctx)
	case "node":
		return ch.doNode(ctx)
	case "delete":
		i := ch.rng.IntN(len(ch.live))
		name := ch.live[i]
		ch.live = append(ch.live[:i], ch.live[i+1:]...)
		dual := ch.dual[name]
		delete(ch.dual, name)
		if err := c.DeleteService(ctx, ns, name); err != nil {
			return err
		}
		if dual {
			return c.Kube.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name+"-vsplane6", metav1.DeleteOptions{})
		}
		return nil
	}
	name := ch.live[ch.rng.IntN(len(ch.live))]
	svc, err := svcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	switch op {
	case "endpoints":
		v4, v6, err := ch.endpoints(ch.dual[name])
		if err != nil {
			return err
		}
		var ports []cluster.Port
		for _, p := range svc.Spec.Ports {
			ports = append(ports, cluster.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
		}
		return ch.applySlices(ctx, name, ports, v4, v6)
	case "type":
		if svc.Spec.Type == corev1.ServiceTypeNodePort {
			svc.Spec.Type = corev1.ServiceTypeClusterIP
			for i := range svc.Spec.Ports {
				svc.Spec.Ports[i].NodePort = 0
			}
			svc.Spec.ExternalTrafficPolicy = ""
		} else {
			svc.Spec.Type = corev1.ServiceTypeNodePort
		}
	case "affinity":
		if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
		} else {
			svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}
	}
	_, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
	return err
}

// doRollout starts a SchedulerRollout of the churn's Services (two steps:
// one node, then all; paused at its first step one time in two) when none
// is live, else pauses or resumes, aborts or deletes the live one.
func (ch *churn) doRollout(ctx context.Context) error {
	res := ch.dyn.Resource(v1alpha1.Resource)
	if ch.rollout == "" {
		ch.rollouts++
		name := fmt.Sprintf("churn-rollout-%d", ch.rollouts)
		ro := &v1alpha1.SchedulerRollout{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "SchedulerRollout"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.SchedulerRolloutSpec{Scheduler: rolloutSchedulers[ch.rng.IntN(len(rolloutSchedulers))],
				Paused:          ch.rng.IntN(2) == 0,
				ServiceSelector: &metav1.LabelSelector{MatchLabels: churnLabel},
				Strategy:        v1alpha1.RolloutStrategy{Steps: []intstr.IntOrString{intstr.FromInt32(1), intstr.FromString("100%")}}},
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ro)
		if err != nil {
			return err
		}
		if _, err := res.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			return err
		}
		ch.rollout = name
		return nil
	}
	var patch string
	switch n := ch.rng.IntN(4); n {
	case 0:
		patch = `{"spec":{"paused":true}}`
	case 1:
		patch = `{"spec":{"paused":false}}`
	case 2:
		patch = `{"spec":{"abort":true}}`
	default:
		name := ch.rollout
		ch.rollout = ""
		return res.Delete(ctx, name, metav1.DeleteOptions{})
	}
	_, err := res.Patch(ctx, ch.rollout, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// doNode changes node2: its zone (zone-b <-> zone-a) or, one time in two,
// its ExternalIP (added when absent, removed when present).
func (ch *churn) doNode(ctx context.Context) error {
	nodes := ch.r.c.Kube.CoreV1().Nodes()
	n, err := nodes.Get(ctx, "node2", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if ch.rng.IntN(2) == 0 {
		zone := churnZones[0]
		if ch.zones["node2"] == zone {
			zone = churnZones[1]
		}
		n.Labels["topology.kubernetes.io/zone"] = zone
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		ch.zones["node2"] = zone
		return nil
	}
	kept := n.Status.Addresses[:0]
	for _, a := range n.Status.Addresses {
		if a.Address != node2ExternalIP {
			kept = append(kept, a)
		}
	}
	if len(kept) == len(n.Status.Addresses) {
		kept = append(kept, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: node2ExternalIP})
	}
	n.Status.Addresses = kept
	_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
	return err
}
