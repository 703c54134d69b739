package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// CRDs of other projects that vsplane's manifests may use, taken from their
// Go modules (pinned by version and the module's hash), so the apiserver
// validates those objects against the real schemas: cert-manager's Issuer
// and Certificate (components/cert-manager, the chart's tls.certManager),
// prometheus-operator's PrometheusRule (deploy/monitoring, the chart's
// monitoring.prometheusRule).
var (
	certManagerCRDs = pinnedCRDs{
		module: "github.com/cert-manager/cert-manager", version: "v1.21.2",
		sum:   "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=",
		files: []string{"deploy/crds/cert-manager.io_issuers.yaml", "deploy/crds/cert-manager.io_certificates.yaml"},
	}
	prometheusOperatorCRDs = pinnedCRDs{
		module: "github.com/prometheus-operator/prometheus-operator", version: "v0.85.0",
		sum:   "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=",
		files: []string{"example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"},
	}
)

type pinnedCRDs struct {
	module, version, sum string
	files                []string // in the module
}

// load downloads the pinned module (Go's module cache; a few MB) and
// returns its CRD files as one YAML stream.
func (p pinnedCRDs) load(t *testing.T) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", p.module+"@"+p.version)
	cmd.Dir = t.TempDir() // outside this module: no go.mod to consult or change
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v\n%s%s", p.module, p.version, err, out, stderr.String())
	}
	var mod struct{ Dir, Sum, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Error != "" {
		t.Fatalf("go mod download %s@%s: %v %s", p.module, p.version, err, mod.Error)
	}
	if mod.Sum != p.sum {
		t.Fatalf("%s@%s has hash %s, pinned %s", p.module, p.version, mod.Sum, p.sum)
	}
	var docs [][]byte
	for _, f := range p.files {
		b, err := os.ReadFile(filepath.Join(mod.Dir, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, bytes.TrimPrefix(bytes.TrimSpace(b), []byte("---\n")))
	}
	return bytes.Join(docs, []byte("\n---\n"))
}

// TestDeployOverlaysApply renders every overlay in deploy/overlays with the
// kubectl built from the pinned Kubernetes modules (kustomize inside it) and
// applies it to the real apiserver with server-side dry-run (serverDryRun).
func TestDeployOverlaysApply(t *testing.T) {
	env, _, _ := startKubeEnv(t)
	k := kubectl{bin: filepath.Join(env.BinDir, "kubectl"), kubeconfig: env.Kubeconfig}
	overlays, err := filepath.Glob(filepath.Join("..", "..", "deploy", "overlays", "*"))
	if err != nil || len(overlays) == 0 {
		t.Fatalf("no overlays under deploy/overlays (%v)", err)
	}
	for _, dir := range overlays {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			kinds := serverDryRun(t, k, k.run(t, nil, "kustomize", dir))
			if filepath.Base(dir) == "production" && (kinds["Certificate"] != 2 || kinds["Issuer"] != 2) {
				t.Errorf("production renders %d Certificates and %d Issuers, want 2 and 2 (components/cert-manager)", kinds["Certificate"], kinds["Issuer"])
			}
			for _, k := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
				"Deployment", "PodDisruptionBudget", "DaemonSet", "Service", "ConfigMap"} {
				if kinds[k] == 0 {
					t.Errorf("overlay renders no %s (kinds %v)", k, kinds)
				}
			}
		})
	}
}

// kubectl runs the kubectl built from the pinned Kubernetes modules.
type kubectl struct{ bin, kubeconfig string }

func (k kubectl) run(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if k.kubeconfig != "" {
		args = append([]string{"--kubeconfig", k.kubeconfig}, args...)
	}
	cmd := exec.CommandContext(ctx, k.bin, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s\n%s", strings.Join(args, " "), err, stderr.String(), out)
	}
	return out
}

// serverDryRun applies rendered manifests (a YAML stream) to the real
// apiserver with server-side dry-run: the apiserver validates every object
// (schemas, the PDB, the probes, the security contexts) without creating
// them. What other objects need is applied for real first, since dry-run
// objects cannot be found by those that need them: the Namespaces and CRDs
// in rendered, the pinned CRDs of the other projects' kinds it uses, and
// prereqs. It fails the test unless every object was dry-run applied, and
// returns the rendered objects' count per kind.
func serverDryRun(t *testing.T, k kubectl, rendered []byte, prereqs ...[]byte) map[string]int {
	t.Helper()
	first := prereqs
	kinds := map[string]int{}
	for _, doc := range splitYAML(t, rendered) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("rendered document: %v\n%s", err, doc)
		}
		kinds[meta.Kind]++
		if meta.Kind == "Namespace" || meta.Kind == "CustomResourceDefinition" {
			first = append(first, doc)
		}
	}
	if kinds["Certificate"] > 0 || kinds["Issuer"] > 0 {
		first = append(first, certManagerCRDs.load(t))
	}
	if kinds["PrometheusRule"] > 0 {
		first = append(first, prometheusOperatorCRDs.load(t))
	}
	if len(first) > 0 {
		k.run(t, bytes.Join(first, []byte("\n---\n")), "apply", "--server-side", "--force-conflicts", "-f", "-")
	}
	out := k.run(t, rendered, "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-")
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if n := slices.IndexFunc(lines, func(l string) bool { return !strings.Contains(l, "serverside-applied (server dry run)") }); n >= 0 {
		t.Errorf("not every object was dry-run applied: %q\n%s", lines[n], out)
	}
	if len(lines) != sum(kinds) {
		t.Errorf("%d objects applied, %d rendered", len(lines), sum(kinds))
	}
	return kinds
}

// splitYAML splits a YAML stream into its documents, leaving out those
// with no object (only comments, as Helm renders a disabled template).
func splitYAML(t *testing.T, stream []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	for doc := range bytes.SplitSeq(append([]byte("\n"), stream...), []byte("\n---")) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatalf("YAML document: %v\n%s", err, doc)
		}
		if len(obj) > 0 {
			docs = append(docs, doc)
		}
	}
	return docs
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
