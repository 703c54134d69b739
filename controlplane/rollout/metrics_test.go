package rollout

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vsplane/vsplane/controlplane/apis/v1alpha1"
)

// gather returns every sample c exports as "name{label=value,...}" → value;
// the pedantic registry fails when a sample does not match what Describe
// announced.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

func TestCollectorExportsEachRolloutsStatus(t *testing.T) {
	moving := newRollout(intstr.FromInt32(1), intstr.FromString("50%"))
	moving.Status = v1alpha1.SchedulerRolloutStatus{
		Phase: v1alpha1.PhaseProgressing, Steps: make([]v1alpha1.StepStatus, 2),
		NodesTotal: 10, NodesUpdated: 4, NodesPending: 1, NodesFailed: 0,
	}
	fresh := newRollout() // no status written yet, default steps
	fresh.Name, fresh.Spec.Scheduler = "fresh", "wlc"
	got := gather(t, NewCollector(func() []*v1alpha1.SchedulerRollout { return []*v1alpha1.SchedulerRollout{moving, fresh} },
		func() bool { return true }))
	want := map[string]float64{
		"vsplane_controlplane_rollout_leader{}":                                            1,
		"vsplane_controlplane_rollout_phase{phase=Progressing,rollout=to-mh,scheduler=mh}": 1,
		"vsplane_controlplane_rollout_phase{phase=Pending,rollout=fresh,scheduler=wlc}":    1,
		"vsplane_controlplane_rollout_step{rollout=to-mh}":                                 2,
		"vsplane_controlplane_rollout_step{rollout=fresh}":                                 0,
		// 1, 50% and the 100% step added after a last step below 100%.
		"vsplane_controlplane_rollout_steps{rollout=to-mh}":                3,
		"vsplane_controlplane_rollout_steps{rollout=fresh}":                float64(len(DefaultSteps)),
		"vsplane_controlplane_rollout_nodes{rollout=to-mh,state=selected}": 10,
		"vsplane_controlplane_rollout_nodes{rollout=to-mh,state=updated}":  4,
		"vsplane_controlplane_rollout_nodes{rollout=to-mh,state=pending}":  1,
		"vsplane_controlplane_rollout_nodes{rollout=to-mh,state=failed}":   0,
		"vsplane_controlplane_rollout_nodes{rollout=fresh,state=selected}": 0,
		"vsplane_controlplane_rollout_nodes{rollout=fresh,state=updated}":  0,
		"vsplane_controlplane_rollout_nodes{rollout=fresh,state=pending}":  0,
		"vsplane_controlplane_rollout_nodes{rollout=fresh,state=failed}":   0,
	}
	if !maps.Equal(got, want) {
		t.Errorf("samples:\n%s\nwant:\n%s", dump(got), dump(want))
	}
}

func TestCollectorWithoutRollouts(t *testing.T) {
	got := gather(t, NewCollector(nil, func() bool { return false }))
	if want := map[string]float64{"vsplane_controlplane_rollout_leader{}": 0}; !maps.Equal(got, want) {
		t.Errorf("samples %v, want %v", got, want)
	}
}

func dump(m map[string]float64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "  %s %g\n", k, m[k])
	}
	return b.String()
}
