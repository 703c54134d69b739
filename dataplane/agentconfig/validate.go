package agentconfig

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vsplane/vsplane/internal/configfile"
)

// Validate checks c (the file with the flags applied) and returns every
// problem found, each naming the field path and its value:
// `maxRemovalShare 1.5: must be in (0, 1] (1 disables the hold)`.
func (c *VsplaneAgentConfiguration) Validate() error {
	var errs configfile.Problems
	bad := errs.Add

	if len(c.ControlPlane) == 0 {
		bad("controlPlane", c.ControlPlane, "at least one control-plane address (host:port) is required (the file's controlPlane or --controlplane)")
	}
	for i, a := range c.ControlPlane {
		if err := hostPort(a, false); err != nil {
			bad(fmt.Sprintf("controlPlane[%d]", i), a, "want host:port (%v)", err)
		}
	}
	if c.TLS.CAFile == "" {
		bad("tls.caFile", c.TLS.CAFile, "must not be empty")
	}
	if c.TLS.ServerName == "" {
		bad("tls.serverName", c.TLS.ServerName, "must not be empty")
	}
	if c.TokenFile == "" {
		bad("tokenFile", c.TokenFile, "must not be empty (the control plane authenticates agents by this token)")
	}
	positive := func(path string, d configfile.Duration) {
		if d.Duration <= 0 {
			bad(path, d.Duration, "must be > 0")
		}
	}
	positive("firstDeltaTimeout", c.FirstDeltaTimeout)
	if s := c.MaxRemovalShare; !(s > 0 && s <= 1) {
		bad("maxRemovalShare", s, "must be in (0, 1] (1 disables the hold)")
	}
	positive("removalConfirmation", c.RemovalConfirmation)
	positive("reconcilePeriod", c.ReconcilePeriod)
	if d := c.DriftProbeInterval.Duration; d < 0 {
		bad("driftProbeInterval", d, "must be >= 0 (0 disables the probe)")
	}
	switch c.IPv6 {
	case IPv6Auto, IPv6True, IPv6False:
	default:
		bad("ipv6", string(c.IPv6), "want auto, true or false")
	}
	listener := func(path, addr string) {
		if addr == "" {
			return
		}
		if err := hostPort(addr, true); err != nil {
			bad(path, addr, "want host:port, or empty to disable (%v)", err)
		}
	}
	listener("metricsAddress", c.MetricsAddress)
	if c.EnableProfiling && c.MetricsAddress == "" {
		bad("enableProfiling", true, "needs metricsAddress (profiles are served there)")
	}
	listener("healthzAddress", c.HealthzAddress)
	if d := c.ReconnectBackoffMax.Duration; d < MinReconnectBackoffMax {
		bad("reconnectBackoffMax", d, "must be >= %v (the first reconnect delay)", MinReconnectBackoffMax)
	}
	positive("drainCheckInterval", c.DrainCheckInterval)
	positive("maxDrain", c.MaxDrain)
	if a := c.InspectAddress; a != "" {
		if path, ok := strings.CutPrefix(a, "unix://"); ok {
			if !filepath.IsAbs(path) {
				bad("inspectAddress", a, "the socket path must be absolute (unix:///path)")
			}
		} else if err := hostPort(a, true); err != nil {
			bad("inspectAddress", a, "want a loopback host:port, unix:///path, or empty to disable (%v)", err)
		} else if host, _, _ := net.SplitHostPort(a); !loopback(host) {
			bad("inspectAddress", a, "must be a loopback address or unix:///path (the endpoint has no authentication)")
		}
	}
	return errs.Err()
}

// hostPort checks "host:port" with a numeric port; a listener's host may
// be empty (every address) and its port 0 (any).
func hostPort(addr string, listen bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" && !listen {
		return fmt.Errorf("no host")
	}
	n, err := strconv.ParseUint(port, 10, 16)
	switch {
	case err != nil:
		return fmt.Errorf("port %q is not a number up to 65535", port)
	case n == 0 && !listen:
		return fmt.Errorf("port 0")
	}
	return nil
}

func loopback(host string) bool {
	ip, err := netip.ParseAddr(host)
	return host == "localhost" || (err == nil && ip.IsLoopback())
}
