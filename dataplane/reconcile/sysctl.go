package reconcile

import (
	"fmt"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/wire"
)

// Node settings in the kernel: sysctls and the IPVS timeouts.
//
//   - Update (syncNodeSettings, on the first Apply, when node/settings
//     changes and in every full reconcile): each sysctl kube-proxy's IPVS
//     mode needs is set when it differs (conn_reuse_mode=0 only before
//     kernel 5.9, the ARP ones with strict_arp); the IPVS timeouts the
//     settings name are set when they differ (0: left alone).
//   - Delete / Prune: none; nothing is ever reset.
//   - Status: a failure is blamed on node/settings (an error no resource
//     owns while there is none).

func (p *pass) syncNodeSettings() {
	var names []string
	if _, ok := p.desired.res[SettingsResource]; ok {
		names = []string{SettingsResource}
	}
	sc := p.k.Sysctl
	type kv struct {
		name string
		val  int
	}
	want := []kv{
		{kernel.SysctlVSConntrack, 1},
		{kernel.SysctlVSExpireNodestConn, 1},
		{kernel.SysctlVSExpireQuiescentTmpl, 1},
		{kernel.SysctlIPForward, 1},
	}
	if v, err := sc.KernelVersion(); err != nil {
		p.fail(names, "read kernel version", err)
	} else if !v.AtLeast(5, 9) {
		// Kernels before 5.9 drop the first packets of a reused connection
		// to a deleted real server with conn_reuse_mode=1 (kubernetes#81775).
		want = append(want, kv{kernel.SysctlVSConnReuseMode, 0})
	}
	if p.s.strictARP {
		want = append(want, kv{kernel.SysctlArpIgnoreAll, 1}, kv{kernel.SysctlArpAnnounceAll, 2})
	}
	for _, w := range want {
		cur, err := sc.Get(w.name)
		if err != nil {
			p.fail(names, "sysctl "+w.name, err)
			continue
		}
		if cur != w.val {
			p.count(wire.OpSysctl)
			if err := sc.Set(w.name, w.val); err != nil {
				p.fail(names, fmt.Sprintf("sysctl %s=%d", w.name, w.val), err)
			}
		}
	}
	p.syncTimeouts(names)
	p.syncConntrack(names)
}

// syncConntrack applies the conntrack settings as kube-proxy's
// setupConntrack does: nf_conntrack_max = max(max_per_core x CPUs, min)
// when max_per_core is set, the table's hashsize raised to a quarter of it
// (never lowered), the timeouts that are set, and tcp_be_liberal=1 when
// asked (never back to 0). Each is written only when it differs; a write
// the kernel refuses fails node/settings with its message, the others
// still apply.
func (p *pass) syncConntrack(names []string) {
	ct := p.s.conntrack
	sc := p.k.Sysctl
	set := func(name string, val int) bool {
		cur, err := sc.Get(name)
		if err != nil {
			p.fail(names, "sysctl "+name, err)
			return false
		}
		if cur == val {
			return true
		}
		p.count(wire.OpSysctl)
		if err := sc.Set(name, val); err != nil {
			hint := ""
			if name == kernel.SysctlConntrackMax {
				hint = " (host-wide: writable only from the host's network namespace)"
			}
			p.fail(names, fmt.Sprintf("sysctl %s=%d%s", name, val, hint), err)
			return false
		}
		return true
	}
	if ct.maxPerCore > 0 {
		limit := min(max(ct.maxPerCore*p.numCPU, ct.min), maxSysctlInt)
		if set(kernel.SysctlConntrackMax, limit) {
			if buckets, err := sc.ConntrackHashsize(); err != nil {
				p.fail(names, "read conntrack hashsize", err)
			} else if buckets < limit/4 {
				p.count(wire.OpSysctl)
				if err := sc.SetConntrackHashsize(limit / 4); err != nil {
					p.fail(names, fmt.Sprintf("conntrack hashsize=%d", limit/4), err)
				}
			}
		}
	}
	for _, t := range []struct {
		name string
		val  int
	}{
		{kernel.SysctlConntrackTCPTimeoutEstablished, ct.tcpEstablished},
		{kernel.SysctlConntrackTCPTimeoutCloseWait, ct.tcpCloseWait},
		{kernel.SysctlConntrackUDPTimeout, ct.udp},
		{kernel.SysctlConntrackUDPTimeoutStream, ct.udpStream},
	} {
		if t.val > 0 {
			set(t.name, t.val)
		}
	}
	if ct.tcpBeLiberal {
		set(kernel.SysctlConntrackTCPBeLiberal, 1)
	}
}

// syncTimeouts sets the IPVS timeouts the settings name (non-zero) that
// differ from the kernel's.
func (p *pass) syncTimeouts(names []string) {
	t := p.s.timeouts
	if t == (kernel.Timeouts{}) {
		return
	}
	cur, err := p.k.IPVS.Timeouts()
	if err != nil {
		p.fail(names, "read ipvs timeouts", err)
		return
	}
	var set kernel.Timeouts
	if t.TCP != 0 && t.TCP != cur.TCP {
		set.TCP = t.TCP
	}
	if t.TCPFin != 0 && t.TCPFin != cur.TCPFin {
		set.TCPFin = t.TCPFin
	}
	if t.UDP != 0 && t.UDP != cur.UDP {
		set.UDP = t.UDP
	}
	if set != (kernel.Timeouts{}) {
		p.count(wire.OpSetTimeouts)
		if err := p.k.IPVS.SetTimeouts(set); err != nil {
			p.fail(names, "set ipvs timeouts", err)
		}
	}
}
