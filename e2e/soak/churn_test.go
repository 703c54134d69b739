package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
)

// churn creates, changes and deletes other Services and their
// EndpointSlices at a steady pace (one write every churnInterval), so that
// convergence is checked against a moving target: creations (ClusterIP or
// NodePort, TCP or TCP+UDP), endpoint changes (a subset of the pods, one of
// them terminating now and then), type changes, session-affinity changes,
// deletions. Its operations come from the seed (their timing from the
// machine); a write the apiserver refuses (down) is counted and skipped.
type churn struct {
	r      *run
	rng    *rand.Rand
	live   []string
	next   int
	counts map[string]int
	errors int
}

const (
	churnInterval = 3 * time.Second
	churnMax      = 8
)

var churnPods = []string{"pod-a", "pod-b", "pod-c", "pod-d"}

func newChurn(r *run, seed uint64) *churn {
	return &churn{r: r, rng: rand.New(rand.NewPCG(seed, 0x636875726e)), counts: map[string]int{}} // "churn"
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
	switch n := ch.rng.IntN(10); {
	case len(ch.live) < 2 || (n < 3 && len(ch.live) < churnMax):
		return "create"
	case n < 6:
		return "endpoints"
	case n < 7:
		return "type"
	case n < 8:
		return "affinity"
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
// ready) one time in four.
func (ch *churn) endpoints() ([]cluster.Endpoint, error) {
	pods := append([]string(nil), churnPods...)
	ch.rng.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
	var eps []cluster.Endpoint
	for i, p := range pods[:1+ch.rng.IntN(len(pods))] {
		ep, err := ch.r.c.PodEndpoint(p, false)
		if err != nil {
			return nil, err
		}
		if i == 0 && ch.rng.IntN(4) == 0 {
			ep.NotReady, ep.Terminating = true, true
		}
		eps = append(eps, ep)
	}
	return eps, nil
}

func (ch *churn) do(ctx context.Context, op string) error {
	c := ch.r.c
	svcs := c.Kube.CoreV1().Services(ns)
	switch op {
	case "create":
		ch.next++
		name := fmt.Sprintf("churn-%d", ch.next)
		ports := ch.ports()
		eps, err := ch.endpoints()
		if err != nil {
			return err
		}
		if _, err := c.CreateService(ctx, ns, name, ports, nil); err != nil {
			return err
		}
		ch.live = append(ch.live, name)
		return c.ApplySlice(ctx, ns, name, name+"-vsplane", discoveryv1.AddressTypeIPv4, ports, eps)
	case "delete":
		i := ch.rng.IntN(len(ch.live))
		name := ch.live[i]
		ch.live = append(ch.live[:i], ch.live[i+1:]...)
		return c.DeleteService(ctx, ns, name)
	}
	name := ch.live[ch.rng.IntN(len(ch.live))]
	svc, err := svcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	switch op {
	case "endpoints":
		eps, err := ch.endpoints()
		if err != nil {
			return err
		}
		var ports []cluster.Port
		for _, p := range svc.Spec.Ports {
			ports = append(ports, cluster.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol})
		}
		return c.ApplySlice(ctx, ns, name, name+"-vsplane", discoveryv1.AddressTypeIPv4, ports, eps)
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
