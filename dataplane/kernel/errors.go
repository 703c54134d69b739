package kernel

import (
	"errors"
	"syscall"
)

// Sentinel errors shared by every implementation. Implementations wrap them
// (test with errors.Is) and, for the Linux ones, also wrap the raw errno so
// logs keep the kernel's own words.
var (
	// ErrExist: the object is already there (kernel EEXIST).
	ErrExist = errors.New("already exists")
	// ErrNotFound: the object (or its parent, e.g. the virtual server of a
	// destination, the device of an address) is not there (ESRCH, ENOENT,
	// ENODEV).
	ErrNotFound = errors.New("not found")
	// ErrBusy: the object is still referenced (EBUSY), e.g. an ipset used by
	// an iptables rule.
	ErrBusy = errors.New("in use")
	// ErrInvalid: the caller passed a value the kernel would reject; the
	// kernel was not called.
	ErrInvalid = errors.New("invalid argument")
	// ErrUnsupported: the kernel lacks the feature (missing module, unknown
	// IPVS scheduler, ...).
	ErrUnsupported = errors.New("not supported by this kernel")
)

// ErrnoSentinel maps a kernel errno to the sentinel it stands for in most
// operations, or nil when it has no sentinel. Callers with operation-specific
// meanings (IPVS add returns ENOENT for an unknown scheduler) map before
// calling this.
func ErrnoSentinel(errno syscall.Errno) error {
	switch errno {
	case syscall.EEXIST:
		return ErrExist
	case syscall.ESRCH, syscall.ENOENT, syscall.ENODEV, syscall.ENXIO, syscall.EADDRNOTAVAIL:
		return ErrNotFound
	case syscall.EBUSY:
		return ErrBusy
	case syscall.EINVAL, syscall.ERANGE:
		return ErrInvalid
	case syscall.EAFNOSUPPORT, syscall.EPROTONOSUPPORT, syscall.EOPNOTSUPP:
		return ErrUnsupported
	}
	return nil
}
