package linux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/moby/ipvs"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// IPVSOptions configures NewIPVS.
type IPVSOptions struct {
	// ModulesDir is /lib/modules (default) and ProcModules /proc/modules
	// (default): where Schedulers looks for ip_vs_<scheduler> modules.
	ModulesDir  string
	ProcModules string
	Logger      *zap.Logger
}

// IPVS reads the kernel's IPVS table and sets its timeouts through
// moby/ipvs, and writes it in batches on its own socket (ipvs_batch.go);
// the whole-table reads of a full pass use that socket too (ipvs_list.go)
// and /proc/net/ip_vs (ipvs_proc.go). moby handles are not goroutine-safe,
// so every call holds mu.
type IPVS struct {
	mu sync.Mutex
	h  *ipvs.Handle
	// batch carries Apply: many writes per syscall.
	batch *ipvsBatcher
	// proc reads every destination at once (ipvs_proc.go); nil without it.
	proc *procIPVS
	// listed is how many servers the last list held (sizes the next).
	listed int
	opts   IPVSOptions
	log    *zap.Logger
}

var (
	_ kernel.IPVS                  = (*IPVS)(nil)
	_ kernel.DestinationDumper     = (*IPVS)(nil)
	_ kernel.VirtualServerDigester = (*IPVS)(nil)
)

// probeMark is the firewall mark of the throw-away virtual server NewIPVS
// creates to prove IPVS works. A fwmark service only sees packets carrying
// that mark, so it cannot capture real traffic while it exists.
const probeMark = 0x7f5eed01

// NewIPVS opens an IPVS handle in the caller's network namespace and
// verifies IPVS really works: moby/ipvs does not fail when the ip_vs module
// is missing, so like kube-proxy it adds a dummy virtual server and reads
// it back.
func NewIPVS(opts IPVSOptions) (*IPVS, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	h, err := ipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("ipvs: open netlink handle (is the ip_vs kernel module available? try `modprobe ip_vs`): %w", err)
	}
	v := &IPVS{h: h, opts: opts, log: opts.Logger}
	if err := v.probe(); err != nil {
		h.Close()
		return nil, err
	}
	if v.batch, err = newIPVSBatcher(); err != nil {
		h.Close()
		return nil, err
	}
	v.proc = openProcIPVS()
	return v, nil
}

func (v *IPVS) probe() error {
	svc := &ipvs.Service{FWMark: probeMark, AddressFamily: unix.AF_INET, SchedName: "rr", Netmask: 0xffffffff}
	fail := func(step string, err error) error {
		return fmt.Errorf("ipvs does not work in this kernel (is the ip_vs kernel module available? try `modprobe ip_vs`): %s: %v: %w", step, err, kernel.ErrUnsupported)
	}
	if err := v.h.NewService(svc); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fail("add probe virtual server", err)
	}
	got, err := v.h.GetService(svc)
	if err != nil {
		return fail("read back probe virtual server", err)
	}
	if got.FWMark != probeMark {
		return fail("read back probe virtual server", fmt.Errorf("got fwmark %#x", got.FWMark))
	}
	if err := v.h.DelService(svc); err != nil {
		return fail("delete probe virtual server", err)
	}
	return nil
}

// Close releases the netlink socket.
func (v *IPVS) Close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.h.Close()
	v.batch.close()
	v.proc.close()
}

// Apply sends ops in batches of many netlink requests per syscall (see
// kernel.IPVS.Apply).
func (v *IPVS) Apply(ops []kernel.IPVSOp) []error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.batch.apply(ops)
}

// ipvsError maps an IPVS errno to a sentinel. enoent is what ENOENT means
// for this operation: a missing destination, or an unknown scheduler on
// service add/update.
func ipvsError(what string, err error, enoent error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", what, err)
	}
	s := kernel.ErrnoSentinel(errno)
	if errno == syscall.ENOENT {
		s = enoent
	}
	if s == nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w (%w)", what, s, errno)
}

func afOf(f kernel.Family) uint16 {
	if f == kernel.FamilyIPv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// netmaskToKernel: IPv4 netmasks travel as the mask in network byte order,
// read by moby as a native integer; IPv6 ones as a prefix length.
func netmaskToKernel(f kernel.Family, bitsLen uint8) uint32 {
	if f == kernel.FamilyIPv6 {
		return uint32(bitsLen)
	}
	mask := net.CIDRMask(int(bitsLen), 32)
	return binary.NativeEndian.Uint32(mask)
}

func netmaskFromKernel(f kernel.Family, v uint32) uint8 {
	if f == kernel.FamilyIPv6 {
		return uint8(v)
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return uint8(bits.LeadingZeros32(^binary.BigEndian.Uint32(b[:])))
}

func toService(k kernel.VirtualServerKey) *ipvs.Service {
	k = k.Normalize()
	s := &ipvs.Service{AddressFamily: afOf(k.Family), FWMark: k.FWMark}
	if k.FWMark == 0 {
		s.Address = net.IP(k.Address.AsSlice())
		s.Protocol = uint16(k.Protocol)
		s.Port = k.Port
	}
	return s
}

func fromService(s *ipvs.Service) (kernel.VirtualServer, error) {
	fam := kernel.FamilyIPv4
	if s.AddressFamily == unix.AF_INET6 {
		fam = kernel.FamilyIPv6
	}
	var key kernel.VirtualServerKey
	if s.FWMark != 0 {
		key = kernel.FWMarkKey(fam, s.FWMark)
	} else {
		a, ok := netip.AddrFromSlice(s.Address)
		if !ok {
			return kernel.VirtualServer{}, fmt.Errorf("ipvs: kernel returned service with bad address %v", s.Address)
		}
		key = kernel.AddrKey(a, kernel.Protocol(s.Protocol), s.Port)
	}
	vs := kernel.VirtualServer{
		Key:       key,
		Scheduler: s.SchedName,
		Flags:     kernel.ServiceFlags(s.Flags),
		Timeout:   s.Timeout,
		Netmask:   netmaskFromKernel(fam, s.Netmask),
	}
	return vs.Normalize(), nil
}

func (v *IPVS) ListVirtualServers() ([]kernel.VirtualServer, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out, err := v.batch.listServices(v.listed)
	if err != nil {
		return nil, ipvsError("ipvs: list virtual servers", err, kernel.ErrNotFound)
	}
	v.listed = len(out)
	return out, nil
}

// DigestVirtualServers implements kernel.VirtualServerDigester: one dump,
// nothing listed or sorted.
func (v *IPVS) DigestVirtualServers() (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.batch.digestServices()
	if err != nil {
		return 0, ipvsError("ipvs: digest virtual servers", err, kernel.ErrNotFound)
	}
	return d, nil
}

func (v *IPVS) GetVirtualServer(key kernel.VirtualServerKey) (kernel.VirtualServer, error) {
	if err := key.Validate(); err != nil {
		return kernel.VirtualServer{}, err
	}
	v.mu.Lock()
	s, err := v.h.GetService(toService(key))
	v.mu.Unlock()
	if err != nil {
		return kernel.VirtualServer{}, ipvsError("ipvs: get virtual server "+key.String(), err, kernel.ErrNotFound)
	}
	return fromService(s)
}

func (v *IPVS) ListDestinations(key kernel.VirtualServerKey) ([]kernel.Destination, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	key = key.Normalize()
	v.mu.Lock()
	defer v.mu.Unlock()
	out, err := v.batch.listDestinations(key)
	if err != nil {
		return nil, ipvsError("ipvs: list destinations of "+key.String(), err, kernel.ErrNotFound)
	}
	if len(out) == 0 {
		// The kernel dumps nothing, without error, for a missing server.
		if _, err := v.h.GetService(toService(key)); err != nil {
			return nil, ipvsError("ipvs: list destinations of "+key.String(), err, kernel.ErrNotFound)
		}
		return []kernel.Destination{}, nil
	}
	sortDestinations(out)
	return out, nil
}

func (v *IPVS) SetTimeouts(t kernel.Timeouts) error {
	if err := t.Validate(); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	// The kernel leaves zero fields unchanged.
	if err := v.h.SetConfig(&ipvs.Config{TimeoutTCP: t.TCP, TimeoutTCPFin: t.TCPFin, TimeoutUDP: t.UDP}); err != nil {
		return ipvsError("ipvs: set timeouts", err, kernel.ErrNotFound)
	}
	return nil
}

func (v *IPVS) Timeouts() (kernel.Timeouts, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	c, err := v.h.GetConfig()
	if err != nil {
		return kernel.Timeouts{}, ipvsError("ipvs: read timeouts", err, kernel.ErrNotFound)
	}
	return kernel.Timeouts{TCP: c.TimeoutTCP, TCPFin: c.TimeoutTCPFin, UDP: c.TimeoutUDP}, nil
}

// Schedulers reports the ip_vs_<scheduler> modules that are loaded, built
// in, or installed for the running kernel (installed ones load on first
// use), like kube-proxy's module checks.
// When no module information is readable (a container without
// /lib/modules) or it lists none, each scheduler is tried on a throw-away
// firewall-mark virtual server instead, which also loads its module.
func (v *IPVS) Schedulers() ([]string, error) {
	names, err := AvailableSchedulers(v.opts.ModulesDir, v.opts.ProcModules)
	if err == nil && len(names) > 0 {
		return names, nil
	}
	v.log.Info("ipvs: no scheduler modules found, probing schedulers", zap.Error(err))
	v.mu.Lock()
	defer v.mu.Unlock()
	names = names[:0]
	for _, sched := range ipvsSchedulers {
		svc := &ipvs.Service{FWMark: probeMark, AddressFamily: unix.AF_INET, SchedName: sched, Netmask: 0xffffffff}
		if err := v.h.NewService(svc); err != nil {
			continue
		}
		names = append(names, sched)
		if err := v.h.DelService(svc); err != nil {
			return nil, ipvsError("ipvs: delete scheduler probe", err, kernel.ErrNotFound)
		}
	}
	return names, nil
}
