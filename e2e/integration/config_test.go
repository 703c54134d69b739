package integration_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

// TestConfigFileReload starts the control plane from a configuration file,
// rewrites the file with a new default scheduler and sees an agent's
// virtual servers move to it without a restart; then a broken file, which
// changes nothing anywhere.
func TestConfigFileReload(t *testing.T) {
	kube, ctx := startKube(t, "node-a")
	path := filepath.Join(t.TempDir(), "vsplane.yaml")
	write := func(body string) {
		t.Helper()
		// Write and rename, as a ConfigMap update does: the reloader never
		// reads half a file.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	const head = "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n"
	write(head + "ipvs:\n  scheduler: rr\n  tcpTimeout: 15m\n")

	src := config.Source{Path: path}
	loaded, err := src.Load()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, _ := runReplica(t, ctx, app.Config{Kube: kube, GRPCListener: ln, Translate: loaded.Config.Translate(),
		Reload: config.NewReloader(src, loaded, 50*time.Millisecond, zaptest.NewLogger(t).Named("config"))})
	awaitReady(t, r, converge)

	mem := memory.New()
	a := startAgent(t, ctx, ln.Addr().String(), "node-a", mem, t.TempDir())
	t.Cleanup(func() { a.stop(t) })
	web := mustCreateService(t, ctx, kube, clusterIPService("default", "web", 80, 443))
	mustCreateSlice(t, ctx, kube, endpointSlice("default", "web", []int32{80, 443}, endpoint{"198.19.1.10", "node-a"}))
	k := mem.Kernel()
	webVS := []string{vsKey(web, 80), vsKey(web, 443)}
	eventually(t, converge, func() string { return schedulersOf(t, k.IPVS, webVS, "rr") })
	// The Service and its slice may arrive in two Applies: await both.
	eventually(t, converge, func() string {
		if got, want := ipvsState(t, k.IPVS)[vsKey(web, 443)], expectedDests("198.19.1.10"); strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Sprintf("web:443 real servers %v, want %v", got, want)
		}
		return ""
	})
	eventually(t, converge, func() string { return ackedExactly(r, "node-a") })

	t.Run("a new default scheduler reaches the kernel without a restart", func(t *testing.T) {
		settingsBefore := settingsVersion(t, r)
		svcBefore, _ := r.Store.Get("node-a", snapshot.ServiceName("default", "web"))
		write(head + "ipvs:\n  scheduler: wlc\n  tcpTimeout: 15m\n")
		eventually(t, converge, func() string { return schedulersOf(t, k.IPVS, webVS, "wlc") })
		eventually(t, converge, func() string { return ackedExactly(r, "node-a") })
		if settingsVersion(t, r) == settingsBefore {
			t.Error("node/settings version unchanged")
		}
		// The default scheduler is a node setting: the Service resource is
		// the same, only the agent applies it differently.
		if svcAfter, _ := r.Store.Get("node-a", snapshot.ServiceName("default", "web")); svcAfter.GetVersion() != svcBefore.GetVersion() {
			t.Errorf("Service resource changed: %s -> %s", svcBefore.GetVersion(), svcAfter.GetVersion())
		}
		if got := defaultScheduler(t, r); got != "wlc" {
			t.Errorf("node/settings default scheduler %q", got)
		}
	})

	t.Run("a broken file changes nothing", func(t *testing.T) {
		settingsBefore := settingsVersion(t, r)
		stateBefore := ipvsState(t, k.IPVS)
		for i, body := range []string{
			head + "ipvs:\n  scheduler: foo\n",  // invalid value
			head + "ipvs:\n  schedulr: sh\n",    // misspelled field
			"apiVersion: v1\nkind: ConfigMap\n", // wrong kind
		} {
			write(body)
			// Await the reloader's verdict on this version, not a time.
			want := float64(i + 1)
			eventually(t, converge, func() string {
				if got := metricValue(t, r, "vsplane_controlplane_config_reloads_total", "result", "invalid"); got != want {
					return fmt.Sprintf("invalid reloads %v, want %v", got, want)
				}
				return ""
			})
			if got := metricValue(t, r, "vsplane_controlplane_config_last_reload_successful", "", ""); got != 0 {
				t.Errorf("last_reload_successful = %v after a broken file", got)
			}
		}
		if got := settingsVersion(t, r); got != settingsBefore {
			t.Errorf("node/settings changed by a broken file: %s -> %s", settingsBefore, got)
		}
		if got := defaultScheduler(t, r); got != "wlc" {
			t.Errorf("node/settings default scheduler %q after a broken file", got)
		}
		if msg := ackedExactly(r, "node-a"); msg != "" {
			t.Error(msg)
		}
		if msg := schedulersOf(t, k.IPVS, webVS, "wlc"); msg != "" {
			t.Error(msg)
		}
		if msg := diffState(ipvsState(t, k.IPVS), stateBefore); msg != "" {
			t.Error(msg)
		}
		// Fixed again: applied, and the metric says so.
		write(head + "ipvs:\n  scheduler: sh\n  tcpTimeout: 15m\n")
		eventually(t, converge, func() string { return schedulersOf(t, k.IPVS, webVS, "sh") })
		if got := metricValue(t, r, "vsplane_controlplane_config_last_reload_successful", "", ""); got != 1 {
			t.Errorf("last_reload_successful = %v after a fixed file", got)
		}
	})
}

// schedulersOf returns "" when every virtual server in keys exists with
// scheduler want.
func schedulersOf(t *testing.T, k kernel.IPVS, keys []string, want string) string {
	t.Helper()
	vss, err := k.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, vs := range vss {
		got[vs.Key.String()] = vs.Scheduler
	}
	var bad []string
	for _, key := range keys {
		if got[key] != want {
			bad = append(bad, fmt.Sprintf("%s: scheduler %q", key, got[key]))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return "want " + want + ": " + strings.Join(bad, "; ")
	}
	return ""
}

func settingsVersion(t *testing.T, r *app.Replica) string {
	t.Helper()
	res, ok := r.Store.Get("node-a", snapshot.NodeSettingsName)
	if !ok {
		t.Fatal("node-a has no node/settings")
	}
	return res.GetVersion()
}

// defaultScheduler is the fleet default scheduler the replica publishes in
// node-a's node/settings.
func defaultScheduler(t *testing.T, r *app.Replica) string {
	t.Helper()
	res, ok := r.Store.Get("node-a", snapshot.NodeSettingsName)
	if !ok {
		t.Fatal("node-a has no node/settings")
	}
	return res.GetNodeSettings().GetDefaultScheduler()
}

// metricValue reads one sample of a counter or gauge from the replica's
// registry (label "" for none); 0 if absent.
func metricValue(t *testing.T, r *app.Replica, name, label, value string) float64 {
	t.Helper()
	mfs, err := r.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					match = true
				}
			}
			if match {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
