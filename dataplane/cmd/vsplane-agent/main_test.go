package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/internal/maintest"
)

// runAsAgent makes the test binary run main() (see internal/maintest).
const runAsAgent = "VSPLANE_AGENT_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	maintest.Main(runAsAgent, "vsplane-agent", main)
	os.Exit(m.Run())
}

// TestBadConfigExits runs the binary's main with a bad --config file or
// flag: it must exit non-zero with an error naming the problem, before it
// touches the kernel, and never panic.
func TestBadConfigExits(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const head = "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneAgentConfiguration\n"
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"misspelled field", []string{"--config", write("typo.yaml", head+"maxDrian: 5m\n")}, 1, `unknown field "maxDrian"`},
		{"wrong kind", []string{"--config", write("kp.yaml", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n")}, 1, "want apiVersion config.vsplane.io/v1alpha1, kind VsplaneAgentConfiguration"},
		{"invalid value", []string{"--config", write("bad.yaml", head+"controlPlane: [a:1]\nmaxRemovalShare: 0\nipv6: maybe\n")}, 1, `maxRemovalShare 0: must be in (0, 1] (1 disables the hold); ipv6 "maybe"`},
		{"not yaml", []string{"--config", write("junk.yaml", "\x00\x01: [")}, 1, "not a YAML or JSON document"},
		{"missing file", []string{"--config", filepath.Join(dir, "none.yaml")}, 1, "no such file"},
		{"flag beats file, and is checked", []string{"--config", write("ok.yaml", head+"controlPlane: [a:1]\n"), "--reconcile-period=-1s"}, 1, `reconcilePeriod "-1s": must be > 0`},
		{"bad flag", []string{"--reconcile-period=soon"}, 2, `invalid value "soon" for flag -reconcile-period`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := maintest.Run(t, runAsAgent, tc.args, "NODE_NAME=node-a")
			if code != tc.code {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, tc.code, out)
			}
			if !strings.Contains(out, tc.want) || strings.Contains(out, "panic: ") || strings.Contains(out, "[running]") {
				t.Errorf("stderr %q, want it to contain %q (and no panic)", out, tc.want)
			}
		})
	}
}
