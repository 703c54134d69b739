package kubeenv

import (
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// StartForTest starts an env with default options, fails the test (t.Fatal)
// when it cannot start, including when the binaries are missing, and stops
// it in t.Cleanup. When the test failed, the cleanup first logs the tails of
// the etcd and kube-apiserver logs.
func StartForTest(t testing.TB) *Env {
	t.Helper()
	return StartForTestWith(t, Options{})
}

// StartForTestWith is StartForTest with options (a test logger is set if
// opts has none).
func StartForTestWith(t testing.TB, opts Options) *Env {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	env, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubeenv logs after failure:\n%s", env.LogTail(30))
		}
		if err := env.Stop(); err != nil {
			t.Errorf("kubeenv stop: %v", err)
		}
	})
	t.Logf("kubeenv up in %v at %s (dir %s)", env.StartupDuration.Round(time.Millisecond), env.Host, env.Dir)
	return env
}
