package rules

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Every rendered payload passes CheckPayload, with or without the jumps.
func TestCheckPayloadAcceptsRenderings(t *testing.T) {
	for name, in := range goldenCases() {
		rs, err := Render(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, jumps := range [][]Jump{nil, rs.Jumps, rs.Jumps[:2]} {
			if err := CheckPayload(rs.Payload(jumps)); err != nil {
				t.Errorf("%s (%d jumps): %v", name, len(jumps), err)
			}
		}
	}
}

// A payload that writes anything outside our chains is refused, whatever
// produced it.
func TestCheckPayloadRefusesForeignWrites(t *testing.T) {
	ok := `*filter
:KUBE-FORWARD - [0:0]
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-I FORWARD 1 -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
COMMIT
`
	if err := CheckPayload([]byte(ok)); err != nil {
		t.Fatalf("good payload refused: %v", err)
	}
	for name, p := range map[string]string{
		"append to INPUT":                          "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n",
		"insert other rule":                        "*filter\n-I INPUT 1 -j ACCEPT\nCOMMIT\n",
		"jump at position 2":                       "*filter\n-I FORWARD 2 -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\nCOMMIT\n",
		"declare INPUT":                            "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n",
		"declare foreign chain":                    "*filter\n:CILIUM-INPUT - [0:0]\nCOMMIT\n",
		"declare nat chain in filter":              "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n",
		"flush all":                                "*filter\n-F\nCOMMIT\n",
		"flush ours":                               "*filter\n-F KUBE-FORWARD\nCOMMIT\n",
		"delete chain":                             "*filter\n-X KUBE-FORWARD\nCOMMIT\n",
		"delete every chain":                       "*nat\n-X\nCOMMIT\n",
		"delete optional chain in the wrong table": "*filter\n-X VSPLANE-IN-CLUSTER\nCOMMIT\n",
		"new chain":                                "*filter\n-N KUBE-FOO\nCOMMIT\n",
		"policy":                                   "*filter\n-P INPUT DROP\nCOMMIT\n",
		"delete rule":                              "*filter\n-D INPUT 1\nCOMMIT\n",
		"mangle table":                             "*mangle\n:KUBE-FORWARD - [0:0]\nCOMMIT\n",
		"jump to builtin":                          "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -j INPUT\nCOMMIT\n",
		"goto":                                     "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -g KUBE-NODE-PORT\nCOMMIT\n",
		"two jumps":                                "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -j ACCEPT -j DROP\nCOMMIT\n",
		"no jump":                                  "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -s 198.18.0.1/32\nCOMMIT\n",
		"foreign target":                           "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -j CILIUM-FW\nCOMMIT\n",
		"carriage return":                          "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -j ACCEPT\r-A INPUT -j ACCEPT\nCOMMIT\n",
		"nul":                                      "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -j ACCEPT\x00\nCOMMIT\n",
		"unterminated quote":                       "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -m comment --comment \"x -j ACCEPT\nCOMMIT\n",
	} {
		if err := CheckPayload([]byte(p)); !errors.Is(err, kernel.ErrInvalid) {
			t.Errorf("%s: CheckPayload = %v, want ErrInvalid", name, err)
		}
	}
}

// Hostile strings cannot add lines or rules: a zoned address is refused by
// Render, and even a rule string carrying a newline (a renderer bug) makes
// a payload CheckPayload refuses.
func TestHostileInputCannotEscapeOurChains(t *testing.T) {
	zoned := netip.MustParseAddr("2001:2::1%x\n-I INPUT 1 -j ACCEPT\n#")
	_, err := Render(Input{Family: kernel.FamilyIPv6, MasqueradeBit: 14,
		LoadBalancerNoNodeAccess: []VirtualPort{{zoned, 80, kernel.ProtocolTCP}}})
	if !errors.Is(err, kernel.ErrInvalid) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Render with a zoned load balancer address: %v", err)
	}

	rs, err := Render(Input{Family: kernel.FamilyIPv4, MasqueradeBit: 14, NonEmpty: allSets})
	if err != nil {
		t.Fatal(err)
	}
	rs.Tables[0].Chains[0].Rules = append(rs.Tables[0].Chains[0].Rules, "-j ACCEPT\n-A INPUT -j ACCEPT")
	if err := CheckPayload(rs.Payload(rs.Jumps)); !errors.Is(err, kernel.ErrInvalid) {
		t.Errorf("payload with an injected line: %v", err)
	}

	// comment() keeps any text one token on one line that reads back as
	// the (sanitized) text.
	for _, text := range []string{"a\nb", "x\" -j ACCEPT \"", `\" -j ACCEPT`, "tab\there", "é", strings.Repeat("a b", 200), ""} {
		c := comment(text)
		if strings.ContainsAny(c, "\n\r") {
			t.Errorf("comment(%q) = %q spans lines", text, c)
		}
		toks, err := kernel.RuleTokens(c)
		if err != nil || len(toks) != 4 || toks[3] != commentText(text) {
			t.Errorf("comment(%q) = %q reads back as %q (%v), want 4 tokens ending in %q", text, c, toks, err, commentText(text))
		}
	}
}
