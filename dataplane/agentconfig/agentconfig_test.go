package agentconfig_test

import (
	"errors"
	"flag"
	"github.com/vsplane/vsplane/internal/configfile"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/dataplane/agentconfig"
)

func dur(d time.Duration) configfile.Duration { return configfile.Duration{Duration: d} }

const head = "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneAgentConfiguration\n"

// historicFlags are vsplane-agent's flags and defaults from before the
// file existed (flag name -> flag.Flag.DefValue). Bind must keep them.
var historicFlags = map[string]string{
	"controlplane":            "",
	"tls-ca-file":             "/etc/vsplane/tls/ca.crt",
	"tls-server-name":         "vsplane-controlplane.vsplane-system.svc",
	"token-file":              "/var/run/secrets/vsplane/token",
	"first-delta-timeout":     "30s",
	"max-removal-share":       "0.5",
	"removal-confirmation":    "30s",
	"reconcile-period":        "30s",
	"ipv6":                    "auto",
	"metrics-address":         "127.0.0.1:10249",
	"profiling":               "false",
	"healthz-address":         "0.0.0.0:10256",
	"reconnect-backoff-max":   "30s",
	"state-dir":               "/run/vsplane",
	"debug":                   "false",
	"drain-check-interval":    "5s",
	"drift-probe-interval":    "5s",
	"inspect-address":         "127.0.0.1:10263",
	"max-drain":               "10m0s",
	"health-check-node-ports": "true",
}

// TestFlagDefaultsAreDefaults: the flags Bind registers are the agent's
// historical ones with their defaults, and Defaults() is what those
// defaults give: a flag given at its default value changes nothing.
func TestFlagDefaultsAreDefaults(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c := agentconfig.Defaults()
	agentconfig.Bind(fs, &c)
	got := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { got[f.Name] = f.DefValue })
	if diff := cmp.Diff(historicFlags, got); diff != "" {
		t.Errorf("flags and defaults changed (-historic +now):\n%s", diff)
	}
	var args []string
	fs.VisitAll(func(f *flag.Flag) { args = append(args, "--"+f.Name+"="+f.DefValue) })
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	o := agentconfig.Defaults()
	if err := agentconfig.Overlay(&o, fs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(agentconfig.Defaults(), o); diff != "" {
		t.Errorf("every flag at its default (-Defaults +got):\n%s", diff)
	}
	if diff := cmp.Diff(agentconfig.Defaults(), c); diff != "" {
		t.Errorf("flags bound to Defaults (-Defaults +got):\n%s", diff)
	}

	// The whole command line: those, and the three that are no file setting.
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	if _, err := agentconfig.ParseCommandLine(fs, []string{"--controlplane=127.0.0.1:1", "--node-name=n"}, noEnv); err != nil {
		t.Fatal(err)
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := historicFlags[f.Name]; !ok {
			names = append(names, f.Name+"="+f.DefValue)
		}
	})
	if strings.Join(names, " ") != "config= insecure-plaintext=false node-name=" {
		t.Errorf("other flags: %v", names)
	}
}

// TestEveryFieldHasAFlag: setting every flag to a non-default value
// changes every field of the file (and no flag is bound to nothing).
func TestEveryFieldHasAFlag(t *testing.T) {
	values := map[string]string{
		"controlplane": "a:1,b:2", "tls-ca-file": "/ca", "tls-server-name": "cp.example", "token-file": "/tok",
		"first-delta-timeout": "1s", "max-removal-share": "0.25", "removal-confirmation": "2s", "reconcile-period": "3s",
		"ipv6": "false", "metrics-address": "127.0.0.1:1", "healthz-address": "", "reconnect-backoff-max": "4s",
		"state-dir": "", "debug": "true", "drain-check-interval": "6s", "inspect-address": "unix:///run/i.sock",
		"max-drain": "7s", "health-check-node-ports": "false", "profiling": "true", "drift-probe-interval": "0s",
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c := agentconfig.Defaults()
	agentconfig.Bind(fs, &c)
	var args []string
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := values[f.Name]
		if !ok {
			t.Errorf("no test value for --%s", f.Name)
		}
		args = append(args, "--"+f.Name+"="+v)
	})
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	got := agentconfig.Defaults()
	if err := agentconfig.Overlay(&got, fs); err != nil {
		t.Fatal(err)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("test values invalid: %v", err)
	}
	var unchanged []string
	var walk func(path string, a, b reflect.Value)
	walk = func(path string, a, b reflect.Value) {
		if a.Kind() == reflect.Struct && a.Type() != reflect.TypeFor[configfile.Duration]() {
			for i := range a.NumField() {
				f := a.Type().Field(i)
				if f.Anonymous { // TypeMeta
					continue
				}
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				walk(path+"."+name, a.Field(i), b.Field(i))
			}
			return
		}
		if reflect.DeepEqual(a.Interface(), b.Interface()) {
			unchanged = append(unchanged, path)
		}
	}
	walk("", reflect.ValueOf(agentconfig.Defaults()), reflect.ValueOf(got))
	if len(unchanged) > 0 {
		t.Errorf("fields no flag sets: %v", unchanged)
	}
}

func TestDecode(t *testing.T) {
	c, err := agentconfig.Decode([]byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(agentconfig.Defaults(), *c); diff != "" {
		t.Errorf("empty file (-defaults +got):\n%s", diff)
	}
	yamlDoc := head + `
controlPlane: [198.18.1.11:18000, "[fd00::1]:18000"]
tls: {caFile: /etc/ca.pem}
firstDeltaTimeout: 10s
maxRemovalShare: 1
reconcilePeriod: 1m
driftProbeInterval: 0s
ipv6: true
metricsAddress: ""
maxDrain: 1h
healthCheckNodePorts: false
debug: true
`
	jsonDoc := `{"apiVersion":"config.vsplane.io/v1alpha1","kind":"VsplaneAgentConfiguration",
	 "controlPlane":["198.18.1.11:18000","[fd00::1]:18000"],"tls":{"caFile":"/etc/ca.pem"},"firstDeltaTimeout":"10s",
	 "maxRemovalShare":1,"reconcilePeriod":"1m","driftProbeInterval":"0s","ipv6":"true","metricsAddress":"","maxDrain":"1h",
	 "healthCheckNodePorts":false,"debug":true}`
	want := agentconfig.Defaults()
	want.ControlPlane = []string{"198.18.1.11:18000", "[fd00::1]:18000"}
	want.TLS.CAFile, want.FirstDeltaTimeout, want.MaxRemovalShare, want.ReconcilePeriod = "/etc/ca.pem", dur(10*time.Second), 1, dur(time.Minute)
	want.DriftProbeInterval = dur(0)
	want.IPv6, want.MetricsAddress, want.MaxDrain, want.HealthCheckNodePorts, want.Debug = agentconfig.IPv6True, "", dur(time.Hour), false, true
	for name, doc := range map[string]string{"yaml": yamlDoc, "json": jsonDoc} {
		c, err := agentconfig.Decode([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(want, *c); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for doc, mode := range map[string]agentconfig.IPv6Mode{"ipv6: false": "false", `ipv6: "false"`: "false", "ipv6: auto": "auto",
		"ipv6: maybe": "maybe" /* Validate rejects it */, "ipv6: yes": "true" /* YAML 1.1 */} {
		c, err := agentconfig.Decode([]byte(head + doc + "\n"))
		if err != nil || c.IPv6 != mode {
			t.Errorf("%s: got %v, %v", doc, c, err)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"misspelled field", head + "reconcilePeriode: 1m\n", `VsplaneAgentConfiguration: unknown field "reconcilePeriode"`},
		{"misspelled nested field", head + "tls:\n  caFle: /x\n", `unknown field "tls.caFle"`},
		{"wrong case", head + "TokenFile: /x\n", `unknown field "TokenFile"`},
		{"several at once", head + "zz: 1\ntls: {ca: x}\n", `unknown field "tls.ca", "zz"`},
		{"node name is no file setting", head + "nodeName: n\n", `unknown field "nodeName"`},
		{"insecure is no file setting", head + "insecurePlaintext: true\n", `unknown field "insecurePlaintext"`},
		{"duplicate key", head + "debug: true\ndebug: false\n", "already set"},
		{"the control plane's file", "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n",
			`apiVersion "config.vsplane.io/v1alpha1", kind "VsplaneConfiguration": not supported; want apiVersion config.vsplane.io/v1alpha1, kind VsplaneAgentConfiguration (that is the control plane's file (vsplane-controlplane --config))`},
		{"kube-proxy's file", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n",
			`kind "KubeProxyConfiguration": not supported; want apiVersion config.vsplane.io/v1alpha1, kind VsplaneAgentConfiguration (that is kube-proxy's file`},
		{"other kind", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n", `kind "KubeletConfiguration": not supported; want apiVersion config.vsplane.io/v1alpha1, kind VsplaneAgentConfiguration`},
		{"wrong version", "apiVersion: config.vsplane.io/v1\nkind: VsplaneAgentConfiguration\n", `apiVersion "config.vsplane.io/v1", kind "VsplaneAgentConfiguration": not supported`},
		{"no type", "debug: true\n", "apiVersion and kind missing: want apiVersion config.vsplane.io/v1alpha1, kind VsplaneAgentConfiguration"},
		{"empty", "", "empty file: want apiVersion config.vsplane.io/v1alpha1, kind VsplaneAgentConfiguration"},
		{"not yaml", "kind: [", "not a YAML or JSON document"},
		{"bad duration", head + "maxDrain: forever\n", `"forever"`},
		{"wrong type", head + "controlPlane: 198.18.1.11:18000\n", "controlPlane"},
		{"ipv6 wrong type", head + "ipv6: 6\n", "ipv6: want auto, true or false, got 6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := agentconfig.Decode([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func valid() agentconfig.VsplaneAgentConfiguration {
	c := agentconfig.Defaults()
	c.ControlPlane = []string{"198.18.1.11:18000"}
	return c
}

func TestValidateNamesFieldAndValue(t *testing.T) {
	type conf = agentconfig.VsplaneAgentConfiguration
	for _, tc := range []struct {
		name string
		mod  func(c *conf)
		want string
	}{
		{"no control plane", func(c *conf) { c.ControlPlane = nil }, `controlPlane []: at least one control-plane address (host:port) is required`},
		{"control plane without port", func(c *conf) { c.ControlPlane = []string{"a:1", "198.18.1.11"} }, `controlPlane[1] "198.18.1.11": want host:port`},
		{"control plane without host", func(c *conf) { c.ControlPlane = []string{":18000"} }, `controlPlane[0] ":18000": want host:port (no host)`},
		{"control plane bad port", func(c *conf) { c.ControlPlane = []string{"a:grpc"} }, `controlPlane[0] "a:grpc": want host:port (port "grpc" is not a number`},
		{"control plane port 0", func(c *conf) { c.ControlPlane = []string{"a:0"} }, `controlPlane[0] "a:0": want host:port (port 0)`},
		{"caFile", func(c *conf) { c.TLS.CAFile = "" }, `tls.caFile "": must not be empty`},
		{"serverName", func(c *conf) { c.TLS.ServerName = "" }, `tls.serverName "": must not be empty`},
		{"tokenFile", func(c *conf) { c.TokenFile = "" }, `tokenFile "": must not be empty`},
		{"firstDeltaTimeout", func(c *conf) { c.FirstDeltaTimeout = dur(0) }, `firstDeltaTimeout "0s": must be > 0`},
		{"maxRemovalShare 0", func(c *conf) { c.MaxRemovalShare = 0 }, `maxRemovalShare 0: must be in (0, 1]`},
		{"maxRemovalShare > 1", func(c *conf) { c.MaxRemovalShare = 1.5 }, `maxRemovalShare 1.5: must be in (0, 1]`},
		{"maxRemovalShare < 0", func(c *conf) { c.MaxRemovalShare = -0.1 }, `maxRemovalShare -0.1: must be in (0, 1]`},
		{"removalConfirmation", func(c *conf) { c.RemovalConfirmation = dur(-time.Second) }, `removalConfirmation "-1s": must be > 0`},
		{"reconcilePeriod", func(c *conf) { c.ReconcilePeriod = dur(-time.Minute) }, `reconcilePeriod "-1m0s": must be > 0`},
		{"driftProbeInterval", func(c *conf) { c.DriftProbeInterval = dur(-time.Second) }, `driftProbeInterval "-1s": must be >= 0`},
		{"ipv6", func(c *conf) { c.IPv6 = "yes" }, `ipv6 "yes": want auto, true or false`},
		{"metricsAddress", func(c *conf) { c.MetricsAddress = "10249" }, `metricsAddress "10249": want host:port, or empty to disable`},
		{"enableProfiling without metricsAddress", func(c *conf) { c.EnableProfiling, c.MetricsAddress = true, "" }, `enableProfiling true: needs metricsAddress (profiles are served there)`},
		{"healthzAddress", func(c *conf) { c.HealthzAddress = "0.0.0.0:http" }, `healthzAddress "0.0.0.0:http": want host:port, or empty to disable`},
		{"reconnectBackoffMax", func(c *conf) { c.ReconnectBackoffMax = dur(100 * time.Millisecond) }, `reconnectBackoffMax "100ms": must be >= 500ms`},
		{"drainCheckInterval", func(c *conf) { c.DrainCheckInterval = dur(0) }, `drainCheckInterval "0s": must be > 0`},
		{"maxDrain", func(c *conf) { c.MaxDrain = dur(-time.Second) }, `maxDrain "-1s": must be > 0`},
		{"inspectAddress not loopback", func(c *conf) { c.InspectAddress = "0.0.0.0:10263" }, `inspectAddress "0.0.0.0:10263": must be a loopback address or unix:///path`},
		{"inspectAddress relative socket", func(c *conf) { c.InspectAddress = "unix://run/i.sock" }, `inspectAddress "unix://run/i.sock": the socket path must be absolute`},
		{"inspectAddress no port", func(c *conf) { c.InspectAddress = "127.0.0.1" }, `inspectAddress "127.0.0.1": want a loopback host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("one bad field gave several errors: %v", err)
			}
		})
	}
	// Accepted edge values.
	c := valid()
	c.ControlPlane = []string{"cp-1.example:18000", "[fd00::1]:18000"}
	c.MaxRemovalShare, c.MetricsAddress, c.HealthzAddress, c.InspectAddress, c.StateDir = 1, ":0", "", "localhost:10263", ""
	c.ReconnectBackoffMax = dur(agentconfig.MinReconnectBackoffMax)
	if err := c.Validate(); err != nil {
		t.Errorf("edge values: %v", err)
	}
	// Every problem is reported, not just the first.
	c = valid()
	c.ControlPlane, c.MaxRemovalShare, c.IPv6, c.MaxDrain = nil, 2, "maybe", dur(0)
	err := c.Validate()
	if err == nil || strings.Count(err.Error(), "\n") != 3 {
		t.Errorf("got %v, want four problems", err)
	}
}

func noEnv(string) string { return "" }

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestParseCommandLine runs the agent's command-line path (what main
// calls): flags > file > defaults, the node name from $NODE_NAME, and the
// errors a bad file or flag gives.
func TestParseCommandLine(t *testing.T) {
	path := writeFile(t, head+`
controlPlane: [198.18.1.11:18000, 198.18.1.12:18000]
reconcilePeriod: 1m
maxRemovalShare: 0.8
ipv6: false
debug: true
maxDrain: 1h
`)
	env := func(k string) string {
		if k == "NODE_NAME" {
			return "node-env"
		}
		return ""
	}
	parse := func(getenv func(string) string, args ...string) (*agentconfig.CommandLine, error) {
		return agentconfig.ParseCommandLine(flag.NewFlagSet("vsplane-agent", flag.ContinueOnError), args, getenv)
	}

	// The file over the defaults.
	cl, err := parse(env, "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	want := agentconfig.Defaults()
	want.ControlPlane = []string{"198.18.1.11:18000", "198.18.1.12:18000"}
	want.ReconcilePeriod, want.MaxRemovalShare, want.IPv6, want.Debug, want.MaxDrain = dur(time.Minute), 0.8, "false", true, dur(time.Hour)
	if diff := cmp.Diff(want, cl.Config); diff != "" {
		t.Errorf("file (-want +got):\n%s", diff)
	}
	if cl.NodeName != "node-env" || cl.ConfigFile != path || cl.InsecurePlaintext || len(cl.Overridden) != 0 {
		t.Errorf("command line: %+v", cl)
	}

	// Flags given win over the file, even at their default value; flags
	// not given never override it.
	cl, err = parse(env, "--config="+path, "--controlplane=127.0.0.1:18000", "--reconcile-period=30s", "--debug=false",
		"--ipv6", "auto", "--node-name=node-flag", "--insecure-plaintext", "--state-dir=")
	if err != nil {
		t.Fatal(err)
	}
	want.ControlPlane, want.ReconcilePeriod, want.Debug, want.IPv6, want.StateDir = []string{"127.0.0.1:18000"}, dur(30*time.Second), false, "auto", ""
	if diff := cmp.Diff(want, cl.Config); diff != "" {
		t.Errorf("flags over file (-want +got):\n%s", diff)
	}
	sort.Strings(cl.Overridden)
	if cl.NodeName != "node-flag" || !cl.InsecurePlaintext ||
		strings.Join(cl.Overridden, ",") != "controlplane,debug,ipv6,reconcile-period,state-dir" {
		t.Errorf("command line: %+v", cl)
	}

	// No file: the defaults and flags.
	cl, err = parse(env, "--controlplane=198.18.1.11:18000,198.18.1.12:18000")
	if err != nil {
		t.Fatal(err)
	}
	want = agentconfig.Defaults()
	want.ControlPlane = []string{"198.18.1.11:18000", "198.18.1.12:18000"}
	if diff := cmp.Diff(want, cl.Config); diff != "" {
		t.Errorf("no file (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name   string
		getenv func(string) string
		args   []string
		want   string
	}{
		{"no node name", noEnv, []string{"--controlplane=a:1"}, "--node-name is required"},
		{"no control plane", env, nil, `config flags: invalid: controlPlane []: at least one control-plane address`},
		{"invalid flag value names the file's field", env, []string{"--config", path, "--max-removal-share=2"}, "config " + path + ` (with flags): invalid: maxRemovalShare 2: must be in (0, 1]`},
		{"all problems on one line", env, []string{"--controlplane=a:1", "--ipv6=yes", "--max-drain=0s"}, `invalid: ipv6 "yes": want auto, true or false; maxDrain "0s": must be > 0`},
		{"missing file", env, []string{"--config", path + ".missing"}, "config: open " + path + ".missing"},
		{"unknown field", env, []string{"--config", writeFile(t, head+"controlplane: [a:1]\n")}, `VsplaneAgentConfiguration: unknown field "controlplane"`},
		{"the control plane's file", env, []string{"--config", writeFile(t, "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n")}, "want apiVersion config.vsplane.io/v1alpha1, kind VsplaneAgentConfiguration"},
		{"unknown flag", env, []string{"--controlplane=a:1", "--scheduler=rr"}, "flag provided but not defined: -scheduler"},
		{"bad flag value", env, []string{"--reconcile-period=soon"}, `invalid value "soon" for flag -reconcile-period`},
		{"positional argument", env, []string{"--controlplane", "a:1", "b:2"}, `unexpected arguments ["b:2"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("vsplane-agent", flag.ContinueOnError)
			fs.SetOutput(discard{})
			_, err := agentconfig.ParseCommandLine(fs, tc.args, tc.getenv)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	fs := flag.NewFlagSet("vsplane-agent", flag.ContinueOnError)
	fs.SetOutput(discard{})
	if _, err := agentconfig.ParseCommandLine(fs, []string{"-h"}, env); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestShippedAgentFile: deploy/base's agent configuration decodes
// strictly, is valid once the DaemonSet's --controlplane is given, and
// writes out the defaults (so it documents them; a changed default must
// be changed there too).
func TestShippedAgentFile(t *testing.T) {
	data, err := os.ReadFile("../../deploy/base/config/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentconfig.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(agentconfig.Defaults(), *c); diff != "" {
		t.Errorf("deploy/base/config/agent.yaml differs from the defaults (-defaults +file):\n%s", diff)
	}
	c.ControlPlane = []string{"198.18.1.11:18000"}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}

// FuzzDecode: no file makes Decode or Validate panic, and what Decode
// accepts is a VsplaneAgentConfiguration.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{"", head, head + "controlPlane: [a:1]\nipv6: true\nmaxDrain: 1m\n", head + "tls: {caFile: x, y: 1}\n",
		`{"apiVersion":"config.vsplane.io/v1alpha1","kind":"VsplaneAgentConfiguration","ipv6":false}`, "kind: [", "a: &x [*x]\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := agentconfig.Decode(data)
		if err != nil {
			return
		}
		if c.Kind != agentconfig.Kind || c.APIVersion != agentconfig.APIVersion {
			t.Fatalf("decoded a %s/%s", c.APIVersion, c.Kind)
		}
		_ = c.Validate()
	})
}
