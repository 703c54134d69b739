package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/internal/maintest"
)

// runAsControlPlane makes the test binary run main() (see internal/maintest).
const runAsControlPlane = "VSPLANE_CONTROLPLANE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	maintest.Main(runAsControlPlane, "vsplane-controlplane", main)
	os.Exit(m.Run())
}

// TestBadInputExits runs the binary's main with a bad flag or --config
// file: it must exit non-zero with an error naming the flag or the field,
// before it connects anywhere, and never panic.
func TestBadInputExits(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const head = "apiVersion: config.vsplane.io/v1alpha1\nkind: VsplaneConfiguration\n"
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"misspelled field", []string{"--config", write("typo.yaml", head+"ipvs: {schedulr: rr}\n")}, 1, `unknown field "ipvs.schedulr"`},
		{"invalid value", []string{"--config", write("bad.yaml", head+"masqueradeBit: 0\n")}, 1, "masqueradeBit 0: must be 1..31"},
		{"flag beats file, and is checked", []string{"--config", write("ok.yaml", head), "--ack-timeout=-1s"}, 1, `controlPlane.ackTimeout "-1s": must be > 0`},
		{"agent service account", []string{"--agent-service-account=agent"}, 1, `--agent-service-account "agent": want namespace/name`},
		{"missing kubeconfig", []string{"--kubeconfig", filepath.Join(dir, "none")}, 1, "kubernetes client config"},
		{"bad flag", []string{"--min-sync-interval=soon"}, 2, `invalid value "soon" for flag -min-sync-interval`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := maintest.Run(t, runAsControlPlane, tc.args)
			if code != tc.code {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, tc.code, out)
			}
			if !strings.Contains(out, tc.want) || strings.Contains(out, "panic: ") || strings.Contains(out, "[running]") {
				t.Errorf("stderr %q, want it to contain %q (and no panic)", out, tc.want)
			}
		})
	}
}
