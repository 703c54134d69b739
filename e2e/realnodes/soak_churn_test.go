//go:build realsoak

package realnodes

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vsplane/vsplane/e2e/soak"
)

// realChurn changes other objects all along: a Deployment "churn" scaled
// between 1 and 3 Pods (the EndpointSlice controller follows), and up to
// four Services on it created, switched between ClusterIP and NodePort,
// given or stripped of ClientIP affinity, and deleted; one write every 3 s
// (a scale only once the last one settled).
type realChurn struct {
	r      *realSoak
	rng    *rand.Rand
	counts map[string]int
	errors int
	live   []string
	next   int
}

func (c *realChurn) setup(t *testing.T) {
	serveHostname(t, c.r.ctx, c.r.ns, "churn", 1)
}

func (c *realChurn) run(ctx context.Context) {
	tick := time.NewTicker(3 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		op, err := c.step(ctx)
		if ctx.Err() != nil {
			return
		}
		c.counts[op]++
		if err != nil {
			c.errors++ // the apiserver may be down: not a violation
		}
	}
}

func (c *realChurn) step(ctx context.Context) (string, error) {
	ns, svcs := c.r.ns, rc.Kube.CoreV1().Services(c.r.ns)
	switch n := c.rng.IntN(10); {
	case n < 3:
		replicas := int32(1 + c.rng.IntN(3))
		if settled, err := c.settled(ctx); err != nil || !settled {
			return "scale deferred", err
		}
		_, err := rc.Kube.AppsV1().Deployments(ns).Patch(ctx, "churn", "application/merge-patch+json",
			fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas), metav1.PatchOptions{})
		return "scale", err
	case n < 6 && len(c.live) < 4 || len(c.live) == 0:
		c.next++
		name := fmt.Sprintf("churn-%d", c.next)
		svc := serviceObject(ns, name, corev1.ServiceTypeClusterIP, corev1.ProtocolTCP)
		svc.Spec.Selector = map[string]string{"app": "churn"}
		if _, err := svcs.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return "create", err
		}
		c.live = append(c.live, name)
		return "create", nil
	case n < 8:
		name := c.live[c.rng.IntN(len(c.live))]
		svc, err := svcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "change", err
		}
		if c.rng.IntN(2) == 0 {
			if svc.Spec.Type == corev1.ServiceTypeNodePort {
				svc.Spec.Type = corev1.ServiceTypeClusterIP
				for i := range svc.Spec.Ports {
					svc.Spec.Ports[i].NodePort = 0
				}
			} else {
				svc.Spec.Type = corev1.ServiceTypeNodePort
			}
			_, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
			return "type", err
		}
		if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
		} else {
			svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}
		_, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
		return "affinity", err
	default:
		i := c.rng.IntN(len(c.live))
		err := svcs.Delete(ctx, c.live[i], metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		if err == nil {
			c.live = slices.Delete(c.live, i, i+1)
		}
		return "delete", err
	}
}

// settled reports whether the churn Deployment's last scale is done: its
// Pods all Ready and none terminating. Scaling again before would pile up
// Pods the TCG guest cannot start and stop as fast as they are asked for
// (a 30-minute run on 2026-12-07 found the guest's load at 40, churn Pods
// Terminating for minutes, and every probe and check timing out).
func (c *realChurn) settled(ctx context.Context) (bool, error) {
	d, err := rc.Kube.AppsV1().Deployments(c.r.ns).Get(ctx, "churn", metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	want := ptr.Deref(d.Spec.Replicas, 1)
	if d.Status.ObservedGeneration < d.Generation || d.Status.Replicas != want || d.Status.ReadyReplicas != want {
		return false, nil
	}
	pods, err := rc.Kube.CoreV1().Pods(c.r.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=churn"})
	if err != nil {
		return false, err
	}
	return !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil }), nil
}

// realMemory samples every agent's and replica's RSS and goroutines every
// 10 s from their /metrics: both are hostNetwork Pods, with their metrics
// on the node's loopback (the chart's metricsAddress values).
type realMemory struct {
	r       *realSoak
	mu      sync.Mutex
	samples map[string][]soak.MemorySample
	lastErr error
}

var metricsPorts = map[string]int{"agent": 10249, "replica": 18001}

func (m *realMemory) run(ctx context.Context) {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		for _, n := range rc.Nodes {
			for what, port := range metricsPorts {
				cctx, cancel := context.WithTimeout(ctx, soakCallTimeout)
				res, err := rc.VM.RunIn(cctx, n.Name, fmt.Sprintf("wget -qO- http://127.0.0.1:%d/metrics", port))
				cancel()
				if err == nil {
					err = res.Err()
				}
				if err != nil {
					m.mu.Lock()
					m.lastErr = fmt.Errorf("%s %s: %w", what, n.Name, err)
					m.mu.Unlock()
					continue // stopped, restarting, or the guest busy: the next tick
				}
				if s, ok := soak.ParseProcessMetrics(res.Stdout); ok {
					s.At = m.r.since()
					m.mu.Lock()
					m.samples[what+" "+n.Name] = append(m.samples[what+" "+n.Name], s)
					m.mu.Unlock()
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (m *realMemory) series() []soak.MemorySeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []soak.MemorySeries
	for _, what := range []string{"agent", "replica"} {
		for _, n := range rc.Nodes {
			s := soak.MemorySeries{Name: what + " " + n.Name, Samples: m.samples[what+" "+n.Name]}
			if len(s.Samples) == 0 {
				m.r.violate("memory not sampled", "%s: no sample of its /metrics (last error: %v)", s.Name, m.lastErr)
			}
			s.Summarize()
			out = append(out, s)
		}
	}
	return out
}
