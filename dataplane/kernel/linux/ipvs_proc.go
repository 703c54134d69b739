package linux

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// The kernel's /proc/net/ip_vs lists every virtual server with its
// destinations in one seq_file: a read(2) per page of it where netlink
// needs a GET_DEST request per server. Measured in the TCG VM at 2,000
// servers x 10 destinations: 0.05 s against 0.66-0.70 s for the per-server
// requests (`cat /proc/net/ip_vs` against `ipvsadm -Ln`). The full pass
// reads destinations this way (kernel.DestinationDumper); everything else
// keeps netlink, which also carries what the file leaves out (thresholds,
// tunnel settings, statistics).
//
// The file, as net/netfilter/ipvs/ip_vs_ctl.c (ip_vs_info_seq_show) writes
// it since Linux 2.6.28 (IPv6 support):
//
//	IP Virtual Server version 1.2.1 (size=4096)
//	Prot LocalAddress:Port Scheduler Flags
//	  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
//	TCP  0A600001:0050 rr
//	  -> 0A000102:1F90      Masq    1      0          0
//	UDP  [fd00:0000:...:0001]:0035 rr persistent 10800 FFFFFFFF
//	  -> [fd00:...:0002]:0035      Masq    1      0          0
//	FWM  00000001 rr
//
// One server and all its destinations are written by one show call, so
// each server's list is consistent. But the file is read a page (4 KiB) per
// read(2), and between reads servers can go missing, which the
// DestinationDumper contract allows (the full pass reads those by
// themselves):
//   - the table changed between two reads;
//   - other network namespaces hold IPVS servers. The servers of every
//     namespace share one hash table; in Linux 6.1 ip_vs_info_seq_next
//     walks all of them (showing nothing for another namespace's) while
//     ip_vs_info_seq_start, where each read(2) resumes, counts only this
//     namespace's, so a read resumes past as many of ours as it walked
//     others' (seen in the VM test bed, whose nodes are namespaces of one
//     kernel; a real node's pods seldom hold IPVS servers).
//
// A server is never shown with another's destinations, nor another
// namespace's server shown at all: what the dump holds is right.

// procIPVS reads one network namespace's /proc/net/ip_vs. The file is
// opened once, in the namespace of the thread that made the IPVS handle,
// and re-read from the start each time (seq_file regenerates it).
//
// It is parsed as it is read, a line at a time, into one array of
// destinations. At 10k Services the file is ~11 MB of text for 200k
// destinations; holding all of it, a slice of fields per line and a
// growing slice per server made the full pass's read the agent's memory
// peak (measured in the TCG VM: 145 MB allocated per two passes).
type procIPVS struct {
	mu sync.Mutex
	f  *os.File
	r  *bufio.Reader
	// lastDests is how many destinations the last dump held: the next
	// one's array is sized for it.
	lastDests int
}

// procLineMax bounds a line of the file (a server line with an IPv6
// address and every flag is about 100 bytes).
const procLineMax = 4 << 10

// openProcIPVS opens the calling thread's /proc/net/ip_vs. It returns nil
// when the file is missing (no procfs, or IPVS without it): the caller then
// reports kernel.ErrUnsupported.
func openProcIPVS() *procIPVS {
	// thread-self: the namespace of this thread, the one ipvs.New("") opened
	// its socket in; /proc/self would be the thread group leader's.
	runtime.LockOSThread()
	f, err := os.Open("/proc/thread-self/net/ip_vs")
	runtime.UnlockOSThread()
	if err != nil {
		return nil
	}
	return &procIPVS{f: f, r: bufio.NewReaderSize(f, procLineMax)}
}

func (p *procIPVS) close() {
	if p != nil {
		p.f.Close()
	}
}

// dump reads and parses the file from its start.
func (p *procIPVS) dump() (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	if _, err := p.f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	p.r.Reset(p.f)
	out, n, err := parseProcIPVS(p.r, p.lastDests)
	if err == nil {
		p.lastDests = n
	}
	return out, err
}

// DumpDestinations implements kernel.DestinationDumper.
func (v *IPVS) DumpDestinations() (map[kernel.VirtualServerKey][]kernel.Destination, error) {
	if v.proc == nil {
		return nil, fmt.Errorf("ipvs: /proc/net/ip_vs is not available: %w", kernel.ErrUnsupported)
	}
	v.proc.mu.Lock()
	defer v.proc.mu.Unlock()
	out, err := v.proc.dump()
	if err != nil {
		return nil, fmt.Errorf("ipvs: read /proc/net/ip_vs: %w", err)
	}
	return out, nil
}

// procServer is one server's run of destinations in the dump's array.
type procServer struct {
	key        kernel.VirtualServerKey
	start, end int
}

// parseProcIPVS parses /proc/net/ip_vs (format above) as r yields it.
// Firewall-mark servers and protocols other than TCP, UDP and SCTP are
// left out; any line it cannot read fails the whole parse rather than
// guess. sizeHint is the number of destinations expected; it returns how
// many there were.
func parseProcIPVS(r *bufio.Reader, sizeHint int) (map[kernel.VirtualServerKey][]kernel.Destination, int, error) {
	all := make([]kernel.Destination, 0, sizeHint)
	var servers []procServer
	inServer := false // the last server line is one being filled (not skipped)
	var fieldsBuf [8][]byte
	for n := 1; ; n++ {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, 0, badProcLine(n, line[:64], "line too long")
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, 0, err
		}
		if len(line) == 0 {
			break // end of file
		}
		fields := appendFields(fieldsBuf[:0], line)
		switch {
		case len(fields) == 0:
		case n <= 3: // the three header lines
			if n == 1 && !bytes.HasPrefix(line, []byte("IP Virtual Server version ")) {
				return nil, 0, badProcLine(n, line, "not the IPVS table")
			}
		case string(fields[0]) == "->":
			if len(fields) != 6 {
				return nil, 0, badProcLine(n, line, "want 6 fields in a destination line")
			}
			if !inServer {
				continue // a destination of a skipped server
			}
			d, err := parseProcDestination(fields)
			if err != nil {
				return nil, 0, badProcLine(n, line, err.Error())
			}
			all = append(all, d)
			servers[len(servers)-1].end = len(all)
		default:
			if len(fields) < 3 {
				return nil, 0, badProcLine(n, line, "want at least 3 fields in a server line")
			}
			proto, ok := procProtocols[string(fields[0])]
			if !ok { // FWM (family unknown) or a protocol vsplane never writes
				inServer = false
				continue
			}
			ap, err := parseProcAddrPort(fields[1])
			if err != nil {
				return nil, 0, badProcLine(n, line, err.Error())
			}
			// A server without destinations is dumped too (an empty
			// list); one shown twice (the table changed between reads)
			// keeps its later run.
			servers = append(servers, procServer{key: kernel.AddrKey(ap.Addr(), proto, ap.Port()), start: len(all), end: len(all)})
			inServer = true
		}
		if err != nil {
			break // the last line had no newline
		}
	}
	out := make(map[kernel.VirtualServerKey][]kernel.Destination, len(servers))
	for _, s := range servers {
		ds := all[s.start:s.end:s.end] // capped: a reader's append copies
		sortDestinations(ds)
		out[s.key] = ds
	}
	return out, len(all), nil
}

// sortDestinations sorts a server's destinations by key. The kernel lists
// them newest first (ip_vs_add_dest adds at the head of the server's list)
// and the agent adds them in key order, so a list is usually in reverse
// key order: reversing it costs n-1 compares, where sorting reversed input
// cost an insertion sort's n²/2 (half of the dump's parse time at 2,000
// servers x 10 destinations in the TCG VM).
func sortDestinations(ds []kernel.Destination) {
	byKey := func(a, b kernel.Destination) int { return a.Key().Compare(b.Key()) }
	if slices.IsSortedFunc(ds, func(a, b kernel.Destination) int { return byKey(b, a) }) {
		slices.Reverse(ds)
		return
	}
	slices.SortFunc(ds, byKey)
}

// appendFields appends the whitespace-separated fields of line to dst: a
// bytes.Fields that allocates nothing while dst has room (one slice per
// line was 56 MB per two passes at 10k Services).
func appendFields(dst [][]byte, line []byte) [][]byte {
	for i := 0; i < len(line); {
		for i < len(line) && isProcSpace(line[i]) {
			i++
		}
		j := i
		for j < len(line) && !isProcSpace(line[j]) {
			j++
		}
		if j > i {
			dst = append(dst, line[i:j])
		}
		i = j
	}
	return dst
}

func isProcSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// The names the file gives protocols (ip_vs_proto_name) and forward methods
// (ip_vs_fwd_name; "Masq" is also what it prints for any unknown method).
var (
	procProtocols = map[string]kernel.Protocol{"TCP": kernel.ProtocolTCP, "UDP": kernel.ProtocolUDP, "SCTP": kernel.ProtocolSCTP}
	procForwards  = map[string]kernel.ForwardMethod{"Masq": kernel.ForwardMasq, "Local": kernel.ForwardLocal,
		"Tunnel": kernel.ForwardTunnel, "Route": kernel.ForwardDirectRoute}
)

func badProcLine(n int, line []byte, why string) error {
	return fmt.Errorf("ipvs: /proc/net/ip_vs line %d %q: %s", n, line, why)
}

// parseProcDestination reads "-> ADDR:PORT FORWARD WEIGHT ACTIVE INACTIVE".
func parseProcDestination(f [][]byte) (kernel.Destination, error) {
	ap, err := parseProcAddrPort(f[1])
	if err != nil {
		return kernel.Destination{}, err
	}
	fwd, ok := procForwards[string(f[2])]
	if !ok {
		return kernel.Destination{}, fmt.Errorf("unknown forward method %q", f[2])
	}
	var nums [3]int64
	for i := range nums {
		if nums[i], err = strconv.ParseInt(string(f[3+i]), 10, 32); err != nil {
			return kernel.Destination{}, err
		}
	}
	return kernel.Destination{
		Address: ap.Addr(), Port: ap.Port(), Forward: fwd,
		Weight:       int(nums[0]),
		ActiveConn:   uint32(nums[1]),
		InactiveConn: uint32(nums[2]),
	}, nil
}

// parseProcAddrPort reads "0A000001:0050" (IPv4 as one hex number) or
// "[fd00:0000:...:0001]:0050" (IPv6, every group written out).
func parseProcAddrPort(b []byte) (netip.AddrPort, error) {
	i := bytes.LastIndexByte(b, ':')
	if i < 0 || len(b)-i-1 != 4 {
		return netip.AddrPort{}, fmt.Errorf("address %q: want ADDR:PORT with a 4-digit hex port", b)
	}
	var port [2]byte
	if _, err := hex.Decode(port[:], b[i+1:]); err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: port: %v", b, err)
	}
	host := b[:i]
	var addr netip.Addr
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		a, err := netip.ParseAddr(string(host[1 : len(host)-1]))
		if err != nil || !a.Is6() {
			return netip.AddrPort{}, fmt.Errorf("address %q: not IPv6", b)
		}
		addr = a
	} else {
		var ip [4]byte
		if len(host) != 8 {
			return netip.AddrPort{}, fmt.Errorf("address %q: want 8 hex digits of IPv4", b)
		}
		if _, err := hex.Decode(ip[:], host); err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q: %v", b, err)
		}
		addr = netip.AddrFrom4(ip)
	}
	return netip.AddrPortFrom(addr.Unmap(), binary.BigEndian.Uint16(port[:])), nil
}
