package memory

import (
	"fmt"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// defaultSysctls are the values of a fresh network namespace with IPVS.
func defaultSysctls() map[string]int {
	return map[string]int{
		kernel.SysctlIPForward:             0,
		kernel.SysctlVSConntrack:           0,
		kernel.SysctlVSConnReuseMode:       1,
		kernel.SysctlVSExpireNodestConn:    0,
		kernel.SysctlVSExpireQuiescentTmpl: 0,
		kernel.SysctlArpIgnoreAll:          0,
		kernel.SysctlArpAnnounceAll:        0,
		kernel.SysctlIPv6ConfAllForwarding: 0,
		kernel.SysctlRouteLocalnetAll:      0,
		// Debian 12's defaults on a 2-CPU machine.
		kernel.SysctlConntrackMax:                   65536,
		kernel.SysctlConntrackTCPTimeoutEstablished: 432000,
		kernel.SysctlConntrackTCPTimeoutCloseWait:   60,
		kernel.SysctlConntrackTCPBeLiberal:          0,
		kernel.SysctlConntrackUDPTimeout:            30,
		kernel.SysctlConntrackUDPTimeoutStream:      120,
	}
}

// defaultConntrackHashsize goes with defaultSysctls' nf_conntrack_max.
const defaultConntrackHashsize = 16384

// Sysctl is the kernel.Sysctl view of a memory Kernel.
type Sysctl Kernel

var _ kernel.Sysctl = (*Sysctl)(nil)

func (m *Sysctl) k() *Kernel { return (*Kernel)(m) }

// SetSysctl creates or overwrites a sysctl (Set only changes existing
// ones, like /proc/sys).
func (k *Kernel) SetSysctl(name string, value int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.sysctls[name] = value
}

// DeleteSysctl removes a sysctl, e.g. to model a kernel without IPVS.
func (k *Kernel) DeleteSysctl(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.sysctls, name)
}

// SetKernelRelease sets what KernelVersion parses, e.g. "5.4.0-42-generic".
func (k *Kernel) SetKernelRelease(release string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.release = release
}

func (m *Sysctl) Get(name string) (int, error) {
	if err := kernel.ValidateSysctlName(name); err != nil {
		return 0, err
	}
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.sysctls[name]
	if !ok {
		return 0, fmt.Errorf("sysctl %s: %w", name, kernel.ErrNotFound)
	}
	return v, nil
}

func (m *Sysctl) Set(name string, value int) error {
	if err := kernel.ValidateSysctlName(name); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("sysctl.Set"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if _, ok := k.sysctls[name]; !ok {
		return fmt.Errorf("sysctl %s: %w", name, kernel.ErrNotFound)
	}
	k.sysctls[name] = value
	return nil
}

func (m *Sysctl) KernelVersion() (kernel.KernelVersion, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return kernel.ParseKernelVersion(k.release)
}

// SetConntrackHashsizeError makes SetConntrackHashsize fail with err (nil:
// succeed), e.g. as outside the host's network namespace.
func (k *Kernel) SetConntrackHashsizeError(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hashsizeErr = err
}

func (m *Sysctl) ConntrackHashsize() (int, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.hashsize, nil
}

func (m *Sysctl) SetConntrackHashsize(buckets int) error {
	if buckets <= 0 {
		return fmt.Errorf("conntrack hashsize %d: must be positive: %w", buckets, kernel.ErrInvalid)
	}
	k := m.k()
	if err := k.begin("sysctl.SetConntrackHashsize"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	if k.hashsizeErr != nil {
		return k.hashsizeErr
	}
	k.hashsize = buckets
	return nil
}
