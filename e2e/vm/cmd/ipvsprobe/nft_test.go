package main

import (
	"net/netip"
	"testing"
)

// A dnat map value as the kernel returns it for "ipv4_addr . inet_service":
// the address, then the port big-endian, each in a 4-byte register.
func TestIsEndpoint(t *testing.T) {
	v := []byte{198, 19, 110, 1, 0x1f, 0x90, 0, 0}
	for _, c := range []struct {
		ep   string
		want bool
	}{
		{"198.19.110.1:8080", true},
		{"198.19.110.1:8081", false},
		{"198.19.110.2:8080", false},
	} {
		if got := isEndpoint(v, netip.MustParseAddrPort(c.ep)); got != c.want {
			t.Errorf("isEndpoint(%v, %s) = %v, want %v", v, c.ep, got, c.want)
		}
	}
	if isEndpoint(v[:5], netip.MustParseAddrPort("198.19.110.1:8080")) {
		t.Error("a 5-byte value matched")
	}
}
