package wire

import "testing"

func TestCheckInterfaceName(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix bool
		ok     bool
	}{
		{"cbr0", false, true}, {"veth", true, true}, {"lxc", true, true}, {"br-0.1_x@y", false, true},
		{"123456789012345", false, true}, {"123456789012345", true, false}, {"12345678901234", true, true},
		{"", false, false}, {"", true, false}, {".", false, false}, {"..", false, false},
		{"a b", false, false}, {"a/b", false, false}, {"a:b", false, false}, {"veth+", true, false},
		{"!x", false, false}, {"a\nb", false, false}, {"é", false, false}, {`a"b`, false, false},
	} {
		if err := CheckInterfaceName(tc.name, tc.prefix); (err == nil) != tc.ok {
			t.Errorf("CheckInterfaceName(%q, prefix %v) = %v, want ok %v", tc.name, tc.prefix, err, tc.ok)
		}
	}
}
