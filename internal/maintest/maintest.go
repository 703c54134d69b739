// Package maintest runs a command's main in a child process of its test
// binary, for tests of what a binary does with bad input: its exit code and
// what it writes to stderr. Both planes' commands use it.
//
// The test's TestMain calls Main first; a test calls Run with the command's
// arguments, which starts the test binary again with env set, and Main
// there runs main with those arguments instead of the tests.
package maintest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"testing"
)

// Main runs main with the arguments after "--" (as the command name) and
// exits 0 when the variable env is "1" (main exits itself on an error);
// otherwise it returns, and TestMain runs the tests.
func Main(env, name string, main func()) {
	if os.Getenv(env) != "1" {
		return
	}
	for i, a := range os.Args {
		if a == "--" {
			os.Args = append([]string{name}, os.Args[i+1:]...)
			break
		}
	}
	main()
	os.Exit(0)
}

// Run runs the test binary's main (see Main) with args and extra
// environment variables, and returns its exit code and stderr. A main that
// cannot be started fails the test.
func Run(t *testing.T, env string, args []string, environ ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(append(os.Environ(), env+"=1"), environ...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("running main: %v", err)
	return 0, ""
}
