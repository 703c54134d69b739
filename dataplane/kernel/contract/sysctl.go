package contract

import (
	"errors"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// SysctlNames are the sysctls RunSysctl reads and writes (and restores);
// the kernel under test must have them.
var SysctlNames = []string{kernel.SysctlIPForward, kernel.SysctlArpIgnoreAll, kernel.SysctlArpAnnounceAll}

// RunSysctl checks a Sysctl implementation.
func RunSysctl(t *testing.T, newSysctl func(t *testing.T) kernel.Sysctl) {
	t.Run("SetGetRoundTrip", func(t *testing.T) {
		s := newSysctl(t)
		for _, name := range SysctlNames {
			orig, err := s.Get(name)
			must(t, err, "get "+name)
			t.Cleanup(func() { _ = s.Set(name, orig) })
			for _, v := range []int{1, 0, 1} {
				must(t, s.Set(name, v), "set "+name)
				got, err := s.Get(name)
				must(t, err, "get "+name)
				if got != v {
					t.Errorf("%s: set %d, got %d", name, v, got)
				}
			}
		}
	})

	t.Run("Missing", func(t *testing.T) {
		s := newSysctl(t)
		_, err := s.Get("net/ipv4/vsplane_no_such_sysctl")
		wantErr(t, err, kernel.ErrNotFound, "get missing")
		wantErr(t, s.Set("net/ipv4/vsplane_no_such_sysctl", 1), kernel.ErrNotFound, "set missing")
		_, err = s.Get("net/ipv4/vsplane_no_such_sysctl")
		wantErr(t, err, kernel.ErrNotFound, "set must not create")
	})

	t.Run("InvalidName", func(t *testing.T) {
		s := newSysctl(t)
		for _, name := range []string{"", "/proc/sys/net/ipv4/ip_forward", "net/../../etc/passwd", "net//ipv4", "net/ipv4/"} {
			_, err := s.Get(name)
			wantErr(t, err, kernel.ErrInvalid, "get "+name)
			wantErr(t, s.Set(name, 1), kernel.ErrInvalid, "set "+name)
		}
	})

	t.Run("ConntrackHashsize", func(t *testing.T) {
		s := newSysctl(t)
		v, err := s.ConntrackHashsize()
		if errors.Is(err, kernel.ErrNotFound) {
			t.Fatalf("conntrack hashsize: %v (load nf_conntrack: the agent's conntrack settings need it)", err)
		}
		must(t, err, "conntrack hashsize")
		if v <= 0 {
			t.Errorf("conntrack hashsize %d", v)
		}
		wantErr(t, s.SetConntrackHashsize(0), kernel.ErrInvalid, "set hashsize 0")
	})

	t.Run("KernelVersion", func(t *testing.T) {
		s := newSysctl(t)
		v, err := s.KernelVersion()
		must(t, err, "kernel version")
		if v.Major < 3 || v.Raw == "" {
			t.Errorf("kernel version %+v: implausible", v)
		}
	})
}
