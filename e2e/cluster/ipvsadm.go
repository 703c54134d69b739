package cluster

import (
	"fmt"
	"slices"
	"strings"
)

// IPVSTable is `ipvsadm -Ln` parsed: "TCP 198.18.0.10:80 rr" -> real
// servers as "198.19.1.11:8080 w=1", sorted. Connection counters are left
// out so that two tables of the same state compare equal.
type IPVSTable map[string][]string

// ParseIPVSADM parses the output of `ipvsadm -Ln`.
func ParseIPVSADM(out string) (IPVSTable, error) {
	t := IPVSTable{}
	cur := ""
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0, strings.HasPrefix(line, "IP Virtual Server"), strings.HasPrefix(line, "Prot "),
			strings.HasPrefix(strings.TrimSpace(line), "-> RemoteAddress"):
		case f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP" || f[0] == "FWM":
			if len(f) < 3 {
				return nil, fmt.Errorf("ipvsadm: short virtual server line %q", line)
			}
			cur = strings.Join(f, " ")
			t[cur] = []string{}
		case f[0] == "->":
			if cur == "" || len(f) < 4 {
				return nil, fmt.Errorf("ipvsadm: unexpected real server line %q", line)
			}
			t[cur] = append(t[cur], f[1]+" w="+f[3])
		default:
			return nil, fmt.Errorf("ipvsadm: unexpected line %q", line)
		}
	}
	for k := range t {
		slices.Sort(t[k])
	}
	return t, nil
}

// Find returns the virtual servers on vip:port (any protocol and flags),
// keyed as in the table.
func (t IPVSTable) Find(vip string, port int32) IPVSTable {
	out := IPVSTable{}
	needle := fmt.Sprintf(" %s:%d ", vip, port)
	for k, v := range t {
		if strings.Contains(k+" ", needle) {
			out[k] = v
		}
	}
	return out
}

// Serving returns the real servers of the virtual server key with a
// non-zero weight (draining ones excluded), as "addr:port".
func (t IPVSTable) Serving(key string) []string {
	var out []string
	for _, d := range t[key] {
		addr, w, _ := strings.Cut(d, " w=")
		if w != "0" {
			out = append(out, addr)
		}
	}
	return out
}

// WithoutDraining is the table without weight-0 real servers (graceful
// termination may remove those at any time).
func (t IPVSTable) WithoutDraining() IPVSTable {
	out := IPVSTable{}
	for k, v := range t {
		out[k] = []string{}
		for _, d := range v {
			if !strings.HasSuffix(d, " w=0") {
				out[k] = append(out[k], d)
			}
		}
	}
	return out
}

// String renders the table one virtual server per line, sorted.
func (t IPVSTable) String() string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s -> %s\n", k, strings.Join(t[k], ", "))
	}
	return b.String()
}
