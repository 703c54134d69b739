package linux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"unsafe"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Fingerprints of iptables tables, read without running a tool: an
// iptables-save is a process start (~40 ms of CPU each in the TCG test
// bed, two per family per full pass), a fingerprint one or two syscalls.
//
//   - nf_tables (iptables-nft): the namespace's ruleset generation
//     (NFT_MSG_GETGEN), which every committed nftables transaction bumps.
//     It is the same for every table and changes with rules that are not
//     iptables' too, which only costs a comparison more.
//   - legacy: the table's rules as the kernel holds them
//     (IPT_SO_GET_ENTRIES), hashed without each rule's counters, so
//     traffic does not change it.

var _ kernel.IPTablesFingerprinter = (*IPTables)(nil)

// Fingerprint implements kernel.IPTablesFingerprinter: on nf_tables one
// generation read for all the tables, on legacy one raw socket for their
// hashes, combined in order.
func (p *IPTables) Fingerprint(family kernel.Family, tables ...kernel.Table) (uint64, error) {
	if len(tables) == 0 {
		return 0, fmt.Errorf("iptables fingerprint: no table: %w", kernel.ErrInvalid)
	}
	for _, t := range tables {
		if err := kernel.ValidateIPTablesArgs(family, t); err != nil {
			return 0, err
		}
		if t == "" {
			return 0, fmt.Errorf("iptables fingerprint: empty table name: %w", kernel.ErrInvalid)
		}
	}
	if p.info.Backend == kernel.BackendNFT {
		return nftGeneration()
	}
	af := unix.AF_INET
	if family == kernel.FamilyIPv6 {
		af = unix.AF_INET6
	}
	fd, err := unix.Socket(af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return 0, fmt.Errorf("iptables fingerprint: raw socket: %w", err)
	}
	defer unix.Close(fd)
	h := fnv.New64a()
	for _, t := range tables {
		v, err := legacyTableHash(fd, family, t)
		if err != nil {
			return 0, err
		}
		_ = binary.Write(h, binary.NativeEndian, v)
	}
	return h.Sum64(), nil
}

// nf_tables netlink (uapi linux/netfilter/nf_tables.h).
const (
	nftMsgNewGen = 15
	nftMsgGetGen = 16
	nftaGenID    = 1
)

// nftGeneration reads the ruleset generation of the caller's namespace.
func nftGeneration() (uint64, error) {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|nftMsgGetGen, 0)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, unix.NFNL_SUBSYS_NFTABLES<<8|nftMsgNewGen)
	if err != nil {
		return 0, fmt.Errorf("nf_tables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		var gen uint64
		found := false
		err := walkAttrs(m[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) error {
			if typ == nftaGenID && len(v) == 4 {
				gen, found = uint64(binary.BigEndian.Uint32(v)), true
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("nf_tables generation: %w", err)
		}
		if found {
			return gen, nil
		}
	}
	return 0, errors.New("nf_tables generation: no NFTA_GEN_ID in the reply")
}

// x_tables getsockopt (uapi linux/netfilter_ipv4/ip_tables.h and
// netfilter_ipv6/ip6_tables.h: the same numbers for both).
const (
	xtSoGetInfo    = 64
	xtSoGetEntries = 65
	xtTableNameLen = 32
	// struct ipt_getinfo / ip6t_getinfo: name, valid_hooks, hook_entry[5],
	// underflow[5], num_entries, size.
	xtGetInfoLen = xtTableNameLen + 4 + 5*4 + 5*4 + 4 + 4
	// struct ipt_get_entries: name, size, then the entries, 8-aligned.
	xtGetEntriesHeader = 40
)

// xtEntryLayout locates what legacyTableHash skips in one rule (struct
// ipt_entry / ip6t_entry): next_offset, and comefrom with the counters
// that follow it (the kernel's bookkeeping and the traffic).
type xtEntryLayout struct {
	nextOffset       int // u16
	skipFrom, skipTo int
}

var xtLayouts = map[kernel.Family]xtEntryLayout{
	// struct ipt_ip is 84 bytes: nfcache 84, target_offset 88,
	// next_offset 90, comefrom 92, counters 96..112.
	kernel.FamilyIPv4: {nextOffset: 90, skipFrom: 92, skipTo: 112},
	// struct ip6t_ip6 is 136 bytes: next_offset 142, comefrom 144,
	// counters 152..168.
	kernel.FamilyIPv6: {nextOffset: 142, skipFrom: 144, skipTo: 168},
}

// legacyTableHash hashes a legacy table's rules without their counters.
// A table the kernel does not have (never used) hashes to 0.
func legacyTableHash(fd int, family kernel.Family, table kernel.Table) (uint64, error) {
	level := unix.SOL_IP
	if family == kernel.FamilyIPv6 {
		level = unix.SOL_IPV6
	}
	// A table replaced between the two reads changes size: read again.
	for range 5 {
		info := make([]byte, xtGetInfoLen)
		copy(info, table)
		if err := getsockopt(fd, level, xtSoGetInfo, info); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return 0, nil
			}
			return 0, fmt.Errorf("iptables fingerprint: %s info: %w", table, err)
		}
		size := int(binary.NativeEndian.Uint32(info[xtGetInfoLen-4:]))
		entries := make([]byte, xtGetEntriesHeader+size)
		copy(entries, table)
		binary.NativeEndian.PutUint32(entries[xtTableNameLen:], uint32(size))
		if err := getsockopt(fd, level, xtSoGetEntries, entries); err != nil {
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			return 0, fmt.Errorf("iptables fingerprint: %s entries: %w", table, err)
		}
		return hashEntries(info[xtTableNameLen:], entries[xtGetEntriesHeader:], xtLayouts[family])
	}
	return 0, fmt.Errorf("iptables fingerprint: %s kept changing while read: %w", table, kernel.ErrBusy)
}

// hashEntries hashes the hooks of a table's info and its entries, each
// without the bytes layout skips.
func hashEntries(hooks, entries []byte, layout xtEntryLayout) (uint64, error) {
	h := fnv.New64a()
	_, _ = h.Write(hooks)
	for off := 0; off < len(entries); {
		e := entries[off:]
		if len(e) < layout.skipTo {
			return 0, fmt.Errorf("iptables fingerprint: rule at %d: %d bytes left", off, len(e))
		}
		next := int(binary.NativeEndian.Uint16(e[layout.nextOffset:]))
		if next < layout.skipTo || next > len(e) {
			return 0, fmt.Errorf("iptables fingerprint: rule at %d: bad next_offset %d", off, next)
		}
		_, _ = h.Write(e[:layout.skipFrom])
		_, _ = h.Write(e[layout.skipTo:next])
		off += next
	}
	return h.Sum64() | 1, nil // never 0, the value of a missing table
}

func getsockopt(fd, level, opt int, buf []byte) error {
	l := uint32(len(buf))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
