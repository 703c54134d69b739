package config_test

import (
	"flag"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/translate"
)

func dur(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

func TestDecodeDefaults(t *testing.T) {
	l, err := config.Decode([]byte("apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(config.Defaults(), l.Config); diff != "" {
		t.Errorf("empty file (-defaults +got):\n%s", diff)
	}
	if err := l.Config.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	want := translate.Config{}.WithDefaults()
	if diff := cmp.Diff(want, l.Config.Translate(), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("defaults translate (-want +got):\n%s", diff)
	}
	d := config.Defaults()
	if d.IPVS.Scheduler != "rr" || d.MasqueradeBit != 14 || d.ControlPlane.ListenAddress != ":18000" ||
		d.ControlPlane.MetricsAddress != "127.0.0.1:18001" || d.ControlPlane.MaxInflightDeltas != 2 ||
		d.ControlPlane.MaxConnectionAge.Duration != 30*time.Minute {
		t.Errorf("defaults changed: %+v", d)
	}
}

func TestDecodeVsplaneYAMLAndJSON(t *testing.T) {
	yamlDoc := `
apiVersion: config.vsplane.io/v1alpha1
kind: VsplaneConfiguration
ipvs:
  scheduler: wlc
  tcpTimeout: 15m
  strictARP: true
  excludeCIDRs: [198.19.200.0/24]
masqueradeBit: 12
clusterCIDRs: [198.18.0.0/16]
controlPlane:
  listenAddress: 127.0.0.1:19000
  maxConnectionAge: 0s
  maxDeltaOps: 1000
`
	jsonDoc := `{"apiVersion":"config.vsplane.io/v1alpha1","kind":"VsplaneConfiguration",
	 "ipvs":{"scheduler":"wlc","tcpTimeout":"15m","strictARP":true,"excludeCIDRs":["198.19.200.0/24"]},
	 "masqueradeBit":12,"clusterCIDRs":["198.18.0.0/16"],
	 "controlPlane":{"listenAddress":"127.0.0.1:19000","maxConnectionAge":"0s","maxDeltaOps":1000}}`
	want := config.Defaults()
	want.IPVS.Scheduler, want.IPVS.TCPTimeout, want.IPVS.StrictARP = "wlc", dur(15*time.Minute), true
	want.IPVS.ExcludeCIDRs = []string{"198.19.200.0/24"}
	want.MasqueradeBit, want.ClusterCIDRs = 12, []string{"198.18.0.0/16"}
	want.ControlPlane.ListenAddress, want.ControlPlane.MaxConnectionAge, want.ControlPlane.MaxDeltaOps = "127.0.0.1:19000", dur(0), 1000
	for name, doc := range map[string]string{"yaml": yamlDoc, "json": jsonDoc} {
		l, err := config.Decode([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if l.Kind != config.Kind || len(l.Warnings) != 0 {
			t.Errorf("%s: kind %q warnings %v", name, l.Kind, l.Warnings)
		}
		if diff := cmp.Diff(want, l.Config); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	const head = "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n"
	for _, tc := range []struct{ name, doc, want string }{
		{"misspelled nested field", head + "ipvs:\n  schedulr: wlc\n", `unknown field "ipvs.schedulr"`},
		{"unknown top-level field", head + "mode: ipvs\n", `unknown field "mode"`},
		{"wrong case", head + "ipvs:\n  Scheduler: wlc\n", `unknown field "ipvs.Scheduler"`},
		{"unknown under controlPlane", head + "controlPlane:\n  listen: :1\n", `unknown field "controlPlane.listen"`},
		{"duplicate key", head + "masqueradeAll: true\nmasqueradeAll: false\n", `already set`},
		{"wrong kind", "apiVersion: config.vsplane.io/v1alpha1\nkind: KubeletConfiguration\n", `apiVersion "config.vsplane.io/v1alpha1", kind "KubeletConfiguration": not supported; want apiVersion config.vsplane.io/v1alpha1, kind VsplaneConfiguration`},
		{"wrong version", "apiVersion: config.vsplane.io/v1beta9\nkind: VsplaneConfiguration\n", `apiVersion "config.vsplane.io/v1beta9", kind "VsplaneConfiguration": not supported`},
		{"no type", "ipvs:\n  scheduler: rr\n", "apiVersion and kind missing"},
		{"empty", "", "empty file"},
		{"bad duration", head + "ipvs:\n  tcpTimeout: soon\n", `"soon"`},
		{"wrong type", head + "masqueradeAll: [1]\n", "masqueradeAll"},
		{"kube-proxy iptables mode", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n", `mode "iptables": vsplane implements kube-proxy's IPVS mode`},
		{"not yaml", "apiVersion: [", "not a YAML or JSON document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Decode([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestValidateNamesFieldAndValue(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(c *config.VsplaneConfiguration)
		want string
	}{
		{"scheduler", func(c *config.VsplaneConfiguration) { c.IPVS.Scheduler = "foo" }, `ipvs.scheduler "foo": not a known IPVS scheduler`},
		{"tcpTimeout", func(c *config.VsplaneConfiguration) { c.IPVS.TCPTimeout = dur(-time.Second) }, `ipvs.tcpTimeout "-1s": must be >= 0`},
		{"tcpFinTimeout", func(c *config.VsplaneConfiguration) { c.IPVS.TCPFinTimeout = dur(-time.Second) }, `ipvs.tcpFinTimeout "-1s": must be >= 0`},
		{"udpTimeout too big", func(c *config.VsplaneConfiguration) { c.IPVS.UDPTimeout = dur(1000 * time.Hour) }, `ipvs.udpTimeout "1000h0m0s": must be <= 596h31m23s`},
		{"excludeCIDRs", func(c *config.VsplaneConfiguration) { c.IPVS.ExcludeCIDRs = []string{"198.19.0.0/24", "198.19.0.0/33"} }, `ipvs.excludeCIDRs[1] "198.19.0.0/33": not a CIDR`},
		{"clusterCIDRs", func(c *config.VsplaneConfiguration) { c.ClusterCIDRs = []string{"pods"} }, `clusterCIDRs[0] "pods": not a CIDR`},
		{"nodePortAddresses", func(c *config.VsplaneConfiguration) { c.NodePortAddresses = []string{"198.19.0.1"} }, `nodePortAddresses[0] "198.19.0.1": not a CIDR or one of the keywords primary, localhost, all`},
		{"nodePortAddresses keyword twice", func(c *config.VsplaneConfiguration) {
			c.NodePortAddresses = []string{"primary", "198.18.240.0/24", "primary"}
		}, `nodePortAddresses[2] "primary": duplicate keyword`},
		{"detectLocalMode", func(c *config.VsplaneConfiguration) { c.DetectLocalMode = "NodeCidr" }, `detectLocalMode "NodeCidr": not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix`},
		{"bridgeInterface missing", func(c *config.VsplaneConfiguration) { c.DetectLocalMode = "BridgeInterface" }, `detectLocal.bridgeInterface "": empty (detectLocalMode BridgeInterface)`},
		{"interfaceNamePrefix too long", func(c *config.VsplaneConfiguration) {
			c.DetectLocalMode, c.DetectLocal.InterfaceNamePrefix = "InterfaceNamePrefix", "123456789012345"
		}, `detectLocal.interfaceNamePrefix "123456789012345": longer than 14 bytes (detectLocalMode InterfaceNamePrefix)`},
		{"conntrack.maxPerCore", func(c *config.VsplaneConfiguration) { c.Conntrack.MaxPerCore = -1 }, `conntrack.maxPerCore -1: must be >= 0`},
		{"conntrack.min", func(c *config.VsplaneConfiguration) { c.Conntrack.Min = -5 }, `conntrack.min -5: must be >= 0`},
		{"conntrack.udpTimeout", func(c *config.VsplaneConfiguration) { c.Conntrack.UDPTimeout = dur(-time.Second) }, `conntrack.udpTimeout "-1s": must be >= 0`},
		{"conntrack.tcpEstablishedTimeout too big", func(c *config.VsplaneConfiguration) {
			c.Conntrack.TCPEstablishedTimeout = dur(1 << 32 * time.Second)
		}, `conntrack.tcpEstablishedTimeout "1193046h28m16s": must be <= 596523h14m7s`},
		{"masqueradeBit", func(c *config.VsplaneConfiguration) { c.MasqueradeBit = 32 }, `masqueradeBit 32: must be 1..31`},
		{"masqueradeBit 0", func(c *config.VsplaneConfiguration) { c.MasqueradeBit = 0 }, `masqueradeBit 0: must be 1..31`},
		{"agentReconcilePeriod", func(c *config.VsplaneConfiguration) { c.AgentReconcilePeriod = dur(-time.Minute) }, `agentReconcilePeriod "-1m0s": must be >= 0`},
		{"listenAddress", func(c *config.VsplaneConfiguration) { c.ControlPlane.ListenAddress = "18000" }, `controlPlane.listenAddress "18000": want host:port`},
		{"metricsAddress", func(c *config.VsplaneConfiguration) { c.ControlPlane.MetricsAddress = "localhost" }, `controlPlane.metricsAddress "localhost": want host:port`},
		{"enableProfiling", func(c *config.VsplaneConfiguration) {
			c.ControlPlane.EnableProfiling, c.ControlPlane.MetricsAddress = true, ""
		}, `controlPlane.enableProfiling true: needs controlPlane.metricsAddress`},
		{"kubeAPIQPS", func(c *config.VsplaneConfiguration) { c.ControlPlane.KubeAPIQPS = 0 }, `controlPlane.kubeAPIQPS 0: must be > 0`},
		{"minSyncInterval", func(c *config.VsplaneConfiguration) { c.ControlPlane.MinSyncInterval = dur(0) }, `controlPlane.minSyncInterval "0s": must be > 0`},
		{"min > max sync", func(c *config.VsplaneConfiguration) { c.ControlPlane.MinSyncInterval = dur(2 * time.Hour) }, `controlPlane.minSyncInterval "2h0m0s": must be <= controlPlane.maxSyncInterval (1h0m0s)`},
		{"ackTimeout", func(c *config.VsplaneConfiguration) { c.ControlPlane.AckTimeout = dur(-1) }, `controlPlane.ackTimeout "-1ns": must be > 0`},
		{"maxInflightDeltas", func(c *config.VsplaneConfiguration) { c.ControlPlane.MaxInflightDeltas = 0 }, `controlPlane.maxInflightDeltas 0: must be >= 1`},
		{"deltaTargetApplyTime", func(c *config.VsplaneConfiguration) { c.ControlPlane.DeltaTargetApplyTime = dur(0) }, `controlPlane.deltaTargetApplyTime "0s": must be > 0`},
		{"minDeltaOps", func(c *config.VsplaneConfiguration) { c.ControlPlane.MinDeltaOps = 0 }, `controlPlane.minDeltaOps 0: must be >= 1`},
		{"maxDeltaOps", func(c *config.VsplaneConfiguration) { c.ControlPlane.MaxDeltaOps = 10 }, `controlPlane.maxDeltaOps 10: must be >= controlPlane.minDeltaOps (256)`},
		{"maxUnknownNodeStreams", func(c *config.VsplaneConfiguration) { c.ControlPlane.MaxUnknownNodeStreams = -1 }, `controlPlane.maxUnknownNodeStreams -1: must be >= 0`},
		{"maxConnectionAge", func(c *config.VsplaneConfiguration) { c.ControlPlane.MaxConnectionAge = dur(-time.Second) }, `controlPlane.maxConnectionAge "-1s": must be >= 0 (0 disables)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Defaults()
			tc.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if err != nil && strings.Count(err.Error(), "\n") != 0 && tc.name != "min > max sync" {
				t.Errorf("one bad field gave several errors: %v", err)
			}
		})
	}
	// Every problem is reported, not just the first.
	c := config.Defaults()
	c.IPVS.Scheduler, c.MasqueradeBit = "foo", 40
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "ipvs.scheduler") || !strings.Contains(err.Error(), "masqueradeBit 40") {
		t.Errorf("got %v, want both problems", err)
	}
}

// kubeProxyConntrackDefaults are kube-proxy v1.37's conntrack defaults.
var kubeProxyConntrackDefaults = config.ConntrackConfiguration{MaxPerCore: 32768, Min: 131072,
	TCPEstablishedTimeout: dur(24 * time.Hour), TCPCloseWaitTimeout: dur(time.Hour)}

func TestKubeProxyConfigurationMapping(t *testing.T) {
	data, err := os.ReadFile("testdata/kube-proxy-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := config.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Defaults()
	want.IPVS = config.IPVSConfiguration{Scheduler: "wlc", TCPTimeout: dur(15 * time.Minute), TCPFinTimeout: dur(5 * time.Second),
		UDPTimeout: dur(10 * time.Second), StrictARP: true, ExcludeCIDRs: []string{"198.19.200.0/24"}}
	want.MasqueradeAll, want.MasqueradeBit = true, 12
	want.ClusterCIDRs = []string{"198.18.0.0/16", "fd00:198:18::/56"}
	want.NodePortAddresses = []string{"198.19.0.0/24"}
	want.Conntrack = kubeProxyConntrackDefaults // the file's conntrack fields are null or 0
	if diff := cmp.Diff(want, l.Config); diff != "" {
		t.Errorf("mapping (-want +got):\n%s", diff)
	}
	if l.Kind != config.KubeProxyKind {
		t.Errorf("kind %q", l.Kind)
	}
	if err := l.Config.Validate(); err != nil {
		t.Errorf("mapped configuration invalid: %v", err)
	}
	// One warning naming every set field vsplane does not read; zero
	// values ("", 0, false, null, 0s, "0", {}) are not "set".
	wantWarn := []string{"KubeProxyConfiguration: fields not supported by vsplane, ignored: bindAddress, clientConnection.kubeconfig, ipvs.syncPeriod"}
	if diff := cmp.Diff(wantWarn, l.Warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}

	// Empty mode and defaults: kube-proxy's defaults map to vsplane's.
	l, err = config.Decode([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmasqueradeAll: true\nfeatureGates: {Foo: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want = config.Defaults()
	want.MasqueradeAll = true
	want.Conntrack = kubeProxyConntrackDefaults
	if diff := cmp.Diff(want, l.Config); diff != "" {
		t.Errorf("minimal (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"KubeProxyConfiguration: fields not supported by vsplane, ignored: featureGates.Foo"}, l.Warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}

	// conntrack: what is set is kept, 0 included; what is left out takes
	// kube-proxy's default.
	l, err = config.Decode([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 20s, tcpBeLiberal: true, udpTimeout: 30s, udpStreamTimeout: 2m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	wantCT := config.ConntrackConfiguration{Min: 131072, TCPEstablishedTimeout: dur(24 * time.Hour), TCPCloseWaitTimeout: dur(20 * time.Second),
		TCPBeLiberal: true, UDPTimeout: dur(30 * time.Second), UDPStreamTimeout: dur(2 * time.Minute)}
	if diff := cmp.Diff(wantCT, l.Config.Conntrack); diff != "" || len(l.Warnings) != 0 {
		t.Errorf("conntrack (-want +got):\n%s\nwarnings %q", diff, l.Warnings)
	}
	if got := l.Config.Translate().Conntrack; got != (translate.Conntrack{Min: 131072, TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout: 20 * time.Second, TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute}) {
		t.Errorf("conntrack translated to %+v", got)
	}

	// detectLocalMode and detectLocal map (no warning), and reach the
	// translator's configuration.
	l, err = config.Decode([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: veth, bridgeInterface: cbr0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Warnings) != 0 || l.Config.Validate() != nil {
		t.Errorf("detectLocal: warnings %q, validation %v", l.Warnings, l.Config.Validate())
	}
	if ld := l.Config.Translate().LocalDetect; ld != (translate.LocalDetect{Mode: translate.LocalByInterfacePrefix, Interface: "veth"}) {
		t.Errorf("detectLocal translated to %+v", ld)
	}
	for mode, want := range map[string]translate.LocalDetect{
		"": {Mode: translate.LocalByClusterCIDR}, "ClusterCIDR": {Mode: translate.LocalByClusterCIDR},
		"NodeCIDR": {Mode: translate.LocalByNodeCIDR}, "BridgeInterface": {Mode: translate.LocalByBridge, Interface: "cbr0"},
	} {
		c := l.Config
		c.DetectLocalMode = mode
		if got := c.Translate().LocalDetect; got != want {
			t.Errorf("detectLocalMode %q: %+v, want %+v", mode, got, want)
		}
	}
}

func TestFlagsOverrideFile(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/c.yaml"
	file := `apiVersion: config.vsplane.io/v1alpha1
kind: VsplaneConfiguration
ipvs: {scheduler: wlc, tcpTimeout: 15m, excludeCIDRs: [198.19.200.0/24]}
masqueradeAll: true
clusterCIDRs: [198.18.0.0/16]
controlPlane: {listenAddress: "127.0.0.1:19000", maxInflightDeltas: 4}
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) *config.Loaded {
		t.Helper()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c := config.Defaults()
		config.Bind(fs, &c)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		l, err := config.Source{Path: path, Flags: fs}.Load()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// No flags: the file.
	l := parse()
	if l.Config.IPVS.Scheduler != "wlc" || !l.Config.MasqueradeAll || l.Config.ControlPlane.MaxInflightDeltas != 4 {
		t.Errorf("file not applied: %+v", l.Config)
	}
	// Explicit flags win, even when set to the default value; flags not
	// given leave the file's values (a flag's default never overrides).
	l = parse("--scheduler=rr", "--masquerade-all=false", "--cluster-cidr=", "--listen=127.0.0.1:19001", "--ipvs-udp-timeout=5s")
	want := config.Defaults()
	want.IPVS.Scheduler, want.IPVS.TCPTimeout, want.IPVS.UDPTimeout = "rr", dur(15*time.Minute), dur(5*time.Second)
	want.IPVS.ExcludeCIDRs = []string{"198.19.200.0/24"}
	want.ControlPlane.ListenAddress, want.ControlPlane.MaxInflightDeltas = "127.0.0.1:19001", 4
	if diff := cmp.Diff(want, l.Config, cmp.Comparer(func(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") })); diff != "" {
		t.Errorf("flags over file (-want +got):\n%s", diff)
	}
	// An invalid flag value fails validation naming the file's field.
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c := config.Defaults()
	config.Bind(fs, &c)
	if err := fs.Parse([]string{"--scheduler=foo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := (config.Source{Path: path, Flags: fs}).Load(); err == nil || !strings.Contains(err.Error(), `ipvs.scheduler "foo"`) {
		t.Errorf("got %v", err)
	}
	// Without a file: defaults and flags.
	if l, err := (config.Source{Flags: fs}).Parse(nil); err == nil {
		t.Errorf("invalid flag accepted without a file: %+v", l.Config)
	}
	if got := config.Explicit(fs); strings.Join(got, ",") != "scheduler" {
		t.Errorf("Explicit = %v", got)
	}
}

// The shipped example documents the defaults: it decodes strictly and
// equals them.
func TestExampleFileIsTheDefaults(t *testing.T) {
	data, err := os.ReadFile("../../deploy/examples/vsplane-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := config.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Defaults()
	if diff := cmp.Diff(want, l.Config, cmp.Comparer(func(a, b []string) bool {
		return len(a) == 0 && len(b) == 0 || strings.Join(a, ",") == strings.Join(b, ",")
	})); diff != "" {
		t.Errorf("example differs from the defaults (-defaults +example):\n%s", diff)
	}
}

// TestNodePortKeywords: kube-proxy's keywords are accepted and reach the
// translator expanded ("primary" is per node: a flag).
func TestNodePortKeywords(t *testing.T) {
	kp, err := config.Decode([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nnodePortAddresses: [primary]\n"))
	if err != nil {
		t.Fatalf("KubeProxyConfiguration with nodePortAddresses [primary]: %v", err)
	}
	if err := kp.Config.Validate(); err != nil || !kp.Config.Translate().NodePortPrimary {
		t.Errorf("KubeProxyConfiguration [primary]: %v, primary %v", err, kp.Config.Translate().NodePortPrimary)
	}
	c := config.Defaults()
	c.NodePortAddresses = []string{"primary", "localhost", " 198.19.0.0/24", "all"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	tc := c.Translate()
	var got []string
	for _, p := range tc.NodePortAddresses {
		got = append(got, p.String())
	}
	if want := "127.0.0.0/8 ::1/128 198.19.0.0/24 0.0.0.0/0 ::/0"; strings.Join(got, " ") != want || !tc.NodePortPrimary {
		t.Errorf("translate: %v primary=%v, want %s primary=true", got, tc.NodePortPrimary, want)
	}
}
