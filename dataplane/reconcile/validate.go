package reconcile

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Validation of what the agent receives. The control plane is not trusted
// to be right: every wire value is checked before it can reach the kernel,
// an iptables-restore payload, an ipset or a log line, and every violation
// is a content problem naming the field, e.g.
//
//	virtual_servers[2].scheduler "foo": not offered by this kernel (have rr, wrr)
//
// Wire strings are quoted (strconv.Quote, cut to 80 bytes) wherever they
// appear in a message.

// Bounds of wire values.
const (
	// maxPersistenceTimeout is kube-proxy's (and the API's) cap on
	// sessionAffinityConfig.clientIP.timeoutSeconds.
	maxPersistenceTimeout = 86400
	// maxWeight is the largest IPVS weight ipvsadm accepts.
	maxWeight = 65535
	// maxIPVSTimeout is the kernel's limit on IPVS connection timeouts,
	// INT_MAX / HZ seconds, at the highest HZ (1000).
	maxIPVSTimeout = (1<<31 - 1) / 1000
	// maxReconcilePeriod bounds reconcile_period_seconds (a day).
	maxReconcilePeriod = 86400
	// maxVersionLen bounds a resource version (the control plane sends a
	// content hash).
	maxVersionLen = 1024
)

// fieldError is a content problem of one wire field: its path below the
// resource body, its offending value (already quoted), and why.
type fieldError struct {
	path, value, why string
}

func (e *fieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.path)
	if e.value != "" {
		if e.path != "" {
			b.WriteByte(' ')
		}
		b.WriteString(e.value)
	}
	b.WriteString(": ")
	b.WriteString(e.why)
	return b.String()
}

// under prefixes the path with the enclosing field ("virtual_servers[2]").
func (e *fieldError) under(prefix string) *fieldError {
	switch {
	case e.path == "":
		e.path = prefix
	case strings.HasPrefix(e.path, "["):
		e.path = prefix + e.path
	default:
		e.path = prefix + "." + e.path
	}
	return e
}

// bad builds a fieldError; value is quoted when it is a string.
func bad(path string, value any, format string, args ...any) *fieldError {
	var v string
	switch x := value.(type) {
	case nil:
	case string:
		v = quote(x)
	default:
		v = fmt.Sprint(x)
	}
	return &fieldError{path: path, value: v, why: fmt.Sprintf(format, args...)}
}

// quote renders a wire string for a message: Go-quoted (no raw control
// characters), cut to 80 bytes.
func quote(s string) string {
	if len(s) > 80 {
		return strconv.Quote(s[:80]) + "..."
	}
	return strconv.Quote(s)
}

// parseAddr parses a wire address: no IPv6 zone (checked before Unmap,
// which would drop it), IPv4-mapped addresses unmapped.
func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("not an IP address")
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("IPv6 zone not allowed")
	}
	return a.Unmap(), nil
}

// parseServiceAddr parses the address of a virtual server, a real server
// or an ipset entry and rejects what no Service VIP or endpoint may be
// (the API server refuses them too): unspecified, loopback, link-local,
// multicast and the IPv4 broadcast address. Bound to kube-ipvs0 or used
// as a real server, they would break the node.
func parseServiceAddr(s string) (netip.Addr, error) {
	a, err := parseAddr(s)
	if err != nil {
		return a, err
	}
	switch {
	case a.IsUnspecified():
		return a, fmt.Errorf("unspecified address not allowed")
	case a.IsLoopback():
		return a, fmt.Errorf("loopback address not allowed")
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return a, fmt.Errorf("link-local address not allowed")
	case a.IsMulticast():
		return a, fmt.Errorf("multicast address not allowed")
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return a, fmt.Errorf("broadcast address not allowed")
	}
	return a, nil
}

// parsePrefix parses a wire CIDR: no zone (netip refuses them), not
// IPv4-mapped (its prefix length would not fit IPv4), masked.
func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	switch {
	case err != nil && strings.Contains(s, "%"):
		return netip.Prefix{}, fmt.Errorf("IPv6 zone not allowed")
	case err != nil:
		return netip.Prefix{}, fmt.Errorf("not a CIDR")
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("IPv4-mapped prefix not allowed")
	}
	return p.Masked(), nil
}

// checkPort requires 1..65535.
func checkPort(path string, p uint32) *fieldError {
	if p == 0 || p > 65535 {
		return bad(path, p, "out of range 1..65535")
	}
	return nil
}

// checkScheduler requires a scheduler the kernel offers (schedulers nil:
// the list is unknown, a well-formed name passes and the kernel decides).
func checkScheduler(name string, schedulers []string) error {
	switch {
	case schedulers != nil && !slices.Contains(schedulers, name):
		have := "none"
		if len(schedulers) > 0 {
			have = strings.Join(schedulers, ", ")
		}
		return fmt.Errorf("not offered by this kernel (have %s)", have)
	case schedulers == nil && !schedulerName(name):
		return fmt.Errorf("not a scheduler name (1..15 lower-case letters and digits)")
	}
	return nil
}

func schedulerName(s string) bool {
	if s == "" || len(s) > 15 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// dnsLabel reports whether s is a DNS-1123 label (what the API server
// requires of namespaces and, as DNS-1035 labels, of Service names).
func dnsLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// labelValue reports whether s is a Kubernetes label value (the node's
// zone): at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends.
func labelValue(s string) bool {
	if len(s) > 63 {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := 0; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return s == "" || alnum(s[0]) && alnum(s[len(s)-1])
}

// serviceName splits "service/<namespace>/<name>".
func serviceName(name string) (namespace, svc string, ok bool) {
	rest, ok := strings.CutPrefix(name, wire.ServiceResourcePrefix)
	if !ok {
		return "", "", false
	}
	namespace, svc, ok = strings.Cut(rest, "/")
	return namespace, svc, ok && dnsLabel(namespace) && dnsLabel(svc)
}

// checkIdentity checks what identifies a resource before anything of it is
// stored: the name is "node/settings" or "service/<namespace>/<name>" with
// DNS-1123 labels, and the version is printable ASCII. A resource failing
// it is refused whole (nothing stored, nothing applied).
func checkIdentity(res *vsplanev1.Resource) error {
	name := res.GetName()
	if name == "" {
		return fmt.Errorf("resource without a name")
	}
	if _, _, ok := serviceName(name); !ok && name != SettingsResource {
		return bad("name", name, "not %q or \"service/<namespace>/<name>\" with DNS-1123 labels; resource refused", SettingsResource)
	}
	v := res.GetVersion()
	if len(v) > maxVersionLen {
		return bad("version", v, "longer than %d bytes; resource refused", maxVersionLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return bad("version", v, "not printable ASCII; resource refused")
		}
	}
	return nil
}

// knownEnum reports whether v is a value of the enum (names map of the
// generated code).
func knownEnum[E ~int32](v E, names map[int32]string) bool {
	_, ok := names[int32(v)]
	return ok
}

// checkFamilyEnum requires a known IPFamily value.
func checkFamilyEnum(path string, f vsplanev1.IPFamily) *fieldError {
	if !knownEnum(f, vsplanev1.IPFamily_name) {
		return bad(path, f, "unknown family")
	}
	return nil
}

// familyName is "IPv4"/"IPv6" for messages.
func familyName(f kernel.Family) string {
	if f == kernel.FamilyIPv6 {
		return "IPv6"
	}
	return "IPv4"
}
