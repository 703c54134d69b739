package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// DefaultSysctlRoot is where the running kernel exposes its sysctls.
const DefaultSysctlRoot = "/proc/sys"

// Sysctl reads and writes files under a /proc/sys-like root. Values under
// net/ belong to the network namespace of the calling process.
type Sysctl struct {
	root string
	// hashsize is the nf_conntrack module's hashsize parameter file.
	hashsize string
}

// DefaultConntrackHashsize is the nf_conntrack module's hashsize parameter.
const DefaultConntrackHashsize = "/sys/module/nf_conntrack/parameters/hashsize"

var _ kernel.Sysctl = (*Sysctl)(nil)

// NewSysctl uses root ("" means /proc/sys); tests point it at a directory,
// which then also holds the hashsize parameter (as sys/module/nf_conntrack/
// parameters/hashsize under it).
func NewSysctl(root string) *Sysctl {
	if root == "" || root == DefaultSysctlRoot {
		return &Sysctl{root: DefaultSysctlRoot, hashsize: DefaultConntrackHashsize}
	}
	return &Sysctl{root: root, hashsize: filepath.Join(root, filepath.FromSlash(DefaultConntrackHashsize))}
}

func (s *Sysctl) path(name string) (string, error) {
	if err := kernel.ValidateSysctlName(name); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

func sysctlErr(op, name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sysctl %s %s: %w", op, name, kernel.ErrNotFound)
	}
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("sysctl %s %s: %v (need root in the target network namespace)", op, name, err)
	}
	return fmt.Errorf("sysctl %s %s: %w", op, name, err)
}

func (s *Sysctl) Get(name string) (int, error) {
	p, err := s.path(name)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, sysctlErr("read", name, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: value %q is not an integer: %w", name, strings.TrimSpace(string(b)), kernel.ErrInvalid)
	}
	return v, nil
}

func (s *Sysctl) Set(name string, value int) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	return writeInt(p, name, value)
}

// ConntrackHashsize reads the nf_conntrack module's hashsize.
func (s *Sysctl) ConntrackHashsize() (int, error) {
	b, err := os.ReadFile(s.hashsize)
	if err != nil {
		return 0, sysctlErr("read", s.hashsize, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%s: value %q is not a positive integer: %w", s.hashsize, strings.TrimSpace(string(b)), kernel.ErrInvalid)
	}
	return v, nil
}

// SetConntrackHashsize writes the nf_conntrack module's hashsize.
func (s *Sysctl) SetConntrackHashsize(buckets int) error {
	if buckets <= 0 {
		return fmt.Errorf("conntrack hashsize %d: must be positive: %w", buckets, kernel.ErrInvalid)
	}
	if err := writeInt(s.hashsize, s.hashsize, buckets); err != nil {
		// The kernel answers EOPNOTSUPP outside the initial network
		// namespace, EROFS on a read-only /sys.
		return fmt.Errorf("%w (host-wide: writable only from the host's network namespace with /sys mounted read-write)", err)
	}
	return nil
}

// writeInt writes value to the existing file p (name for errors).
func writeInt(p, name string, value int) error {
	// No O_CREATE: a sysctl the kernel lacks must not appear as a new file.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return sysctlErr("write", name, err)
	}
	_, werr := f.WriteString(strconv.Itoa(value) + "\n")
	cerr := f.Close()
	if werr != nil {
		return sysctlErr("write", name, werr)
	}
	if cerr != nil {
		return sysctlErr("write", name, cerr)
	}
	return nil
}

// KernelVersion parses <root>/kernel/osrelease.
func (s *Sysctl) KernelVersion() (kernel.KernelVersion, error) {
	b, err := os.ReadFile(filepath.Join(s.root, "kernel", "osrelease"))
	if err != nil {
		return kernel.KernelVersion{}, sysctlErr("read", "kernel/osrelease", err)
	}
	return kernel.ParseKernelVersion(string(b))
}
