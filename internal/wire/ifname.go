package wire

import "fmt"

// MaxInterfaceName is the longest network interface name (IFNAMSIZ - 1).
const MaxInterfaceName = 15

// CheckInterfaceName reports why name cannot be a network interface name
// in an iptables "-i" match (as the kernel's dev_valid_name and iptables'
// interface parsing see it). With prefix, name is the start of one: the
// match is written "name+", so it has one byte less.
func CheckInterfaceName(name string, prefix bool) error {
	limit := MaxInterfaceName
	if prefix {
		limit--
	}
	switch {
	case name == "":
		return fmt.Errorf("empty")
	case len(name) > limit:
		return fmt.Errorf("longer than %d bytes", limit)
	case name == "." || name == "..":
		return fmt.Errorf("not an interface name")
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c >= 0x7f || c == '/' || c == ':' || c == '+' || c == '!' || c == '"' || c == '\'' || c == '\\' {
			return fmt.Errorf("byte %q not allowed in an interface name", c)
		}
	}
	return nil
}
