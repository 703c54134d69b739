package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runAsControlPlane makes the test binary run main() with the arguments
// after "--" when this variable is set (see TestBadInputExits).
const runAsControlPlane = "VSPLANE_CONTROLPLANE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runAsControlPlane) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"vsplane-controlplane"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
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
			cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, tc.args...)...)
			cmd.Env = append(os.Environ(), runAsControlPlane+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit: %v, want code %d; stderr:\n%s", err, tc.code, stderr.String())
			}
			out := stderr.String()
			if !strings.Contains(out, tc.want) || strings.Contains(out, "panic: ") || strings.Contains(out, "[running]") {
				t.Errorf("stderr %q, want it to contain %q (and no panic)", out, tc.want)
			}
		})
	}
}
