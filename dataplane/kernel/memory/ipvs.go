package memory

import (
	"fmt"
	"slices"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// DefaultSchedulers are the schedulers of a stock Linux kernel.
var DefaultSchedulers = []string{"dh", "fo", "lblc", "lblcr", "lc", "mh", "nq", "ovf", "rr", "sed", "sh", "twos", "wlc", "wrr"}

// Kernel defaults of the IPVS timeouts.
const (
	DefaultTimeoutTCP    = 900 * time.Second
	DefaultTimeoutTCPFin = 120 * time.Second
	DefaultTimeoutUDP    = 300 * time.Second
)

type ipvsState struct {
	servers    map[kernel.VirtualServerKey]*vsEntry
	timeouts   kernel.Timeouts
	schedulers map[string]bool
}

type vsEntry struct {
	vs    kernel.VirtualServer
	dests map[kernel.DestinationKey]kernel.Destination
}

func (s *ipvsState) init() {
	s.servers = map[kernel.VirtualServerKey]*vsEntry{}
	s.timeouts = kernel.Timeouts{TCP: DefaultTimeoutTCP, TCPFin: DefaultTimeoutTCPFin, UDP: DefaultTimeoutUDP}
	s.schedulers = map[string]bool{}
	for _, name := range DefaultSchedulers {
		s.schedulers[name] = true
	}
}

// IPVS is the kernel.IPVS view of a memory Kernel.
type IPVS Kernel

var (
	_ kernel.IPVS                  = (*IPVS)(nil)
	_ kernel.DestinationDumper     = (*IPVS)(nil)
	_ kernel.VirtualServerDigester = (*IPVS)(nil)
)

func (m *IPVS) k() *Kernel { return (*Kernel)(m) }

// SetSchedulers replaces the schedulers the simulated kernel offers.
func (k *Kernel) SetSchedulers(names []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ipvs.schedulers = map[string]bool{}
	for _, n := range names {
		k.ipvs.schedulers[n] = true
	}
}

// SetConnections sets the connection counters the kernel would report for a
// destination, to simulate traffic (e.g. graceful termination). It returns
// kernel.ErrNotFound when the destination does not exist.
func (k *Kernel) SetConnections(key kernel.VirtualServerKey, d kernel.DestinationKey, active, inactive uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.ipvs.servers[key.Normalize()]
	if !ok {
		return fmt.Errorf("virtual server %v: %w", key, kernel.ErrNotFound)
	}
	d.Address = d.Address.Unmap()
	dst, ok := e.dests[d]
	if !ok {
		return fmt.Errorf("destination %v of %v: %w", d, key, kernel.ErrNotFound)
	}
	dst.ActiveConn, dst.InactiveConn = active, inactive
	e.dests[d] = dst
	return nil
}

func (m *IPVS) ListVirtualServers() ([]kernel.VirtualServer, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]kernel.VirtualServer, 0, len(k.ipvs.servers))
	for _, e := range k.ipvs.servers {
		out = append(out, e.vs)
	}
	slices.SortFunc(out, func(a, b kernel.VirtualServer) int { return a.Key.Compare(b.Key) })
	return out, nil
}

// DigestVirtualServers implements kernel.VirtualServerDigester.
func (m *IPVS) DigestVirtualServers() (uint64, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	var d uint64
	for _, e := range k.ipvs.servers {
		d += e.vs.Digest()
	}
	return d, nil
}

func (m *IPVS) GetVirtualServer(key kernel.VirtualServerKey) (kernel.VirtualServer, error) {
	if err := key.Validate(); err != nil {
		return kernel.VirtualServer{}, err
	}
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.ipvs.servers[key.Normalize()]
	if !ok {
		return kernel.VirtualServer{}, fmt.Errorf("get virtual server %v: %w", key, kernel.ErrNotFound)
	}
	return e.vs, nil
}

func (m *IPVS) addVirtualServer(vs kernel.VirtualServer) error {
	if err := vs.Validate(); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipvs.AddVirtualServer"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	vs = vs.Normalize()
	if _, ok := k.ipvs.servers[vs.Key]; ok {
		return fmt.Errorf("add virtual server %v: %w", vs.Key, kernel.ErrExist)
	}
	if !k.ipvs.schedulers[vs.Scheduler] {
		return fmt.Errorf("add virtual server %v: scheduler %q: %w", vs.Key, vs.Scheduler, kernel.ErrUnsupported)
	}
	k.ipvs.servers[vs.Key] = &vsEntry{vs: vs, dests: map[kernel.DestinationKey]kernel.Destination{}}
	return nil
}

func (m *IPVS) updateVirtualServer(vs kernel.VirtualServer) error {
	if err := vs.Validate(); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipvs.UpdateVirtualServer"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	vs = vs.Normalize()
	e, ok := k.ipvs.servers[vs.Key]
	if !ok {
		return fmt.Errorf("update virtual server %v: %w", vs.Key, kernel.ErrNotFound)
	}
	if !k.ipvs.schedulers[vs.Scheduler] {
		return fmt.Errorf("update virtual server %v: scheduler %q: %w", vs.Key, vs.Scheduler, kernel.ErrUnsupported)
	}
	e.vs = vs
	return nil
}

func (m *IPVS) deleteVirtualServer(key kernel.VirtualServerKey) error {
	if err := key.Validate(); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipvs.DeleteVirtualServer"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	key = key.Normalize()
	if _, ok := k.ipvs.servers[key]; !ok {
		return fmt.Errorf("delete virtual server %v: %w", key, kernel.ErrNotFound)
	}
	delete(k.ipvs.servers, key)
	return nil
}

func (m *IPVS) ListDestinations(key kernel.VirtualServerKey) ([]kernel.Destination, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.ipvs.servers[key.Normalize()]
	if !ok {
		return nil, fmt.Errorf("list destinations of %v: %w", key, kernel.ErrNotFound)
	}
	return e.sortedDests(), nil
}

// sortedDests returns a copy of e's destinations sorted by key, the order
// reads return them in.
func (e *vsEntry) sortedDests() []kernel.Destination {
	out := make([]kernel.Destination, 0, len(e.dests))
	for _, d := range e.dests {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b kernel.Destination) int { return a.Key().Compare(b.Key()) })
	return out
}

// DumpDestinations implements kernel.DestinationDumper. Like the Linux
// kernel's dump, it leaves out firewall-mark servers.
func (m *IPVS) DumpDestinations() (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[kernel.VirtualServerKey][]kernel.Destination, len(k.ipvs.servers))
	for key, e := range k.ipvs.servers {
		if key.FWMark != 0 {
			continue
		}
		out[key] = e.sortedDests()
	}
	return out, nil
}

// destOp runs the shared checks of the destination mutators and returns the
// server entry with k locked (caller unlocks) or an error with k unlocked.
func (m *IPVS) destOp(op string, key kernel.VirtualServerKey, d kernel.Destination) (*vsEntry, kernel.Destination, error) {
	if err := key.Validate(); err != nil {
		return nil, d, err
	}
	key = key.Normalize()
	if err := d.Validate(key.Family); err != nil {
		return nil, d, err
	}
	k := m.k()
	if err := k.begin(op); err != nil {
		return nil, d, err
	}
	e, ok := k.ipvs.servers[key]
	if !ok {
		k.mu.Unlock()
		return nil, d, fmt.Errorf("%s %v: virtual server %v: %w", op, d.Key(), key, kernel.ErrNotFound)
	}
	d.Address = d.Address.Unmap()
	return e, d, nil
}

func (m *IPVS) addDestination(key kernel.VirtualServerKey, d kernel.Destination) error {
	e, d, err := m.destOp("ipvs.AddDestination", key, d)
	if err != nil {
		return err
	}
	defer m.k().mu.Unlock()
	if _, ok := e.dests[d.Key()]; ok {
		return fmt.Errorf("add destination %v to %v: %w", d.Key(), key, kernel.ErrExist)
	}
	d.ActiveConn, d.InactiveConn = 0, 0
	e.dests[d.Key()] = d
	return nil
}

func (m *IPVS) updateDestination(key kernel.VirtualServerKey, d kernel.Destination) error {
	e, d, err := m.destOp("ipvs.UpdateDestination", key, d)
	if err != nil {
		return err
	}
	defer m.k().mu.Unlock()
	old, ok := e.dests[d.Key()]
	if !ok {
		return fmt.Errorf("update destination %v of %v: %w", d.Key(), key, kernel.ErrNotFound)
	}
	old.Weight, old.Forward = d.Weight, d.Forward
	e.dests[d.Key()] = old
	return nil
}

func (m *IPVS) deleteDestination(key kernel.VirtualServerKey, dk kernel.DestinationKey) error {
	e, d, err := m.destOp("ipvs.DeleteDestination", key, kernel.Destination{Address: dk.Address, Port: dk.Port})
	if err != nil {
		return err
	}
	defer m.k().mu.Unlock()
	if _, ok := e.dests[d.Key()]; !ok {
		return fmt.Errorf("delete destination %v of %v: %w", d.Key(), key, kernel.ErrNotFound)
	}
	delete(e.dests, d.Key())
	return nil
}

// Apply performs ops one by one (see kernel.IPVS.Apply), so fault hooks
// and call counters see every op, under its kind's name
// ("ipvs.AddVirtualServer", ...).
func (m *IPVS) Apply(ops []kernel.IPVSOp) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		key := op.Server.Key
		switch op.Kind {
		case kernel.AddVirtualServer:
			errs[i] = m.addVirtualServer(op.Server)
		case kernel.UpdateVirtualServer:
			errs[i] = m.updateVirtualServer(op.Server)
		case kernel.DeleteVirtualServer:
			errs[i] = m.deleteVirtualServer(key)
		case kernel.AddDestination:
			errs[i] = m.addDestination(key, op.Destination)
		case kernel.UpdateDestination:
			errs[i] = m.updateDestination(key, op.Destination)
		case kernel.DeleteDestination:
			errs[i] = m.deleteDestination(key, op.Destination.Key())
		default:
			errs[i] = fmt.Errorf("%v: %w", op.Kind, kernel.ErrInvalid)
		}
	}
	return errs
}

func (m *IPVS) SetTimeouts(t kernel.Timeouts) error {
	if err := t.Validate(); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("ipvs.SetTimeouts"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	cur := &k.ipvs.timeouts
	for _, p := range []struct{ dst, src *time.Duration }{{&cur.TCP, &t.TCP}, {&cur.TCPFin, &t.TCPFin}, {&cur.UDP, &t.UDP}} {
		if *p.src != 0 {
			*p.dst = *p.src
		}
	}
	return nil
}

func (m *IPVS) Timeouts() (kernel.Timeouts, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ipvs.timeouts, nil
}

func (m *IPVS) Schedulers() ([]string, error) {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return sortedKeys(k.ipvs.schedulers), nil
}
