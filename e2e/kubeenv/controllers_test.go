package kubeenv

import (
	"os"
	"strings"
	"testing"
)

func TestFirstServiceIP(t *testing.T) {
	for cidr, want := range map[string]string{"198.18.0.0/16": "198.18.0.1", "198.18.5.7/24": "198.18.5.1"} {
		ip, err := firstServiceIP(cidr)
		if err != nil || ip.String() != want {
			t.Errorf("%s: %v, %v; want %s", cidr, ip, err, want)
		}
	}
	if _, err := firstServiceIP("nope"); err == nil {
		t.Error("bad CIDR accepted")
	}
}

// TestEgressConfig: the cluster selection goes through the unix socket, a
// relative path is refused.
func TestEgressConfig(t *testing.T) {
	dir := t.TempDir()
	f, err := writeEgressConfig(dir, "/run/egress.sock")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: cluster", "proxyProtocol: HTTPConnect", "udsName: /run/egress.sock"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("egress config lacks %q:\n%s", want, b)
		}
	}
	if _, err := writeEgressConfig(dir, "egress.sock"); err == nil {
		t.Error("relative socket path accepted")
	}
}
