package kernel

import (
	"fmt"
	"strconv"
	"strings"
)

// Sysctl names the proxier touches, in /proc/sys path form.
const (
	SysctlIPForward             = "net/ipv4/ip_forward"
	SysctlVSConntrack           = "net/ipv4/vs/conntrack"
	SysctlVSConnReuseMode       = "net/ipv4/vs/conn_reuse_mode"
	SysctlVSExpireNodestConn    = "net/ipv4/vs/expire_nodest_conn"
	SysctlVSExpireQuiescentTmpl = "net/ipv4/vs/expire_quiescent_template"
	SysctlArpIgnoreAll          = "net/ipv4/conf/all/arp_ignore"
	SysctlArpAnnounceAll        = "net/ipv4/conf/all/arp_announce"
	SysctlBridgeNFCallIPTables  = "net/bridge/bridge-nf-call-iptables"
	SysctlIPv6ConfAllForwarding = "net/ipv6/conf/all/forwarding"
	SysctlRouteLocalnetAll      = "net/ipv4/conf/all/route_localnet"
	// Connection tracking (kube-proxy's conntrack settings). nf_conntrack_max
	// is host-wide: read-only outside the host's network namespace.
	SysctlConntrackMax                   = "net/netfilter/nf_conntrack_max"
	SysctlConntrackTCPTimeoutEstablished = "net/netfilter/nf_conntrack_tcp_timeout_established"
	SysctlConntrackTCPTimeoutCloseWait   = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	SysctlConntrackTCPBeLiberal          = "net/netfilter/nf_conntrack_tcp_be_liberal"
	SysctlConntrackUDPTimeout            = "net/netfilter/nf_conntrack_udp_timeout"
	SysctlConntrackUDPTimeoutStream      = "net/netfilter/nf_conntrack_udp_timeout_stream"
)

// ValidateSysctlName accepts slash-separated names ("net/ipv4/ip_forward")
// without empty, "." or ".." segments.
func ValidateSysctlName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") {
		return fmt.Errorf("sysctl %q: want a relative path like net/ipv4/ip_forward: %w", name, ErrInvalid)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." || strings.ContainsRune(seg, 0) {
			return fmt.Errorf("sysctl %q: bad path segment %q: %w", name, seg, ErrInvalid)
		}
	}
	return nil
}

// KernelVersion is the running kernel's release, e.g. 6.1.0 from
// "6.1.0-26-amd64".
type KernelVersion struct {
	Major, Minor, Patch int
	Raw                 string
}

// ParseKernelVersion parses a kernel release string (/proc/sys/kernel/osrelease).
func ParseKernelVersion(s string) (KernelVersion, error) {
	raw := strings.TrimSpace(s)
	v := KernelVersion{Raw: raw}
	// Keep the leading "X.Y[.Z]" and ignore any suffix ("-26-amd64", "+").
	end := strings.IndexFunc(raw, func(r rune) bool { return r != '.' && (r < '0' || r > '9') })
	if end < 0 {
		end = len(raw)
	}
	parts := strings.Split(raw[:end], ".")
	if len(parts) < 2 {
		return v, fmt.Errorf("kernel version %q: want X.Y[.Z]: %w", s, ErrInvalid)
	}
	nums := []*int{&v.Major, &v.Minor, &v.Patch}
	for i, p := range parts {
		if i == len(nums) {
			break
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return v, fmt.Errorf("kernel version %q: %w", s, ErrInvalid)
		}
		*nums[i] = n
	}
	return v, nil
}

// AtLeast reports whether v >= major.minor.
func (v KernelVersion) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

func (v KernelVersion) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Sysctl reads and writes integer sysctls.
//
// Contract:
//   - Get/Set of a name that does not exist: ErrNotFound (Set never
//     creates one).
//   - Set then Get returns the value set.
//   - Bad names (see ValidateSysctlName): ErrInvalid.
//   - KernelVersion reads kernel/osrelease.
//   - ConntrackHashsize reads the conntrack table's bucket count (the
//     nf_conntrack module's hashsize parameter): positive, or ErrNotFound
//     without the module. SetConntrackHashsize writes it; it is host-wide,
//     and the kernel refuses it outside the host's network namespace.
//   - Safe for concurrent use.
type Sysctl interface {
	Get(name string) (int, error)
	Set(name string, value int) error
	KernelVersion() (KernelVersion, error)
	ConntrackHashsize() (int, error)
	SetConntrackHashsize(buckets int) error
}
