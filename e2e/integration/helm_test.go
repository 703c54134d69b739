package integration_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"sigs.k8s.io/yaml"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/dataplane/agentconfig"
	"github.com/vsplane/vsplane/e2e/helmchart"
	"github.com/vsplane/vsplane/e2e/kubeenv"
)

// The Helm chart (deploy/helm/vsplane) and the kustomize base and overlays
// (deploy/) describe the same objects; these tests keep them together.
// They use Helm's Go SDK as `helm template`, `helm lint` and `helm install`
// would, with the namespace the base uses.
const (
	chartDir       = "../../" + helmchart.Dir
	chartNamespace = helmchart.Namespace
)

// chartValuesFiles are the documented values files (README, Install).
func chartValuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 7 {
		t.Fatalf("ci/*-values.yaml: %v %v", files, err)
	}
	return files
}

func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	vals, err := helmchart.ReadValues(file)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

func renderChart(vals map[string]any) ([]byte, error) {
	return helmchart.Render(filepath.Join("..", ".."), vals)
}

func mustRenderChart(t *testing.T, valuesFile string) []byte {
	t.Helper()
	out, err := renderChart(readValues(t, valuesFile))
	if err != nil {
		t.Fatalf("render with %s: %v", valuesFile, err)
	}
	return bytes.Join(splitYAML(t, out), []byte("\n---\n"))
}

// TestHelmChartRenders renders the chart with every documented values file
// and runs the binaries' own configuration code on what each container
// would get (checkControlPlane, checkAgent: as TestDeployConfigFiles does
// for the overlays), then checks what the values switch on.
func TestHelmChartRenders(t *testing.T) {
	for _, file := range chartValuesFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), "-values.yaml"), func(t *testing.T) {
			vals := readValues(t, file)
			out := mustRenderChart(t, file)
			r := parseRendered(t, out)
			if r.controlPlane == nil || r.agent == nil {
				t.Fatalf("chart renders no control-plane Deployment or agent DaemonSet")
			}
			t.Run("controlplane", func(t *testing.T) { checkControlPlane(t, r) })
			t.Run("agent", func(t *testing.T) { checkAgent(t, r) })
			objs := objectsByKey(t, out)
			want := map[string]bool{
				"Issuer/vsplane-system/vsplane-ca":                       path(vals, "tls", "certManager", "enabled") == true,
				"Certificate/vsplane-system/vsplane-controlplane":        path(vals, "tls", "certManager", "enabled") == true,
				"PrometheusRule/vsplane-system/vsplane":                  path(vals, "monitoring", "prometheusRule", "enabled") == true,
				"ConfigMap/vsplane-system/vsplane-dashboard":             path(vals, "monitoring", "dashboard", "enabled") == true,
				"CustomResourceDefinition//schedulerrollouts.vsplane.io": true,
			}
			for key, w := range want {
				if _, ok := objs[key]; ok != w {
					t.Errorf("%s rendered: %v, want %v", key, ok, w)
				}
			}
			secret := r.controlPlane.Spec.Template.Spec.Volumes[0].Secret.SecretName
			if want := "vsplane-controlplane-tls"; file == filepath.Join(chartDir, "ci", "existing-secret-values.yaml") {
				if secret == want {
					t.Errorf("existing-secret-values.yaml: the replicas still mount %s", secret)
				}
			} else if secret != want {
				t.Errorf("replicas mount Secret %s, want %s", secret, want)
			}
			if filepath.Base(file) == "scheduling-values.yaml" {
				checkScheduling(t, r)
			}
			if rule, ok := objs["PrometheusRule/vsplane-system/vsplane"]; ok {
				checkMonitoringCopy(t, rule)
			}
			if cm, ok := objs["ConfigMap/vsplane-system/vsplane-dashboard"]; ok {
				checkDashboardCopy(t, cm)
			}
		})
	}
}

// checkScheduling: ci/scheduling-values.yaml's values reach the Pods.
func checkScheduling(t *testing.T, r *rendered) {
	t.Helper()
	cp, ag := &r.controlPlane.Spec.Template.Spec, &r.agent.Spec.Template.Spec
	got := map[string]any{
		"replicas":            *r.controlPlane.Spec.Replicas,
		"controlplane image":  cp.Containers[0].Image,
		"agent image":         ag.Containers[0].Image,
		"controlplane nodes":  cp.NodeSelector,
		"agent nodes":         ag.NodeSelector,
		"controlplane memory": cp.Containers[0].Resources.Limits.Memory().String(),
		"agent cpu":           ag.Containers[0].Resources.Requests.Cpu().String(),
		"priority class":      cp.PriorityClassName,
		"tolerations":         len(cp.Tolerations) + len(ag.Tolerations),
		"apiserver env":       cp.Containers[0].Env[len(cp.Containers[0].Env)-2].Name,
		"agents' addresses":   r.configMaps["vsplane-agent"].Data["controlplane"],
	}
	want := map[string]any{
		"replicas":            int32(2),
		"controlplane image":  "registry.example/vsplane/vsplane-controlplane@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"agent image":         "registry.example/vsplane/vsplane-agent:v0.1.0",
		"controlplane nodes":  map[string]string{"node-role.example/infra": "true"},
		"agent nodes":         map[string]string{"kubernetes.io/os": "linux"},
		"controlplane memory": "4Gi",
		"agent cpu":           "100m",
		"priority class":      "",
		"tolerations":         3,
		"apiserver env":       "KUBERNETES_SERVICE_HOST",
		"agents' addresses":   "198.18.2.21:18000,198.18.2.22:18000",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ci/scheduling-values.yaml rendered (-want +got):\n%s", d)
	}
}

func path(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, _ := v.(map[string]any)
		v = mm[k]
	}
	return v
}

// checkMonitoringCopy: the chart's PrometheusRule has deploy/monitoring's
// rules, labelled for the release.
func checkMonitoringCopy(t *testing.T, rule map[string]any) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var src map[string]any
	if err := yaml.Unmarshal(b, &src); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(src["spec"], rule["spec"]); d != "" {
		t.Errorf("PrometheusRule spec differs from deploy/monitoring/prometheusrule.yaml (-want +got):\n%s", d)
	}
}

func checkDashboardCopy(t *testing.T, cm map[string]any) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := path(cm, "data", "vsplane.json"); got != string(b) {
		t.Errorf("dashboard ConfigMap's vsplane.json differs from deploy/monitoring/dashboard.json")
	}
	if got := path(cm, "metadata", "labels", "grafana_dashboard"); got != "1" {
		t.Errorf("dashboard ConfigMap label grafana_dashboard = %v, want \"1\" (Grafana's sidecar)", got)
	}
}

// TestHelmChartCopies: the chart carries copies of deploy/crds and
// deploy/monitoring (Helm reads only files inside the chart); `make
// generate` writes them and `make check-generated` fails when they are
// stale. This says the same without make.
func TestHelmChartCopies(t *testing.T) {
	for src, dst := range map[string]string{
		"../../deploy/crds/vsplane.io_schedulerrollouts.yaml": "crds/vsplane.io_schedulerrollouts.yaml",
		"../../deploy/monitoring/prometheusrule.yaml":         "files/prometheusrule.yaml",
		"../../deploy/monitoring/dashboard.json":              "files/dashboard.json",
	} {
		a, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(chartDir, dst))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("deploy/helm/vsplane/%s differs from %s: run make generate", dst, src)
		}
	}
	crds, _ := filepath.Glob("../../deploy/crds/*.yaml")
	copies, _ := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	if len(copies) != len(crds)-1 { // deploy/crds/kustomization.yaml is not a CRD
		t.Errorf("chart crds/ %v, deploy/crds %v", copies, crds)
	}
}

// TestHelmChartMatchesKustomize renders the chart and the kustomize
// directory it stands for and compares the objects: the same kinds,
// namespaces and names, and the same content, after normalizing only what
// the two tools do differently (normalizeChart, normalizeKustomize).
func TestHelmChartMatchesKustomize(t *testing.T) {
	bin, err := kubeenv.FindBinDir("")
	if err != nil {
		t.Fatal(err)
	}
	k := kubectl{bin: filepath.Join(bin, "kubectl")}
	for dir, values := range map[string]string{
		"base":                "default-values.yaml",
		"overlays/production": "production-values.yaml",
		"overlays/dev":        "dev-values.yaml",
		"overlays/testbed":    "testbed-values.yaml",
	} {
		t.Run(dir, func(t *testing.T) {
			kust := objectsByKey(t, k.run(t, nil, "kustomize", filepath.Join("..", "..", "deploy", dir)))
			normalizeKustomize(t, kust)
			chart := objectsByKey(t, mustRenderChart(t, filepath.Join(chartDir, "ci", values)))
			normalizeChart(t, chart)
			if d := cmp.Diff(kust, chart); d != "" {
				t.Errorf("deploy/%s (-) and the chart with ci/%s (+) differ:\n%s", dir, values, d)
			}
		})
	}
}

// objectsByKey parses a YAML stream into objects keyed kind/namespace/name.
func objectsByKey(t *testing.T, stream []byte) map[string]map[string]any {
	t.Helper()
	objs := map[string]map[string]any{}
	for _, doc := range splitYAML(t, stream) {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatal(err)
		}
		key := strings.Join([]string{o["kind"].(string), str(path(o, "metadata", "namespace")), str(path(o, "metadata", "name"))}, "/")
		if _, dup := objs[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		objs[key] = o
	}
	return objs
}

func str(v any) string { s, _ := v.(string); return s }

// kustomize's configMapGenerator names the agents' ConfigMaps
// vsplane-agent-<hash> and vsplane-agent-config-<hash> so that a change
// rolls the DaemonSet. The chart cannot: a name that changes with content
// would leave the old ConfigMap behind on every `helm upgrade`... so it uses
// the fixed names and a checksum/config annotation on the Pod template,
// which rolls the DaemonSet the same way. The names are compared without
// the hash, the contents as they are.
var generatedName = regexp.MustCompile(`\b(vsplane-agent(?:-config)?)-[a-z0-9]{10}\b`)

func normalizeKustomize(t *testing.T, objs map[string]map[string]any) {
	t.Helper()
	// The chart leaves the namespace to `helm install --create-namespace`
	// (a chart that creates its own namespace cannot be installed into it).
	delete(objs, "Namespace//vsplane-system")
	for _, key := range slices.Collect(maps.Keys(objs)) {
		o := objs[key]
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var n map[string]any
		if err := json.Unmarshal(generatedName.ReplaceAll(b, []byte("$1")), &n); err != nil {
			t.Fatal(err)
		}
		delete(objs, key)
		objs[generatedName.ReplaceAllString(key, "$1")] = n
		// Helm installs crds/ as they are, without templating: the chart's
		// CRD lacks the base's app.kubernetes.io/part-of label.
		if n["kind"] == "CustomResourceDefinition" {
			deleteLabel(n, "app.kubernetes.io/part-of")
		}
		decodeConfigFiles(t, n)
	}
}

func normalizeChart(t *testing.T, objs map[string]map[string]any) {
	t.Helper()
	for _, o := range objs {
		// Helm's own labels, which the base does not have.
		for _, l := range []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"} {
			deleteLabel(o, l)
		}
		// The chart's stand-in for the hashed names (above).
		if ann, ok := path(o, "spec", "template", "metadata", "annotations").(map[string]any); ok {
			if _, ok := ann["checksum/config"]; !ok && o["kind"] == "DaemonSet" {
				t.Errorf("%s has no checksum/config annotation: a configuration change would not roll the agents", path(o, "metadata", "name"))
			}
			delete(ann, "checksum/config")
			if len(ann) == 0 {
				delete(path(o, "spec", "template", "metadata").(map[string]any), "annotations")
			}
		}
		decodeConfigFiles(t, o)
	}
}

func deleteLabel(o map[string]any, label string) {
	md := o["metadata"].(map[string]any)
	if labels, ok := md["labels"].(map[string]any); ok {
		delete(labels, label)
		if len(labels) == 0 {
			delete(md, "labels")
		}
	}
}

// decodeConfigFiles replaces the configuration files in a ConfigMap with
// what the binaries decode from them (as JSON): the base's files carry
// comments and every field, the chart's are written from values; what
// counts is the configuration the binaries run with.
func decodeConfigFiles(t *testing.T, o map[string]any) {
	t.Helper()
	data, _ := o["data"].(map[string]any)
	for key, v := range data {
		var decoded any
		var err error
		switch key {
		case "vsplane.yaml":
			var l *config.Loaded
			if l, err = config.Decode([]byte(v.(string))); err == nil {
				decoded = l.Config
			}
		case "agent.yaml":
			decoded, err = agentconfig.Decode([]byte(v.(string)))
		default:
			continue
		}
		if err != nil {
			t.Fatalf("%s %s: %v", path(o, "metadata", "name"), key, err)
		}
		b, err := json.Marshal(decoded)
		if err != nil {
			t.Fatal(err)
		}
		var fields map[string]any
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		data[key] = dropEmptyLists(fields)
	}
}

// dropEmptyLists removes the fields holding an empty or absent list: the
// same setting whether a file writes [] (the chart's values) or leaves the
// field out (deploy/overlays/testbed's file).
func dropEmptyLists(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, f := range v {
			if l, isList := f.([]any); f == nil || isList && len(l) == 0 {
				delete(v, k)
			} else {
				v[k] = dropEmptyLists(f)
			}
		}
	}
	return v
}

// TestHelmValuesSchema: a bad value is an error naming it (values.schema.json,
// checked by Helm before it renders anything).
func TestHelmValuesSchema(t *testing.T) {
	for _, c := range []struct{ name, values, field string }{
		{"unknown top-level key", "imagez: {}", "imagez"},
		{"misspelled key", "controlplane: {replica: 2}", "replica"},
		{"zero replicas", "controlplane: {replicas: 0}", "/controlplane/replicas"},
		{"replicas as a string", "controlplane: {replicas: three}", "/controlplane/replicas"},
		{"no addresses", "controlplane: {addresses: []}", "/controlplane/addresses"},
		{"address without port", "controlplane: {addresses: [198.18.1.11]}", "/controlplane/addresses/0"},
		{"bad digest", "images: {agent: {digest: latest}}", "/images/agent/digest"},
		{"bad pull policy", "images: {controlplane: {pullPolicy: Sometimes}}", "/images/controlplane/pullPolicy"},
		{"unknown scheduler", "controlplane: {config: {ipvs: {scheduler: fastest}}}", "/controlplane/config/ipvs/scheduler"},
		{"bad duration", "controlplane: {config: {controlPlane: {ackTimeout: 5 minutes}}}", "/controlplane/config/controlPlane/ackTimeout"},
		{"unknown config field", "controlplane: {config: {masqueradeALL: true}}", "masqueradeALL"},
		{"masquerade bit out of range", "controlplane: {config: {masqueradeBit: 32}}", "/controlplane/config/masqueradeBit"},
		{"removal share over 1", "agent: {config: {maxRemovalShare: 2}}", "/agent/config/maxRemovalShare"},
		{"bad ipv6", "agent: {config: {ipv6: sometimes}}", "/agent/config/ipv6"},
		{"bad toleration operator", "agent: {tolerations: [{operator: Maybe}]}", "/agent/tolerations/0/operator"},
		{"bad quantity", "agent: {resources: {requests: {memory: lots}}}", "/agent/resources/requests/memory"},
		{"bad maxUnavailable", "agent: {maxUnavailable: ten}", "/agent/maxUnavailable"},
		{"secret name", "tls: {secretName: Bad_Name}", "/tls/secretName"},
		{"cert-manager switch as a string", "tls: {certManager: {enabled: \"yes\"}}", "/tls/certManager/enabled"},
		{"monitoring switch as a string", "monitoring: {dashboard: {enabled: \"yes\"}}", "/monitoring/dashboard/enabled"},
		{"extra arg not a flag", "controlplane: {extraArgs: [debug]}", "/controlplane/extraArgs/0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vals, err := common.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			_, err = renderChart(vals)
			if err == nil {
				t.Fatalf("values %q rendered without error", c.values)
			}
			if !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), "schema") {
				t.Errorf("values %q: error %q does not name %s", c.values, err, c.field)
			}
		})
	}
}

// TestHelmSchemaSchedulers: the schema's schedulers are the control plane's.
func TestHelmSchemaSchedulers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range path(schema, "$defs", "controlplaneConfig", "properties", "ipvs", "properties", "scheduler", "enum").([]any) {
		got = append(got, s.(string))
	}
	want := slices.Sorted(slices.Values(model.Schedulers))
	if d := cmp.Diff(want, slices.Sorted(slices.Values(got))); d != "" {
		t.Errorf("values.schema.json schedulers differ from model.Schedulers (-want +got):\n%s", d)
	}
}

// TestHelmLint runs `helm lint`'s rules (Chart.yaml, values and schema,
// templates, CRDs) with every documented values file: no error, no warning.
func TestHelmLint(t *testing.T) {
	for _, file := range chartValuesFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), "-values.yaml"), func(t *testing.T) {
			kv, err := common.ParseKubeVersion(helmchart.KubeVersion)
			if err != nil {
				t.Fatal(err)
			}
			res := lint.RunAll(chartDir, readValues(t, file), chartNamespace, lint.WithKubeVersion(kv))
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
		})
	}
}

// TestHelmChartApply renders the chart with every documented values file
// and applies it to the real apiserver with server-side dry-run, as
// TestDeployOverlaysApply does for the overlays (serverDryRun; the
// namespace `helm install --create-namespace` would create is created
// first).
func TestHelmChartApply(t *testing.T) {
	env, _, _ := startKubeEnv(t)
	k := kubectl{bin: filepath.Join(env.BinDir, "kubectl"), kubeconfig: env.Kubeconfig}
	ns := []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: " + chartNamespace + "}\n")
	for _, file := range chartValuesFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), "-values.yaml"), func(t *testing.T) {
			kinds := serverDryRun(t, k, mustRenderChart(t, file), ns)
			for _, k := range []string{"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role",
				"Deployment", "PodDisruptionBudget", "DaemonSet", "Service", "ConfigMap"} {
				if kinds[k] == 0 {
					t.Errorf("chart renders no %s (kinds %v)", k, kinds)
				}
			}
		})
	}
}

// TestHelmConfigValuesComplete: the chart's controlplane.config and
// agent.config list every field the base's configuration files list (all
// of them, at their defaults), so that values.yaml documents every setting
// and the schema, which refuses unknown fields, knows it.
func TestHelmConfigValuesComplete(t *testing.T) {
	vals := readValues(t, filepath.Join(chartDir, "values.yaml"))
	for file, key := range map[string]string{"vsplane.yaml": "controlplane", "agent.yaml": "agent"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "config", file))
		if err != nil {
			t.Fatal(err)
		}
		var base map[string]any
		if err := yaml.Unmarshal(b, &base); err != nil {
			t.Fatal(err)
		}
		delete(base, "apiVersion")
		delete(base, "kind")
		if d := cmp.Diff(fieldPaths("", base), fieldPaths("", path(vals, key, "config").(map[string]any))); d != "" {
			t.Errorf("deploy/base/config/%s (-) and the chart's %s.config (+) list different fields:\n%s", file, key, d)
		}
	}
}

// fieldPaths lists the dotted paths of every leaf in m.
func fieldPaths(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			out = append(out, fieldPaths(prefix+k+".", sub)...)
		} else {
			out = append(out, prefix+k)
		}
	}
	slices.Sort(out)
	return out
}
