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

// runAsAgent makes the test binary run main() with the arguments after
// "--" when this variable is set (see TestBadConfigExits).
const runAsAgent = "VSPLANE_AGENT_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runAsAgent) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"vsplane-agent"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
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
			cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, tc.args...)...)
			cmd.Env = append(os.Environ(), runAsAgent+"=1", "NODE_NAME=node-a")
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
