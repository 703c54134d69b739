package agent

import (
	"flag"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/agentconfig"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/testpki"
)

func agentCommandLine(t *testing.T, args ...string) *agentconfig.CommandLine {
	t.Helper()
	cl, err := agentconfig.ParseCommandLine(flag.NewFlagSet("vsplane-agent", flag.ContinueOnError), args,
		func(string) string { return "node-a" })
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func closeAgentListeners(cfg Config) {
	for _, ln := range []net.Listener{cfg.MetricsListener, cfg.HealthzListener, cfg.InspectListener} {
		if ln != nil {
			ln.Close()
		}
	}
}

// TestFromCommandLine: the command line's settings land in the agent's
// Config, the control-plane addresses as the list they are.
func TestFromCommandLine(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	cl := agentCommandLine(t, "--controlplane=198.18.1.11:18000, 198.18.1.12:18000", "--tls-ca-file="+files.CA,
		"--token-file=/t", "--reconcile-period=1m", "--drift-probe-interval=7s", "--drain-check-interval=2s", "--max-drain=3m", "--reconnect-backoff-max=4s",
		"--first-delta-timeout=5s", "--max-removal-share=0.25", "--removal-confirmation=6s", "--state-dir=/s",
		"--health-check-node-ports=false", "--ipv6=true", "--metrics-address=127.0.0.1:0", "--healthz-address=127.0.0.1:0",
		"--inspect-address=127.0.0.1:0")
	cfg, err := FromCommandLine(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAgentListeners(cfg)
	if diff := cmp.Diff([]string{"198.18.1.11:18000", "198.18.1.12:18000"}, cfg.ControlPlane); diff != "" {
		t.Errorf("control plane (-want +got):\n%s", diff)
	}
	if cfg.NodeName != "node-a" || cfg.TLS == nil || cfg.TLS.ServerName != testpki.ServerName || cfg.TokenFile != "/t" {
		t.Errorf("node %q, TLS %v, token %q", cfg.NodeName, cfg.TLS, cfg.TokenFile)
	}
	r := cfg.Reconcile
	if r.Period != time.Minute || r.ProbeInterval != 7*time.Second || r.DrainCheckInterval != 2*time.Second || r.MaxDrain != 3*time.Minute ||
		!cmp.Equal(r.Families, []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6}) || cfg.DetectIPv6 {
		t.Errorf("reconcile %+v, detect IPv6 %v", r, cfg.DetectIPv6)
	}
	if cfg.BackoffMax != 4*time.Second || cfg.FirstDeltaTimeout != 5*time.Second || cfg.MaxRemovalShare != 0.25 ||
		cfg.RemovalConfirmation != 6*time.Second || cfg.StateDir != "/s" || cfg.HealthCheckNodePorts {
		t.Errorf("config %+v", cfg)
	}
	if cfg.MetricsListener == nil || cfg.HealthzListener == nil || cfg.InspectListener == nil || cfg.Kernel != nil {
		t.Errorf("listeners %v %v %v, kernel %v", cfg.MetricsListener, cfg.HealthzListener, cfg.InspectListener, cfg.Kernel)
	}

	for ipv6, want := range map[string]struct {
		detect   bool
		families []kernel.Family
	}{"auto": {true, []kernel.Family{kernel.FamilyIPv4}}, "false": {false, []kernel.Family{kernel.FamilyIPv4}}} {
		cl := agentCommandLine(t, "--controlplane=127.0.0.1:1", "--insecure-plaintext", "--ipv6="+ipv6,
			"--metrics-address=", "--healthz-address=", "--inspect-address=", "--drift-probe-interval=0")
		cfg, err := FromCommandLine(cl, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Reconcile.ProbeInterval >= 0 {
			t.Errorf("--drift-probe-interval=0: reconcile.Config.ProbeInterval %v, want negative (disabled)", cfg.Reconcile.ProbeInterval)
		}
		if cfg.DetectIPv6 != want.detect || !cmp.Equal(cfg.Reconcile.Families, want.families) || cfg.TLS != nil || cfg.TokenFile != "" ||
			cfg.MetricsListener != nil || cfg.HealthzListener != nil || cfg.InspectListener != nil {
			t.Errorf("--ipv6=%s --insecure-plaintext: %+v", ipv6, cfg)
		}
	}

	// Errors name what failed; listeners opened before are closed.
	cl = agentCommandLine(t, "--controlplane=198.18.1.11:18000", "--tls-ca-file="+filepath.Join(dir, "none.crt"))
	if _, err := FromCommandLine(cl, nil); err == nil || !strings.Contains(err.Error(), "(or --insecure-plaintext for local development)") {
		t.Errorf("missing CA: %v", err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cl = agentCommandLine(t, "--controlplane=127.0.0.1:1", "--insecure-plaintext", "--metrics-address=127.0.0.1:0",
		"--healthz-address="+busy.Addr().String(), "--inspect-address=")
	if _, err := FromCommandLine(cl, nil); err == nil || !strings.Contains(err.Error(), "healthz listener") {
		t.Errorf("busy healthz address: %v", err)
	}
}
