package agentconfig

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vsplane/vsplane/internal/configfile"
)

// overrides is appended to the help of every flag the file can also set.
const overrides = " (overrides --config)"

// Bind registers on fs one flag per setting the file can hold, each bound
// to its field of c, with c's current values as defaults: bound to
// Defaults(), these are vsplane-agent's flags with their historical names
// and defaults.
func Bind(fs *flag.FlagSet, c *VsplaneAgentConfiguration) {
	dur := func(d *time.Duration, name, usage string) { fs.DurationVar(d, name, *d, usage+overrides) }
	str := func(s *string, name, usage string) { fs.StringVar(s, name, *s, usage+overrides) }
	fs.Var((*configfile.ListValue)(&c.ControlPlane), "controlplane", "control-plane replicas' gRPC addresses (host:port, comma-separated); every reconnect tries another one"+overrides)
	str(&c.TLS.CAFile, "tls-ca-file", "CA bundle (PEM) that signed the control plane's certificate; reloaded when it changes")
	str(&c.TLS.ServerName, "tls-server-name", "name to verify in the control plane's certificate, whatever address is dialled")
	str(&c.TokenFile, "token-file", "projected ServiceAccount token (audience \"vsplane\"), re-read at every reconnect")
	dur(&c.FirstDeltaTimeout.Duration, "first-delta-timeout", "try another control-plane replica when one sends no first Delta within this time (it is still computing its first full state)")
	fs.Float64Var(&c.MaxRemovalShare, "max-removal-share", c.MaxRemovalShare, "hold a first Delta after (re)connect that would remove more than this share of the node's Services until the control plane confirms it (1 disables)"+overrides)
	dur(&c.RemovalConfirmation.Duration, "removal-confirmation", "how long such a Delta is held before the agent asks the control plane again and applies it if it still says the same")
	dur(&c.ReconcilePeriod.Duration, "reconcile-period", "period of the full reconcile against the kernel")
	dur(&c.DriftProbeInterval.Duration, "drift-probe-interval", "how often, between full reconciles, a few small kernel reads look for common drift (ipvsadm -C, a destroyed or flushed set) and reconcile at once when they find it; 0 disables")
	str((*string)(&c.IPv6), "ipv6", "manage IPv6 too (ip6tables, KUBE-6- sets): auto (when the node has a global IPv6 address, like kube-proxy's dual-stack detection), true or false")
	str(&c.MetricsAddress, "metrics-address", "address for /metrics and /healthz; empty disables")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "serve /debug/pprof/ on --metrics-address"+overrides)
	str(&c.HealthzAddress, "healthz-address", "address for /healthz and /livez only, probed by load balancers (kube-proxy's --healthz-bind-address); empty disables")
	dur(&c.ReconnectBackoffMax.Duration, "reconnect-backoff-max", "upper bound of the reconnect delay")
	str(&c.StateDir, "state-dir", "where the agent keeps its applied state across restarts (use a tmpfs); empty disables")
	fs.BoolVar(&c.Debug, "debug", c.Debug, "debug logging"+overrides)
	dur(&c.DrainCheckInterval.Duration, "drain-check-interval", "how often draining (weight-0) TCP real servers are checked for connections")
	str(&c.InspectAddress, "inspect-address", "read-only inspection gRPC endpoint (grpcurl): host:port (keep it on loopback) or unix:///run/vsplane/inspect.sock; empty disables")
	dur(&c.MaxDrain.Duration, "max-drain", "a draining real server still holding connections this long is deleted anyway")
	fs.BoolVar(&c.HealthCheckNodePorts, "health-check-node-ports", c.HealthCheckNodePorts, "serve the healthCheckNodePort of externalTrafficPolicy: Local Services (kube-proxy's service health server)"+overrides)
}

// Overlay sets on dst the settings whose flags were given explicitly on
// set (flag.Visit: only flags set on the command line), so a flag
// overrides the file. Flags of set that Bind does not know are ignored.
func Overlay(dst *VsplaneAgentConfiguration, set *flag.FlagSet) error {
	return configfile.Overlay(set, func(fs *flag.FlagSet) { Bind(fs, dst) })
}

// Explicit returns the names of the flags of set that Bind knows and the
// command line set, for the log.
func Explicit(set *flag.FlagSet) []string {
	return configfile.Explicit(set, func(fs *flag.FlagSet) {
		c := Defaults()
		Bind(fs, &c)
	})
}

// Load returns the configuration that the file at path ("": no file, the
// defaults) and the flags given on set (nil: none; see Overlay) make,
// validated. The file is read once: the agent does not reload it.
func Load(path string, set *flag.FlagSet) (*VsplaneAgentConfiguration, error) {
	c := Defaults()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		fc, err := Decode(data)
		if err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
		c = *fc
	}
	if set != nil {
		if err := Overlay(&c, set); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	if err := c.Validate(); err != nil {
		where := "flags"
		if path != "" {
			where = path + " (with flags)"
		}
		return nil, fmt.Errorf("config %s: invalid: %s", where, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return &c, nil
}

// CommandLine is vsplane-agent's parsed command line.
type CommandLine struct {
	// Config is the defaults, the file over them and the flags given over
	// the file; valid.
	Config VsplaneAgentConfiguration
	// ConfigFile is --config ("": none).
	ConfigFile string
	// NodeName is --node-name (default $NODE_NAME); not empty.
	NodeName string
	// InsecurePlaintext is --insecure-plaintext.
	InsecurePlaintext bool
	// Overridden names the flags given that the file can also set (they
	// won over it), for the log.
	Overridden []string
}

// ParseCommandLine registers vsplane-agent's flags on fs, parses args
// (without the program name), reads --config and validates: what
// vsplane-agent's main does before it starts anything. getenv supplies
// $NODE_NAME, the default of --node-name. With a flag.ExitOnError fs (the
// binary's flag.CommandLine) a bad flag or -h exits as the flag package
// does; every other problem is an error.
func ParseCommandLine(fs *flag.FlagSet, args []string, getenv func(string) string) (*CommandLine, error) {
	flags := Defaults()
	Bind(fs, &flags)
	var cl CommandLine
	fs.StringVar(&cl.ConfigFile, "config", "", "configuration file: a "+Kind+" ("+APIVersion+"), YAML or JSON, read once at start "+
		"(no reload: fleet settings come from the control plane). Precedence: a flag given on the command line > the file > the defaults")
	// The node name differs per node (the downward API gives $NODE_NAME),
	// so it is no setting of a file shared by the fleet.
	fs.StringVar(&cl.NodeName, "node-name", getenv("NODE_NAME"), "this node's Kubernetes Node name (default $NODE_NAME)")
	// --insecure-plaintext stays a flag, never a file setting: it turns off
	// TLS and the token, which is for local development only (the agent
	// refuses non-loopback control-plane addresses with it). A file is
	// typically one ConfigMap shared by every node, where one edit could
	// switch a fleet to plaintext without any change to the DaemonSet; as a
	// flag it must be written into each command line, where it is seen.
	fs.BoolVar(&cl.InsecurePlaintext, "insecure-plaintext", false, "local development only: no TLS and no token; every --controlplane address must be on loopback")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q (flags only)", fs.Args())
	}
	if cl.NodeName == "" {
		return nil, errors.New("--node-name is required (or $NODE_NAME, e.g. from the downward API's spec.nodeName)")
	}
	c, err := Load(cl.ConfigFile, fs)
	if err != nil {
		return nil, err
	}
	cl.Config, cl.Overridden = *c, Explicit(fs)
	return &cl, nil
}
