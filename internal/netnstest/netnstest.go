// Package netnstest runs a package's kernel tests in a fresh network
// namespace of this machine, so they can change iptables, ipsets, IPVS and
// links without touching the host's. TestMain calls Reexec: the test binary
// starts itself again with CLONE_NEWNET and exits with the child's code; in
// the child, Reexec returns nil and the tests run. When no namespace can be
// had, Reexec returns why and TestMain runs the tests anyway: each kernel
// test then fails with that reason (never a skip).
package netnstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/vishvananda/netlink"
)

// Reexec is called first in TestMain; env names the variable that marks the
// child (one per package: "VSPLANE_<PKG>_TEST_IN_NETNS"). It returns nil in
// the child, does not return in the parent once the child ran, and returns
// an error when the child cannot be started (not root, no CLONE_NEWNET) or
// died of a signal, or when the child is not in a namespace of its own.
func Reexec(env string) error {
	parentEnv := env + "_PARENT"
	if os.Getenv(env) == "1" {
		return enter(os.Getenv(parentEnv))
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to create a private network namespace; run `go test` as root")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the test binary: %w", err)
	}
	parent, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("read own network namespace: %w", err)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), env+"=1", parentEnv+"="+parent)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &ee) && ee.Exited():
		os.Exit(ee.ExitCode())
	case errors.As(err, &ee):
		return fmt.Errorf("the test child in a private network namespace died: %v", err)
	}
	return fmt.Errorf("start the test binary in a new network namespace (clone CLONE_NEWNET): %w", err)
}

// enter checks, in the child, that its namespace is not the parent's, and
// brings lo up: a new namespace starts with lo down, and without it there
// is no 127.0.0.1 and no local routing table (IPVS then rejects IPv4 masq
// destinations with EINVAL). Every real node has lo up.
func enter(parent string) error {
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("read own network namespace: %w", err)
	}
	if parent == "" || self == parent {
		return fmt.Errorf("refusing to run kernel tests: namespace %s is not a fresh one (parent %q)", self, parent)
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("bring up lo in the test's network namespace: %w", err)
	}
	return nil
}
