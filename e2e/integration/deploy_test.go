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

// cert-manager's CRDs, for the overlays that use components/cert-manager:
// taken from its Go module (pinned by version and the module's hash), so
// the apiserver validates the Issuers and Certificates against the real
// schema.
const (
	certManagerModule = "github.com/cert-manager/cert-manager"
	certManagerVer    = "v1.21.2"
	certManagerSum    = "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68="
)

// certManagerCRDs downloads the pinned cert-manager module (Go's module
// cache; a few MB) and returns its Issuer and Certificate CRDs.
func certManagerCRDs(t *testing.T) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", certManagerModule+"@"+certManagerVer)
	cmd.Dir = t.TempDir() // outside this module: no go.mod to consult or change
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v\n%s%s", certManagerModule, certManagerVer, err, out, stderr.String())
	}
	var mod struct{ Dir, Sum, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Error != "" {
		t.Fatalf("go mod download %s@%s: %v %s", certManagerModule, certManagerVer, err, mod.Error)
	}
	if mod.Sum != certManagerSum {
		t.Fatalf("%s@%s has hash %s, pinned %s", certManagerModule, certManagerVer, mod.Sum, certManagerSum)
	}
	var docs [][]byte
	for _, f := range []string{"cert-manager.io_issuers.yaml", "cert-manager.io_certificates.yaml"} {
		b, err := os.ReadFile(filepath.Join(mod.Dir, "deploy", "crds", f))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, bytes.TrimPrefix(bytes.TrimSpace(b), []byte("---\n")))
	}
	return bytes.Join(docs, []byte("\n---\n"))
}

// TestDeployOverlaysApply renders every overlay in deploy/overlays with the
// kubectl built from the pinned Kubernetes modules (kustomize inside it) and
// applies it to the real apiserver with server-side dry-run: the apiserver
// validates every object (schemas, the PDB, the probes, the security
// contexts) without creating them. The namespace and the CRDs are applied
// for real first, since dry-run objects cannot be found by those that need
// them.
func TestDeployOverlaysApply(t *testing.T) {
	env, _, _ := startKubeEnv(t)
	kubectl := filepath.Join(env.BinDir, "kubectl")
	overlays, err := filepath.Glob(filepath.Join("..", "..", "deploy", "overlays", "*"))
	if err != nil || len(overlays) == 0 {
		t.Fatalf("no overlays under deploy/overlays (%v)", err)
	}
	run := func(t *testing.T, stdin []byte, args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", env.Kubeconfig}, args...)...)
		cmd.Stdin = bytes.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s\n%s", strings.Join(args, " "), err, stderr.String(), out)
		}
		return out
	}
	for _, dir := range overlays {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			rendered := run(t, nil, "kustomize", dir)
			var first [][]byte
			kinds := map[string]int{}
			for doc := range bytes.SplitSeq(rendered, []byte("\n---\n")) {
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
				first = append(first, certManagerCRDs(t))
			}
			if filepath.Base(dir) == "production" && (kinds["Certificate"] != 2 || kinds["Issuer"] != 2) {
				t.Errorf("production renders %d Certificates and %d Issuers, want 2 and 2 (components/cert-manager)", kinds["Certificate"], kinds["Issuer"])
			}
			for _, k := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
				"Deployment", "PodDisruptionBudget", "DaemonSet", "Service", "ConfigMap"} {
				if kinds[k] == 0 {
					t.Errorf("overlay renders no %s (kinds %v)", k, kinds)
				}
			}
			run(t, bytes.Join(first, []byte("\n---\n")), "apply", "--server-side", "--force-conflicts", "-f", "-")
			out := run(t, rendered, "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-")
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if n := slices.IndexFunc(lines, func(l string) bool { return !strings.Contains(l, "serverside-applied (server dry run)") }); n >= 0 {
				t.Errorf("not every object was dry-run applied: %q\n%s", lines[n], out)
			}
			if len(lines) != sum(kinds) {
				t.Errorf("%d objects applied, %d rendered", len(lines), sum(kinds))
			}
		})
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
