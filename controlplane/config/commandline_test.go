package config_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vsplane/vsplane/controlplane/config"
)

// flagDefaults are vsplane-controlplane's flags and their defaults, as
// deploy/, the README and users' manifests know them: a flag renamed,
// dropped or with a new default fails here.
var flagDefaults = map[string]string{
	"ack-timeout":               "5m0s",
	"advertise-address":         "",
	"agent-reconcile-period":    "0s",
	"agent-service-account":     "vsplane-system/vsplane-agent",
	"auth-api-qps":              "50",
	"ca-configmap":              "vsplane-system/vsplane-controlplane-ca",
	"cluster-cidr":              "",
	"config":                    "",
	"config-check-interval":     "2s",
	"debug":                     "false",
	"delta-target-apply-time":   "250ms",
	"detect-local-mode":         "",
	"insecure-plaintext":        "false",
	"ipvs-exclude-cidrs":        "",
	"ipvs-strict-arp":           "false",
	"ipvs-tcp-timeout":          "0s",
	"ipvs-tcpfin-timeout":       "0s",
	"ipvs-udp-timeout":          "0s",
	"kube-api-qps":              "50",
	"kubeconfig":                "",
	"listen":                    ":18000",
	"masquerade-all":            "false",
	"masquerade-bit":            "14",
	"max-connection-age":        "30m0s",
	"max-connection-age-grace":  "30s",
	"max-delta-ops":             "50000",
	"max-inflight-deltas":       "2",
	"max-sync-interval":         "1h0m0s",
	"max-unknown-node-streams":  "256",
	"metrics-address":           "127.0.0.1:18001",
	"min-delta-ops":             "256",
	"min-sync-interval":         "100ms",
	"nodeport-addresses":        "",
	"peer-service":              "",
	"peer-token-file":           "/var/run/secrets/kubernetes.io/serviceaccount/token",
	"peers":                     "",
	"pod-bridge-interface":      "",
	"pod-interface-name-prefix": "",
	"profiling":                 "false",
	"rollout-lease":             "vsplane-system/vsplane-rollout-leader",
	"rollouts":                  "true",
	"scheduler":                 "rr",
	"tls-ca-file":               "/etc/vsplane/tls/ca.crt",
	"tls-cert-file":             "/etc/vsplane/tls/tls.crt",
	"tls-key-file":              "/etc/vsplane/tls/tls.key",
	"tls-server-name":           "vsplane-controlplane.vsplane-system.svc",
	"unknown-node-timeout":      "10m0s",
}

func parseCommandLine(getenv func(string) string, args ...string) (*config.CommandLine, error) {
	fs := flag.NewFlagSet("vsplane-controlplane", flag.ContinueOnError)
	fs.SetOutput(discard{})
	return config.ParseCommandLine(fs, args, getenv)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func noEnv(string) string { return "" }

func TestCommandLineFlagsKeepNamesAndDefaults(t *testing.T) {
	fs := flag.NewFlagSet("vsplane-controlplane", flag.ContinueOnError)
	if _, err := config.ParseCommandLine(fs, nil, noEnv); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { got[f.Name] = f.DefValue })
	if diff := cmp.Diff(flagDefaults, got); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
}

func TestParseCommandLineDefaults(t *testing.T) {
	cl, err := parseCommandLine(noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := config.CommandLine{
		ConfigCheckInterval: config.DefaultCheckInterval,
		TLS: config.TLSFiles{CertFile: "/etc/vsplane/tls/tls.crt", KeyFile: "/etc/vsplane/tls/tls.key",
			CAFile: "/etc/vsplane/tls/ca.crt", ServerName: "vsplane-controlplane.vsplane-system.svc"},
		PeerTokenFile:        "/var/run/secrets/kubernetes.io/serviceaccount/token",
		CAConfigMap:          "vsplane-system/vsplane-controlplane-ca",
		AgentServiceAccounts: []string{"vsplane-system/vsplane-agent"},
		Rollouts:             true,
		RolloutLease:         "vsplane-system/vsplane-rollout-leader",
	}
	if diff := cmp.Diff(want, *cl, cmpopts.IgnoreFields(config.CommandLine{}, "Loaded", "Source")); diff != "" {
		t.Errorf("command line (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(config.Defaults(), cl.Loaded.Config); diff != "" {
		t.Errorf("configuration (-defaults +got):\n%s", diff)
	}
	if cl.Source.Path != "" || cl.Source.Flags == nil {
		t.Errorf("source %+v", cl.Source)
	}
}

// TestParseCommandLine maps every flags-only setting, and keeps the
// precedence of the file's settings: a flag given > the file > the
// defaults.
func TestParseCommandLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vsplane.yaml")
	file := "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n" +
		"ipvs: {scheduler: wlc}\nmasqueradeAll: true\ncontrolPlane: {listenAddress: \"127.0.0.1:19000\", kubeAPIQPS: 20}\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string { return map[string]string{"POD_IP": "198.18.1.11"}[k] }
	cl, err := parseCommandLine(env, "--config", path, "--config-check-interval=5s", "--kubeconfig=/k", "--tls-cert-file=/c",
		"--tls-key-file=/k.key", "--tls-ca-file=/ca", "--tls-server-name=cp.example", "--peer-token-file=/t", "--ca-configmap=",
		"--agent-service-account= a/b , c/d,", "--rollouts=false", "--rollout-lease=bad", "--advertise-address=198.18.1.11:18000",
		"--peers=198.18.1.12:18000, 198.18.1.13:18000", "--peer-service=vsplane-system/vsplane-controlplane-peers", "--debug",
		"--masquerade-all=false", "--auth-api-qps=7")
	if err != nil {
		t.Fatal(err)
	}
	want := config.CommandLine{
		ConfigFile: path, ConfigCheckInterval: 5 * time.Second, Overridden: []string{"auth-api-qps", "masquerade-all"},
		Kubeconfig: "/k", TLS: config.TLSFiles{CertFile: "/c", KeyFile: "/k.key", CAFile: "/ca", ServerName: "cp.example"},
		PeerTokenFile: "/t", AgentServiceAccounts: []string{"a/b", "c/d"}, RolloutLease: "bad",
		AdvertiseAddress: "198.18.1.11:18000", PodIP: "198.18.1.11",
		Peers:       []string{"198.18.1.12:18000", "198.18.1.13:18000"},
		PeerService: "vsplane-system/vsplane-controlplane-peers", Debug: true,
	}
	sort.Strings(cl.Overridden)
	if diff := cmp.Diff(want, *cl, cmpopts.IgnoreFields(config.CommandLine{}, "Loaded", "Source")); diff != "" {
		t.Errorf("command line (-want +got):\n%s", diff)
	}
	wantCfg := config.Defaults()
	wantCfg.IPVS.Scheduler = "wlc"                                                              // the file
	wantCfg.ControlPlane.ListenAddress, wantCfg.ControlPlane.KubeAPIQPS = "127.0.0.1:19000", 20 // the file
	wantCfg.ControlPlane.AuthAPIQPS = 7                                                         // a flag, over the default
	// masqueradeAll: the flag given (false) over the file (true).
	if diff := cmp.Diff(wantCfg, cl.Loaded.Config); diff != "" {
		t.Errorf("configuration (-want +got):\n%s", diff)
	}
	if cl.Source.Path != path || cl.Loaded.Kind != config.Kind {
		t.Errorf("source %+v, kind %q", cl.Source, cl.Loaded.Kind)
	}
	// The Reloader's source re-applies the flags given over a new file.
	l, err := cl.Source.Parse([]byte("apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\nmasqueradeAll: true\nipvs: {scheduler: sh}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Config.MasqueradeAll || l.Config.IPVS.Scheduler != "sh" || l.Config.ControlPlane.AuthAPIQPS != 7 {
		t.Errorf("reloaded file: masqueradeAll %v scheduler %q authAPIQPS %v; want the flags over the new file",
			l.Config.MasqueradeAll, l.Config.IPVS.Scheduler, l.Config.ControlPlane.AuthAPIQPS)
	}

	// --insecure-plaintext: no agent ServiceAccounts, and theirs are not checked.
	cl, err = parseCommandLine(noEnv, "--insecure-plaintext", "--agent-service-account=whatever")
	if err != nil {
		t.Fatal(err)
	}
	if !cl.InsecurePlaintext || cl.AgentServiceAccounts != nil {
		t.Errorf("insecure: %+v", cl)
	}
}

func TestParseCommandLineErrorsNameTheFlag(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\nipvs: {schedulr: rr}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"service account", []string{"--agent-service-account=vsplane-system/a,agent"}, `--agent-service-account "agent": want namespace/name`},
		{"rollout lease", []string{"--rollout-lease=leader"}, `--rollout-lease "leader": want namespace/name`},
		{"peer service", []string{"--peer-service=a/b/c"}, `--peer-service "a/b/c": want namespace/name`},
		{"CA ConfigMap", []string{"--ca-configmap=vsplane-controlplane-ca"}, `--ca-configmap "vsplane-controlplane-ca": want namespace/name`},
		{"file setting given as a flag", []string{"--scheduler=foo"}, `config flags: invalid: ipvs.scheduler "foo"`},
		{"all problems on one line", []string{"--max-inflight-deltas=0", "--min-sync-interval=0s"},
			`controlPlane.minSyncInterval "0s": must be > 0; controlPlane.maxInflightDeltas 0: must be >= 1`},
		{"file", []string{"--config", bad}, `unknown field "ipvs.schedulr"`},
		{"missing file", []string{"--config", bad + ".missing"}, "config: open " + bad + ".missing"},
		{"bad flag value", []string{"--ack-timeout=soon"}, `invalid value "soon" for flag -ack-timeout`},
		{"unknown flag", []string{"--controlplane=a:1"}, "flag provided but not defined: -controlplane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseCommandLine(noEnv, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := parseCommandLine(noEnv, "-h"); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	// Without --rollouts the lease is not used, so not checked (as before).
	if _, err := parseCommandLine(noEnv, "--rollouts=false", "--rollout-lease=leader"); err != nil {
		t.Errorf("--rollouts=false: %v", err)
	}
}
