// Package agentconfig is the agent's configuration file: a versioned
// VsplaneAgentConfiguration (config.vsplane.io/v1alpha1) holding the
// settings of vsplane-agent's flags that make sense in a file, and the
// agent's command line around it (ParseCommandLine).
//
// Precedence: a flag given on the command line > the file (--config) > the
// defaults (Defaults, which are the flags' defaults: Bind registers every
// flag from them, so the two cannot drift). Decoding is strict (an
// unknown, misspelled or wrongly cased field, or a duplicate key, is an
// error naming it; internal/configfile) and Validate names every bad field
// with its value, all at once.
//
// The agent reads the file once, at start: there is no live reload. The
// settings that should change on a running fleet (the IPVS scheduler and
// timeouts, strictARP, masquerading, CIDRs, the reconcile period) are the
// control plane's fleet settings, which it pushes to every agent and
// reloads live from its own file (controlplane/config); what is here is
// the agent's process setup (where the control plane is, how to trust it,
// listeners, safety limits). A changed file takes effect when the agent
// restarts (deploy/base rolls the DaemonSet when it changes).
//
// Not in the file: the node name (--node-name, default $NODE_NAME from the
// downward API: it differs per node, while the file is one per fleet) and
// --insecure-plaintext (see ParseCommandLine).
package agentconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/vsplane/vsplane/internal/configfile"
	"time"

	"github.com/vsplane/vsplane/dataplane/client"
	"github.com/vsplane/vsplane/dataplane/inspect"
	"github.com/vsplane/vsplane/internal/wire"
)

// The file's type.
const (
	APIVersion = "config.vsplane.io/v1alpha1"
	Kind       = "VsplaneAgentConfiguration"
)

// VsplaneAgentConfiguration configures an agent. Fields left out of a file
// keep their defaults (Defaults); durations are Go durations ("30s"). Each
// field's comment names the flag that overrides it.
type VsplaneAgentConfiguration struct {
	configfile.TypeMeta `json:",inline"`

	// ControlPlane lists the control-plane replicas' gRPC addresses
	// (host:port); every reconnect tries another one (--controlplane,
	// comma-separated). Required (here or by the flag); default none.
	ControlPlane []string `json:"controlPlane"`
	// TLS verifies the control plane's certificate.
	TLS TLSConfiguration `json:"tls"`
	// TokenFile is the projected ServiceAccount token (audience "vsplane"),
	// re-read at every reconnect (--token-file). Default
	// "/var/run/secrets/vsplane/token".
	TokenFile string `json:"tokenFile"`
	// FirstDeltaTimeout: try another replica when one sends no first Delta
	// within this time (--first-delta-timeout). Default 30s; > 0.
	FirstDeltaTimeout configfile.Duration `json:"firstDeltaTimeout"`
	// MaxRemovalShare: a first Delta after (re)connect that would remove
	// more than this share of the node's Services is held until the
	// control plane confirms it (--max-removal-share). Default 0.5; in
	// (0, 1], 1 disables.
	MaxRemovalShare float64 `json:"maxRemovalShare"`
	// RemovalConfirmation is how long such a Delta is held before the
	// agent asks again (--removal-confirmation). Default 30s; > 0.
	RemovalConfirmation configfile.Duration `json:"removalConfirmation"`
	// ReconcilePeriod is the period of the full reconcile against the
	// kernel (--reconcile-period); the control plane's
	// agentReconcilePeriod, when set, overrides it. Default 30s; > 0.
	ReconcilePeriod configfile.Duration `json:"reconcilePeriod"`
	// DriftProbeInterval: how often, between full reconciles, the agent
	// makes a few small kernel reads that find the common drift (an
	// ipvsadm -C, a destroyed or flushed set) and then reconciles at once
	// (--drift-probe-interval). Default 5s; 0 disables; >= 0.
	DriftProbeInterval configfile.Duration `json:"driftProbeInterval"`
	// IPv6: manage IPv6 too: "auto" (when the node has a global IPv6
	// address), "true" or "false" (--ipv6; the booleans may be written
	// bare). Default "auto".
	IPv6 IPv6Mode `json:"ipv6"`
	// MetricsAddress serves /metrics, /healthz and /livez; "" disables
	// (--metrics-address). Default "127.0.0.1:10249".
	MetricsAddress string `json:"metricsAddress"`
	// EnableProfiling serves Go's /debug/pprof/ handlers on MetricsAddress
	// (--profiling; kube-proxy's enableProfiling). Default false: a
	// profile shows the agent's memory and costs CPU while taken.
	EnableProfiling bool `json:"enableProfiling"`
	// HealthzAddress serves /healthz and /livez only, for load balancers;
	// "" disables (--healthz-address). Default "0.0.0.0:10256".
	HealthzAddress string `json:"healthzAddress"`
	// ReconnectBackoffMax bounds the reconnect delay
	// (--reconnect-backoff-max). Default 30s; >= 500ms (the first delay).
	ReconnectBackoffMax configfile.Duration `json:"reconnectBackoffMax"`
	// StateDir keeps the applied state across restarts (a tmpfs); ""
	// disables (--state-dir). Default "/run/vsplane".
	StateDir string `json:"stateDir"`
	// DrainCheckInterval: how often draining TCP real servers are checked
	// for connections (--drain-check-interval). Default 5s; > 0.
	DrainCheckInterval configfile.Duration `json:"drainCheckInterval"`
	// MaxDrain: a draining real server still holding connections this long
	// is deleted anyway (--max-drain). Default 10m; > 0.
	MaxDrain configfile.Duration `json:"maxDrain"`
	// InspectAddress is the read-only inspection endpoint: a loopback
	// host:port or unix:///absolute/path; "" disables
	// (--inspect-address). Default "127.0.0.1:10263".
	InspectAddress string `json:"inspectAddress"`
	// HealthCheckNodePorts serves the healthCheckNodePort of
	// externalTrafficPolicy: Local Services (--health-check-node-ports).
	// Default true.
	HealthCheckNodePorts bool `json:"healthCheckNodePorts"`
	// Debug turns on debug logging (--debug). Default false.
	Debug bool `json:"debug"`
}

// TLSConfiguration is how the agent verifies the control plane.
type TLSConfiguration struct {
	// CAFile is the CA bundle (PEM) that signed the control plane's
	// certificate, reloaded when it changes (--tls-ca-file). Default
	// "/etc/vsplane/tls/ca.crt".
	CAFile string `json:"caFile"`
	// ServerName is the name verified in the control plane's certificate,
	// whatever address is dialled (--tls-server-name). Default
	// "vsplane-controlplane.vsplane-system.svc".
	ServerName string `json:"serverName"`
}

// IPv6Mode is "auto", "true" or "false". In a file it may be a string or a
// bare boolean (YAML's ipv6: true).
type IPv6Mode string

// The IPv6 modes.
const (
	IPv6Auto  IPv6Mode = "auto"
	IPv6True  IPv6Mode = "true"
	IPv6False IPv6Mode = "false"
)

// UnmarshalJSON accepts a string (checked by Validate) or a boolean.
func (m *IPv6Mode) UnmarshalJSON(b []byte) error {
	switch string(bytes.TrimSpace(b)) {
	case "true":
		*m = IPv6True
		return nil
	case "false":
		*m = IPv6False
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("ipv6: want auto, true or false, got %s", b)
	}
	*m = IPv6Mode(s)
	return nil
}

// MinReconnectBackoffMax is the smallest ReconnectBackoffMax: the first
// reconnect delay (the client's BackoffBase).
const MinReconnectBackoffMax = 500 * time.Millisecond

// Defaults returns the configuration of an empty file (and of no file):
// the agent's flag defaults.
func Defaults() VsplaneAgentConfiguration {
	d := func(v time.Duration) configfile.Duration { return configfile.Duration{Duration: v} }
	return VsplaneAgentConfiguration{
		TypeMeta:             configfile.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		TLS:                  TLSConfiguration{CAFile: "/etc/vsplane/tls/ca.crt", ServerName: wire.DefaultServerName},
		TokenFile:            "/var/run/secrets/vsplane/token",
		FirstDeltaTimeout:    d(30 * time.Second),
		MaxRemovalShare:      client.DefaultMaxRemovalShare,
		RemovalConfirmation:  d(client.DefaultRemovalConfirmation),
		ReconcilePeriod:      d(wire.DefaultReconcilePeriod),
		DriftProbeInterval:   d(wire.DefaultDriftProbeInterval),
		IPv6:                 IPv6Auto,
		MetricsAddress:       "127.0.0.1:10249",
		HealthzAddress:       "0.0.0.0:10256",
		ReconnectBackoffMax:  d(30 * time.Second),
		StateDir:             "/run/vsplane",
		DrainCheckInterval:   d(5 * time.Second),
		MaxDrain:             d(10 * time.Minute),
		InspectAddress:       inspect.DefaultAddress,
		HealthCheckNodePorts: true,
	}
}
