package integration_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// SchedulerRollouts against a real apiserver with the CRD installed, two
// replicas electing a leader, 50 agents on in-memory kernels (5 of which
// lack the "lc" scheduler): a 4-step rollout reaches every node; one the
// NACKing agents fail rolls back; pause, resume and abort; the leader is
// stopped mid-rollout and the other replica finishes it without skipping or
// repeating a step.
func TestSchedulerRollouts(t *testing.T) {
	const agentsN = 50
	names := make([]string, agentsN)
	for i := range agentsN {
		names[i] = fmt.Sprintf("node-%02d", i)
	}
	env, kube, ctx := startKubeEnv(t, names...)
	if err := env.InstallCRDs(ctx, filepath.Join("..", "..", "deploy", "crds")); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"web-1", "web-2", "web-3"} {
		svc := clusterIPService("default", s, 80)
		svc.Labels = map[string]string{"app": "web"}
		mustCreateService(t, ctx, kube, svc)
	}
	mustCreateService(t, ctx, kube, clusterIPService("default", "other", 80))
	// A Service naming a scheduler that does not exist keeps the fleet's,
	// and the rollout leader records an Event on it.
	bad := clusterIPService("default", "bad-annotation", 80)
	bad.Annotations = map[string]string{"scheduler.vsplane.io/name": "fancy"}
	badIP := mustCreateService(t, ctx, kube, bad)

	lns := []net.Listener{listen(t), listen(t)}
	addrs := []string{lns[0].Addr().String(), lns[1].Addr().String()}
	replicas := make([]*app.Replica, 2)
	stops := make([]func(), 2)
	for i := range 2 {
		replicas[i], stops[i] = runReplica(t, ctx, app.Config{Kube: kube, GRPCListener: lns[i], Advertise: addrs[i], Peers: addrs,
			Rollouts: true, Dynamic: dyn, RolloutLease: "default/vsplane-rollout-leader",
			RolloutTiming: &app.RolloutTiming{LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 300 * time.Millisecond, Interval: 200 * time.Millisecond}})
	}
	for _, r := range replicas {
		awaitReady(t, r, converge)
	}
	kernels := map[string]*memory.Kernel{}
	var agents []*testAgent
	noLC := map[string]bool{}
	for i, n := range names {
		k := memory.New()
		if i%10 == 3 { // 5 nodes whose kernel has no "lc"
			k.SetSchedulers(slices.DeleteFunc(slices.Clone(memory.DefaultSchedulers), func(s string) bool { return s == "lc" }))
			noLC[n] = true
		}
		kernels[n] = k
		agents = append(agents, startAgentCfg(t, ctx, agent.Config{ControlPlane: addrs, NodeName: n, Kernel: ptr(k.Kernel())}))
	}
	t.Cleanup(func() {
		for _, a := range agents {
			a.stop(t)
		}
	})
	// schedulers returns how many nodes' kernels run each scheduler for the
	// web Services (all three must agree per node) and for "other".
	schedulers := func() (web map[string]int, other map[string]int, msg string) {
		web, other = map[string]int{}, map[string]int{}
		for n, k := range kernels {
			vss, err := k.Kernel().IPVS.ListVirtualServers()
			if err != nil {
				return nil, nil, err.Error()
			}
			if len(vss) < 5 {
				return nil, nil, fmt.Sprintf("%s has %d virtual servers", n, len(vss))
			}
			// "other" is the Service without the label; the rest are web.
			webSched, otherSched := "", ""
			for _, vs := range vss {
				if vs.Key.Port != 80 || vs.Key.Address.String() == badIP {
					continue
				}
				if vs.Key.Address.String() == otherIP {
					otherSched = vs.Scheduler
				} else if webSched == "" {
					webSched = vs.Scheduler
				} else if webSched != vs.Scheduler {
					return nil, nil, fmt.Sprintf("%s: web Services disagree (%s, %s)", n, webSched, vs.Scheduler)
				}
			}
			web[webSched]++
			other[otherSched]++
		}
		return web, other, ""
	}
	o, err := kube.CoreV1().Services("default").Get(ctx, "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	otherIP = o.Spec.ClusterIP
	eventually(t, time.Minute, func() string {
		web, _, msg := schedulers()
		if msg != "" {
			return msg
		}
		if web["rr"] != agentsN {
			return fmt.Sprintf("web schedulers %v before any rollout", web)
		}
		return ""
	})

	create := func(name, sched string, mutate func(*v1alpha1.SchedulerRollout)) {
		t.Helper()
		createRollout(t, ctx, dyn, name, sched, mutate)
	}
	get := func(name string) *v1alpha1.SchedulerRollout {
		t.Helper()
		u, err := dyn.Resource(v1alpha1.Resource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ro v1alpha1.SchedulerRollout
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ro); err != nil {
			t.Fatal(err)
		}
		return &ro
	}
	patchSpec := func(name, patch string) {
		t.Helper()
		if _, err := dyn.Resource(v1alpha1.Resource).Patch(ctx, name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	awaitPhase := func(name string, timeout time.Duration, phases ...v1alpha1.Phase) *v1alpha1.SchedulerRollout {
		t.Helper()
		var ro *v1alpha1.SchedulerRollout
		eventually(t, timeout, func() string {
			ro = get(name)
			if slices.Contains(phases, ro.Status.Phase) {
				return ""
			}
			return fmt.Sprintf("%s: phase %q step %d updated %d/%d failed %d", name, ro.Status.Phase, ro.Status.CurrentStep,
				ro.Status.NodesUpdated, ro.Status.NodesTotal, ro.Status.NodesFailed)
		})
		return ro
	}
	awaitKernels := func(want map[string]int) {
		t.Helper()
		eventually(t, time.Minute, func() string {
			web, other, msg := schedulers()
			if msg != "" {
				return msg
			}
			if fmt.Sprint(web) != fmt.Sprint(want) || other[""] != agentsN && other["rr"] != agentsN {
				return fmt.Sprintf("kernels: web %v other %v; want web %v, other untouched", web, other, want)
			}
			return ""
		})
	}

	t.Run("the example manifest and the CRD's validation", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", "schedulerrollout-mh.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var u unstructured.Unstructured
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(v1alpha1.Resource).Create(ctx, &u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatalf("the example is refused: %v", err)
		}
		// A scheduler that does not exist is refused by the API server.
		unstructured.SetNestedField(u.Object, "fancy", "spec", "scheduler")
		if _, err := dyn.Resource(v1alpha1.Resource).Create(ctx, &u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), "spec.scheduler") {
			t.Fatalf("scheduler \"fancy\" accepted: %v", err)
		}
	})

	t.Run("a bad scheduler annotation is an Event on the Service", func(t *testing.T) {
		assertEvents(t, ctx, kube, "bad-annotation", "BadScheduler")
	})

	t.Run("a 4-step rollout reaches every node", func(t *testing.T) {
		create("to-wlc", "wlc", nil) // default steps: 1, 25%, 50%, 100%
		ro := awaitPhase("to-wlc", 2*time.Minute, v1alpha1.PhaseSucceeded, v1alpha1.PhaseRolledBack)
		if ro.Status.Phase != v1alpha1.PhaseSucceeded {
			t.Fatalf("phase %s: %+v", ro.Status.Phase, ro.Status)
		}
		var counts []int32
		for _, s := range ro.Status.Steps {
			counts = append(counts, s.Nodes)
		}
		if fmt.Sprint(counts) != "[1 13 25 50]" || ro.Status.NodesUpdated != agentsN {
			t.Fatalf("steps %v updated %d, want [1 13 25 50] and %d", counts, ro.Status.NodesUpdated, agentsN)
		}
		awaitKernels(map[string]int{"wlc": agentsN})
		assertEvents(t, ctx, kube, "to-wlc", "StepStarted", "StepDone", "Succeeded")
		// Any replica shows the per-node progress (grpcurl GetRollout).
		p, err := replicas[1].Inspect.GetRollout(ctx, &vsplanev1.GetRolloutRequest{Name: "to-wlc"})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.GetNodes()) != agentsN || len(p.GetServices()) != 3 || p.GetPhase() != "Succeeded" {
			t.Fatalf("GetRollout: %d nodes, services %v, phase %s", len(p.GetNodes()), p.GetServices(), p.GetPhase())
		}
		for _, n := range p.GetNodes() {
			if n.GetState() != vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_UPDATED || !n.GetCapable() {
				t.Errorf("GetRollout node %s: %v capable %v", n.GetNodeName(), n.GetState(), n.GetCapable())
			}
		}
		// Every replica exports the rollout's progress, and one leads.
		eventually(t, 30*time.Second, func() string {
			leaders := 0.0
			for i, r := range replicas {
				text := gatherText(t, r)
				for _, want := range []string{
					`vsplane_controlplane_rollout_phase{phase="Succeeded",rollout="to-wlc",scheduler="wlc"} 1`,
					`vsplane_controlplane_rollout_step{rollout="to-wlc"} 4`,
					`vsplane_controlplane_rollout_steps{rollout="to-wlc"} 4`,
					fmt.Sprintf(`vsplane_controlplane_rollout_nodes{rollout="to-wlc",state="updated"} %d`, agentsN),
					`vsplane_controlplane_rollout_nodes{rollout="to-wlc",state="failed"} 0`,
				} {
					if !strings.Contains(text, want+"\n") {
						return fmt.Sprintf("replica %d lacks %s; has:\n%s", i, want, grepLines(text, "rollout"))
					}
				}
				leaders += metricValue(t, r, "vsplane_controlplane_rollout_leader", "", "")
			}
			if leaders != 1 {
				return fmt.Sprintf("%v replicas say they lead", leaders)
			}
			return ""
		})
		// ExplainService says which scheduler a node's Service uses and why.
		ex, err := replicas[0].Inspect.ExplainService(ctx, &vsplanev1.ExplainServiceRequest{NodeName: names[3], Namespace: "default", Name: "web-2"})
		if err != nil {
			t.Fatal(err)
		}
		if ex.GetService().GetSchedulerSource() != "SchedulerRollout to-wlc" || ex.GetService().GetVirtualServers()[0].GetScheduler() != "wlc" {
			t.Fatalf("ExplainService: scheduler %q from %q", ex.GetService().GetVirtualServers()[0].GetScheduler(), ex.GetService().GetSchedulerSource())
		}
	})

	t.Run("NACKs from nodes without the scheduler roll everything back", func(t *testing.T) {
		no := false
		create("to-lc", "lc", func(ro *v1alpha1.SchedulerRollout) {
			ro.Spec.Strategy.Steps = []intstr.IntOrString{intstr.FromString("50%"), intstr.FromString("100%")}
			ro.Spec.Strategy.Gates.RequireCapability = &no // let them NACK
		})
		ro := awaitPhase("to-lc", 2*time.Minute, v1alpha1.PhaseRolledBack, v1alpha1.PhaseSucceeded)
		if ro.Status.Phase != v1alpha1.PhaseRolledBack || ro.Status.NodesFailed == 0 {
			t.Fatalf("phase %s failed %d: %+v", ro.Status.Phase, ro.Status.NodesFailed, ro.Status)
		}
		for _, f := range ro.Status.FailedNodes {
			if !noLC[f.Node] || !strings.Contains(f.Reason, "not offered by this kernel") {
				t.Errorf("failed node %s: %q (lacks lc: %v)", f.Node, f.Reason, noLC[f.Node])
			}
		}
		// Every node is back on the previous rollout's scheduler.
		awaitKernels(map[string]int{"wlc": agentsN})
		assertEvents(t, ctx, kube, "to-lc", "RolledBack")
	})

	t.Run("the capability gate stops a rollout before any node NACKs", func(t *testing.T) {
		create("to-lc-checked", "lc", func(ro *v1alpha1.SchedulerRollout) {
			ro.Spec.Strategy.Steps = []intstr.IntOrString{intstr.FromString("100%")}
		})
		ro := awaitPhase("to-lc-checked", time.Minute, v1alpha1.PhaseRolledBack, v1alpha1.PhaseSucceeded)
		if ro.Status.Phase != v1alpha1.PhaseRolledBack || len(ro.Status.Steps) != 0 {
			t.Fatalf("phase %s steps %d", ro.Status.Phase, len(ro.Status.Steps))
		}
		awaitKernels(map[string]int{"wlc": agentsN})
	})

	t.Run("pause, resume and abort", func(t *testing.T) {
		create("to-sed", "sed", func(ro *v1alpha1.SchedulerRollout) {
			ro.Spec.Paused = true
			ro.Spec.Strategy.Steps = []intstr.IntOrString{intstr.FromInt32(5), intstr.FromString("100%")}
		})
		awaitPhase("to-sed", time.Minute, v1alpha1.PhasePaused)
		awaitKernels(map[string]int{"sed": 5, "wlc": agentsN - 5})
		patchSpec("to-sed", `{"spec":{"paused":false}}`)
		awaitPhase("to-sed", time.Minute, v1alpha1.PhaseSucceeded)
		awaitKernels(map[string]int{"sed": agentsN})

		create("to-nq", "nq", func(ro *v1alpha1.SchedulerRollout) {
			ro.Spec.Strategy.Steps = []intstr.IntOrString{intstr.FromInt32(10), intstr.FromString("100%")}
			ro.Spec.Strategy.PauseBetweenSteps = metav1.Duration{Duration: time.Hour}
		})
		eventually(t, time.Minute, func() string {
			if ro := get("to-nq"); len(ro.Status.Steps) != 1 || ro.Status.Steps[0].DoneTime == nil {
				return "first step of to-nq not done"
			}
			return ""
		})
		awaitKernels(map[string]int{"nq": 10, "sed": agentsN - 10})
		patchSpec("to-nq", `{"spec":{"abort":true}}`)
		awaitPhase("to-nq", time.Minute, v1alpha1.PhaseAborted)
		awaitKernels(map[string]int{"sed": agentsN})
	})

	t.Run("the leader stops mid-rollout; the other replica finishes it", func(t *testing.T) {
		create("to-lblc", "lblc", func(ro *v1alpha1.SchedulerRollout) {
			ro.Spec.Strategy.Steps = []intstr.IntOrString{intstr.FromString("20%"), intstr.FromString("40%"),
				intstr.FromString("60%"), intstr.FromString("80%"), intstr.FromString("100%")}
			ro.Spec.Strategy.PauseBetweenSteps = metav1.Duration{Duration: time.Second}
		})
		eventually(t, time.Minute, func() string {
			if ro := get("to-lblc"); ro.Status.CurrentStep < 1 {
				return fmt.Sprintf("step %d", ro.Status.CurrentStep)
			}
			return ""
		})
		leader := -1
		for i, r := range replicas {
			if r.Rollouts.Leading() {
				leader = i
			}
		}
		if leader < 0 {
			t.Fatal("no replica leads")
		}
		stops[leader]()
		t.Logf("stopped the leader, replica %d (%s)", leader, addrs[leader])
		ro := awaitPhase("to-lblc", 2*time.Minute, v1alpha1.PhaseSucceeded, v1alpha1.PhaseRolledBack)
		if ro.Status.Phase != v1alpha1.PhaseSucceeded {
			t.Fatalf("after the failover: phase %s %+v", ro.Status.Phase, ro.Status)
		}
		if !replicas[1-leader].Rollouts.Leading() {
			t.Error("the remaining replica does not lead")
		}
		var counts []int32
		for i, s := range ro.Status.Steps {
			counts = append(counts, s.Nodes)
			if i > 0 && !s.StartTime.After(ro.Status.Steps[i-1].StartTime.Time) && !s.StartTime.Equal(&ro.Status.Steps[i-1].StartTime) {
				t.Errorf("step %d started before step %d", i, i-1)
			}
		}
		if fmt.Sprint(counts) != "[10 20 30 40 50]" {
			t.Fatalf("steps %v, want [10 20 30 40 50]: none skipped or repeated", counts)
		}
		awaitKernels(map[string]int{"lblc": agentsN})
	})
}

var otherIP string

// createRollout creates a SchedulerRollout of the Services labelled
// app=web to sched; mutate (if not nil) changes it first.
func createRollout(t *testing.T, ctx context.Context, dyn dynamic.Interface, name, sched string, mutate func(*v1alpha1.SchedulerRollout)) {
	t.Helper()
	ro := &v1alpha1.SchedulerRollout{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "SchedulerRollout"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SchedulerRolloutSpec{Scheduler: sched,
			ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	if mutate != nil {
		mutate(ro)
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ro)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(v1alpha1.Resource).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func assertEvents(t *testing.T, ctx context.Context, kube kubernetes.Interface, name string, reasons ...string) {
	t.Helper()
	eventually(t, 30*time.Second, func() string {
		evs, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err.Error()
		}
		seen := map[string]bool{}
		for _, e := range evs.Items {
			seen[e.Reason] = true
		}
		for _, r := range reasons {
			if !seen[r] {
				return fmt.Sprintf("no %s event on %s (have %v)", r, name, seen)
			}
		}
		return ""
	})
}
