package agent

import (
	"fmt"
	"net"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/agentconfig"
	"github.com/vsplane/vsplane/dataplane/inspect"
	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/internal/tlsfiles"
)

// FromCommandLine returns the Config of the agent vsplane-agent runs with
// cl (agentconfig.ParseCommandLine): its settings, the TLS configuration
// that verifies the control plane (unless cl.InsecurePlaintext) and the
// listeners of its addresses (opened here). The kernel is the real one
// (Kernel nil) and the health-check node ports are served as configured.
func FromCommandLine(cl *agentconfig.CommandLine, log *zap.Logger) (cfg Config, err error) {
	c := &cl.Config
	families := []kernel.Family{kernel.FamilyIPv4}
	detect := false
	switch c.IPv6 { // validated
	case agentconfig.IPv6Auto:
		detect = true
	case agentconfig.IPv6True:
		families = append(families, kernel.FamilyIPv6)
	}
	probe := c.DriftProbeInterval.Duration
	if probe == 0 {
		probe = -1 // reconcile.Config: negative disables, 0 is the default
	}
	cfg = Config{
		ControlPlane: c.ControlPlane,
		NodeName:     cl.NodeName,
		Reconcile: reconcile.Config{Period: c.ReconcilePeriod.Duration, ProbeInterval: probe, Families: families,
			DrainCheckInterval: c.DrainCheckInterval.Duration, MaxDrain: c.MaxDrain.Duration},
		DetectIPv6:           detect,
		BackoffMax:           c.ReconnectBackoffMax.Duration,
		FirstDeltaTimeout:    c.FirstDeltaTimeout.Duration,
		MaxRemovalShare:      c.MaxRemovalShare,
		RemovalConfirmation:  c.RemovalConfirmation.Duration,
		StateDir:             c.StateDir,
		Logger:               log,
		HealthCheckNodePorts: c.HealthCheckNodePorts,
	}
	if !cl.InsecurePlaintext {
		cli, err := tlsfiles.NewClient(c.TLS.CAFile, c.TLS.ServerName)
		if err != nil {
			return Config{}, fmt.Errorf("%w (or --insecure-plaintext for local development)", err)
		}
		cfg.TLS, cfg.TokenFile = cli.Config(), c.TokenFile
	}
	// On an error, the listeners opened so far are closed.
	defer func() {
		if err != nil {
			for _, ln := range []net.Listener{cfg.MetricsListener, cfg.HealthzListener, cfg.InspectListener} {
				if ln != nil {
					ln.Close()
				}
			}
			cfg = Config{}
		}
	}()
	if c.MetricsAddress != "" {
		if cfg.MetricsListener, err = net.Listen("tcp", c.MetricsAddress); err != nil {
			return cfg, fmt.Errorf("metrics listener: %w", err)
		}
		cfg.Profiling = c.EnableProfiling
	}
	if c.HealthzAddress != "" {
		if cfg.HealthzListener, err = net.Listen("tcp", c.HealthzAddress); err != nil {
			return cfg, fmt.Errorf("healthz listener: %w", err)
		}
	}
	if c.InspectAddress != "" {
		if cfg.InspectListener, err = inspect.Listen(c.InspectAddress); err != nil {
			return cfg, fmt.Errorf("inspect listener: %w", err)
		}
	}
	return cfg, nil
}
