package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/translate"
)

func TestReloaderCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vsplane.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n"+body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ipvs: {scheduler: rr}\n")
	src := config.Source{Path: path}
	initial, err := src.Load()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	r := config.NewReloader(src, initial, 0, zap.New(core))
	reg := prometheus.NewRegistry()
	for _, c := range r.Collectors() {
		reg.MustRegister(c)
	}
	var applied []translate.Config
	apply := func(c translate.Config) { applied = append(applied, c) }
	metric := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}

	if got := r.Check(apply); got != "" || len(applied) != 0 {
		t.Fatalf("unchanged file: %q, applied %v", got, applied)
	}
	// A valid change of a fleet setting is applied.
	write("ipvs: {scheduler: wlc}\n")
	if got := r.Check(apply); got != "applied" || len(applied) != 1 || applied[0].DefaultScheduler != "wlc" {
		t.Fatalf("valid change: %q, applied %v", got, applied)
	}
	// An invalid one is not; the error names the field; the metrics say so.
	write("ipvs: {scheduler: foo}\n")
	if got := r.Check(apply); got != "invalid" || len(applied) != 1 {
		t.Fatalf("invalid change: %q, applied %v", got, applied)
	}
	if n := logs.FilterMessageSnippet("NOT applied").FilterFieldKey("error").Len(); n != 1 {
		t.Errorf("invalid file logged %d times, want 1", n)
	}
	if got := reloads(t, reg, "invalid"); got != 1 {
		t.Errorf("invalid reloads = %v", got)
	}
	if metric("vsplane_controlplane_config_last_reload_successful") != 0 {
		t.Errorf("last reload not marked failed")
	}
	// Checked again unchanged: not logged again.
	if got := r.Check(apply); got != "" {
		t.Errorf("unchanged invalid file: %q", got)
	}
	// Fixed, with a process setting changed: fleet applied, restart reported.
	write("ipvs: {scheduler: lc}\ncontrolPlane: {listenAddress: \"127.0.0.1:19999\"}\n")
	if got := r.Check(apply); got != "applied" || len(applied) != 2 || applied[1].DefaultScheduler != "lc" {
		t.Fatalf("fixed: %q, applied %v", got, applied)
	}
	if metric("vsplane_controlplane_config_restart_required") != 1 || metric("vsplane_controlplane_config_last_reload_successful") != 1 {
		t.Errorf("metrics after a process change: restart %v success %v", metric("vsplane_controlplane_config_restart_required"), metric("vsplane_controlplane_config_last_reload_successful"))
	}
	if e := logs.FilterMessageSnippet("after a restart").All(); len(e) != 1 || e[0].ContextMap()["restartRequired"] == nil {
		t.Errorf("restart not logged: %v", e)
	}
	// A process-only change applies nothing to the fleet.
	write("ipvs: {scheduler: lc}\ncontrolPlane: {listenAddress: \"127.0.0.1:19998\"}\n")
	if got := r.Check(apply); got != "applied" || len(applied) != 2 {
		t.Errorf("process-only change: %q, applied %v", got, applied)
	}
	// A file gone (ConfigMap symlink swap) keeps everything.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got := r.Check(apply); got != "unreadable" || len(applied) != 2 {
		t.Errorf("missing file: %q, applied %v", got, applied)
	}
}

// reloads reads vsplane_controlplane_config_reloads_total{result} from reg.
func reloads(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vsplane_controlplane_config_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestProcessChanges(t *testing.T) {
	a := config.Defaults().ControlPlane
	b := a
	b.ListenAddress, b.MaxInflightDeltas = ":19000", 3
	got := config.ProcessChanges(a, b)
	want := []string{`controlPlane.listenAddress ":18000" -> ":19000"`, `controlPlane.maxInflightDeltas 2 -> 3`}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %q, want %q", got, want)
	}
}
