package linux_test

import (
	"os"
	"testing"

	"github.com/vsplane/vsplane/internal/netnstest"
)

// The tests change the kernel, so the test binary re-executes itself in a
// fresh network namespace (CLONE_NEWNET) and the real tests only run there.
// Failing to get one is a test failure, never a skip: netnsErr says why.
var netnsErr error

func TestMain(m *testing.M) {
	netnsErr = netnstest.Reexec("VSPLANE_KERNEL_TEST_IN_NETNS")
	os.Exit(m.Run())
}

// requireNetns fails t unless the test runs in its private namespace.
func requireNetns(t *testing.T) {
	t.Helper()
	if netnsErr != nil {
		t.Fatalf("cannot run real-kernel test: %v", netnsErr)
	}
}
