package linux_test

import (
	"github.com/vishvananda/netlink"

	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// The tests change the kernel, so the test binary re-executes itself in a
// fresh network namespace (CLONE_NEWNET) and the real tests only run there.
// Failing to get one is a test failure, never a skip.
const (
	netnsEnv       = "VSPLANE_KERNEL_TEST_IN_NETNS"
	parentNetnsEnv = "VSPLANE_KERNEL_TEST_PARENT_NETNS"
)

// netnsErr is why the tests could not be placed in a private namespace.
var netnsErr error

func TestMain(m *testing.M) {
	if os.Getenv(netnsEnv) == "1" {
		netnsErr = checkPrivateNetns()
		os.Exit(m.Run())
	}
	code, err := reexecInNewNetns()
	if err == nil {
		os.Exit(code)
	}
	// Run anyway so every kernel test fails with the reason.
	netnsErr = err
	os.Exit(m.Run())
}

func reexecInNewNetns() (int, error) {
	if os.Geteuid() != 0 {
		return 0, errors.New("the Linux kernel tests need root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create a private network namespace; run `go test` as root")
	}
	self, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("find test binary: %w", err)
	}
	parentNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return 0, fmt.Errorf("read own network namespace: %w", err)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), netnsEnv+"=1", parentNetnsEnv+"="+parentNS)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee) && ee.Exited():
		return ee.ExitCode(), nil
	case errors.As(err, &ee):
		return 0, fmt.Errorf("test child in private network namespace died: %v", err)
	}
	return 0, fmt.Errorf("start test binary in a new network namespace (clone CLONE_NEWNET): %w", err)
}

// checkPrivateNetns refuses to run in the namespace the tests were started
// from (PID 1's may not be readable in a container).
func checkPrivateNetns() error {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("read own network namespace: %w", err)
	}
	parent := os.Getenv(parentNetnsEnv)
	if parent == "" || self == parent {
		return fmt.Errorf("refusing to run kernel tests: namespace %s is not a fresh one (parent %q)", self, parent)
	}
	// A new namespace starts with lo down, and without it the kernel has no
	// local routing table: IPVS then rejects IPv4 masq destinations with
	// EINVAL. Every real node has lo up.
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in the private namespace: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring lo up in the private namespace: %w", err)
	}
	return nil
}

// requireNetns fails t unless the test runs in its private namespace.
func requireNetns(t *testing.T) {
	t.Helper()
	if netnsErr != nil {
		t.Fatalf("cannot run real-kernel test: %v", netnsErr)
	}
}
