package integration_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

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
