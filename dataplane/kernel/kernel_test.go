package kernel

import (
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"
)

func TestParseRestore(t *testing.T) {
	payload := `# header
*nat
:KUBE-SERVICES - [0:0]
:PREROUTING ACCEPT [3:180]
-A KUBE-SERVICES -m comment --comment "ns/svc:http  cluster IP" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-I KUBE-SERVICES 2 -j RETURN
-D KUBE-SERVICES 1
-X KUBE-OLD
-F
COMMIT
*filter
-P FORWARD ACCEPT
COMMIT
`
	tables, err := ParseRestore([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 2 || tables[0].Table != TableNAT || tables[1].Table != TableFilter {
		t.Fatalf("tables: %+v", tables)
	}
	nat := tables[0].Lines
	want := []RestoreLine{
		{Op: OpDeclare, Chain: "KUBE-SERVICES", Policy: "-", LineNo: 3},
		{Op: OpDeclare, Chain: "PREROUTING", Policy: "ACCEPT", LineNo: 4},
		{Op: OpAppend, Chain: "KUBE-SERVICES", Rule: `-m comment --comment "ns/svc:http  cluster IP" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`, LineNo: 5},
		{Op: OpInsert, Chain: "KUBE-SERVICES", Num: 2, Rule: "-j RETURN", LineNo: 6},
		{Op: OpDelete, Chain: "KUBE-SERVICES", Num: 1, LineNo: 7},
		{Op: OpDeleteChain, Chain: "KUBE-OLD", LineNo: 8},
		{Op: OpFlush, LineNo: 9},
	}
	if !slices.Equal(nat, want) {
		t.Errorf("nat lines:\n got %+v\nwant %+v", nat, want)
	}
	if p := tables[1].Lines[0]; p.Op != OpPolicy || p.Chain != "FORWARD" || p.Policy != "ACCEPT" {
		t.Errorf("policy line: %+v", p)
	}
}

func TestParseRestoreErrors(t *testing.T) {
	for _, p := range []string{
		"*nat\n:X - [0:0]\n",               // no COMMIT
		"*bogus\nCOMMIT\n",                 // unknown table
		"-A X -j RETURN\n",                 // outside a table
		"*nat\n*filter\nCOMMIT\n",          // nested table
		"COMMIT\n",                         // stray COMMIT
		"*nat\n-A X\nCOMMIT\n",             // empty rule
		"*nat\n-I X 0 -j RETURN\nCOMMIT\n", // rule number 0
		"*nat\n-A X -m comment --comment \"open\nCOMMIT\n", // unterminated quote
		"*nat\n-Z X\nCOMMIT\n",                             // unsupported command
		"*nat\n:-BAD - [0:0]\nCOMMIT\n",                    // bad chain name
		"*nat\n-N X extra\nCOMMIT\n",                       // trailing arguments
	} {
		if _, err := ParseRestore([]byte(p)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRestore(%q): got %v, want ErrInvalid", p, err)
		}
	}
}

func TestRuleTokens(t *testing.T) {
	got, err := RuleTokens(`-m comment --comment "a \"b\"  c" -j  X`)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"-m", "comment", "--comment", `a "b"  c`, "-j", "X"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestParseSave(t *testing.T) {
	save := "# Generated\n*nat\n:PREROUTING ACCEPT [1:2]\n:KUBE-A - [0:0]\n-A PREROUTING -j KUBE-A\n-A KUBE-A -j RETURN\nCOMMIT\n# Completed\n"
	tables, err := ParseSave([]byte(save))
	if err != nil {
		t.Fatal(err)
	}
	c, ok := tables[0].Chain("KUBE-A")
	if !ok || c.Policy != "-" || !slices.Equal(c.Rules, []string{"-j RETURN"}) {
		t.Errorf("KUBE-A: %+v %v", c, ok)
	}
	if _, err := ParseSave([]byte("*nat\n-A NODECL -j RETURN\nCOMMIT\n")); err == nil {
		t.Errorf("rule for undeclared chain accepted")
	}
}

func TestParseKernelVersion(t *testing.T) {
	for in, want := range map[string]KernelVersion{
		"6.1.0-26-amd64\n": {6, 1, 0, "6.1.0-26-amd64"},
		"5.4":              {5, 4, 0, "5.4"},
		"4.19.112+":        {4, 19, 112, "4.19.112+"},
		"6.18.44-fc-v782":  {6, 18, 44, "6.18.44-fc-v782"},
	} {
		got, err := ParseKernelVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseKernelVersion(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "abc", "6", "x.1"} {
		if _, err := ParseKernelVersion(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseKernelVersion(%q): got %v, want ErrInvalid", bad, err)
		}
	}
	v := KernelVersion{Major: 5, Minor: 8}
	if v.AtLeast(5, 9) || !v.AtLeast(5, 8) || !v.AtLeast(4, 20) || (KernelVersion{Major: 6}).AtLeast(6, 1) {
		t.Errorf("AtLeast wrong")
	}
}

func TestVirtualServerNormalize(t *testing.T) {
	a := netip.MustParseAddr("::ffff:198.18.0.1")
	vs := VirtualServer{Key: VirtualServerKey{Address: a, Protocol: ProtocolTCP, Port: 80}, Scheduler: "rr", Flags: FlagHashed | FlagPersistent}
	n := vs.Normalize()
	want := VirtualServer{Key: AddrKey(netip.MustParseAddr("198.18.0.1"), ProtocolTCP, 80), Scheduler: "rr", Flags: FlagPersistent, Netmask: 32}
	if n != want || n.Key.Family != FamilyIPv4 {
		t.Errorf("got %+v, want %+v", n, want)
	}
	fw := VirtualServer{Key: VirtualServerKey{Family: FamilyIPv6, FWMark: 9, Address: a, Port: 3}, Scheduler: "rr"}.Normalize()
	if fw.Key != FWMarkKey(FamilyIPv6, 9) || fw.Netmask != 128 {
		t.Errorf("fwmark normalize: %+v", fw)
	}
	if err := (VirtualServer{Key: AddrKey(a, ProtocolTCP, 80), Scheduler: "rr"}).Validate(); err != nil {
		t.Errorf("valid server rejected: %v", err)
	}
	k := VirtualServerKey{Family: FamilyIPv6, Address: netip.MustParseAddr("198.18.0.1"), Protocol: ProtocolTCP}
	if err := k.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("family mismatch accepted: %v", err)
	}
}

func TestEntryValidate(t *testing.T) {
	ip4, ip6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:2::1")
	v4 := func(t SetType) IPSet { return IPSet{Name: "S", Type: t, Family: FamilyIPv4} }
	good := []struct {
		s IPSet
		e Entry
	}{
		{v4(HashIP), Entry{IP: ip4}},
		{v4(HashIPPort), Entry{IP: ip4, Protocol: ProtocolUDP, Port: 53}},
		{v4(HashIPPortIP), Entry{IP: ip4, Protocol: ProtocolTCP, Port: 1, IP2: ip4}},
		{v4(HashIPPortNet), Entry{IP: ip4, Protocol: ProtocolSCTP, Port: 1, Net: netip.MustParsePrefix("198.19.0.0/16")}},
		{v4(HashNet), Entry{Net: netip.MustParsePrefix("198.19.0.0/16")}},
		{IPSet{Name: "B", Type: BitmapPort, PortTo: 100}, Entry{Port: 100}},
		{IPSet{Name: "S6", Type: HashIP, Family: FamilyIPv6}, Entry{IP: ip6}},
	}
	for _, c := range good {
		if err := c.e.Validate(c.s); err != nil {
			t.Errorf("%s %+v: %v", c.s.Type, c.e, err)
		}
	}
	bad := []struct {
		s IPSet
		e Entry
	}{
		{v4(HashIP), Entry{IP: ip6}},
		{v4(HashIP), Entry{IP: ip4, Port: 80}},
		{v4(HashIPPort), Entry{IP: ip4, Port: 80}},
		{v4(HashIPPortIP), Entry{IP: ip4, Protocol: ProtocolTCP, Port: 1}},
		{v4(HashNet), Entry{Net: netip.MustParsePrefix("0.0.0.0/0")}},
		{v4(HashNet), Entry{IP: ip4, Net: netip.MustParsePrefix("198.19.0.0/16")}},
		{IPSet{Name: "B", Type: BitmapPort, PortTo: 100}, Entry{Port: 101}},
		{IPSet{Name: "B", Type: BitmapPort, PortTo: 100}, Entry{Port: 1, Protocol: ProtocolTCP}},
		{v4(HashIP), Entry{IP: ip4, Comment: "needs comments"}},
	}
	for _, c := range bad {
		if err := c.e.Validate(c.s); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s %+v: got %v, want ErrInvalid", c.s.Type, c.e, err)
		}
	}
}

func TestEntryFormat(t *testing.T) {
	e := Entry{IP: netip.MustParseAddr("198.18.0.1"), Protocol: ProtocolTCP, Port: 80, IP2: netip.MustParseAddr("198.18.0.2"), Net: netip.MustParsePrefix("198.19.0.0/24")}
	for typ, want := range map[SetType]string{
		HashIP: "198.18.0.1", HashIPPort: "198.18.0.1,tcp:80", HashIPPortIP: "198.18.0.1,tcp:80,198.18.0.2",
		HashIPPortNet: "198.18.0.1,tcp:80,198.19.0.0/24", HashNet: "198.19.0.0/24", BitmapPort: "80",
	} {
		if got := e.Format(typ); got != want {
			t.Errorf("%s: got %q, want %q", typ, got, want)
		}
	}
}

func TestErrnoSentinel(t *testing.T) {
	for errno, want := range map[syscall.Errno]error{
		syscall.EEXIST: ErrExist, syscall.ESRCH: ErrNotFound, syscall.ENOENT: ErrNotFound,
		syscall.EBUSY: ErrBusy, syscall.EINVAL: ErrInvalid, syscall.EPERM: nil,
	} {
		if got := ErrnoSentinel(errno); got != want {
			t.Errorf("%v: got %v, want %v", errno, got, want)
		}
	}
}

// Found by FuzzEntry (testdata/fuzz/FuzzEntry/ffc705cbd51721bf): netip
// keeps the address of a prefix whose length does not fit it, so such a
// Net passed Validate on a bitmap:port set yet never equalled the entry's
// read-back. Normalize makes every invalid Net the zero Prefix.
func TestEntryNormalizeInvalidNet(t *testing.T) {
	e := Entry{Port: 59, Net: netip.PrefixFrom(netip.AddrFrom4([4]byte{48, 48, 48, 48}), 48)}
	if e.Net.IsValid() || e.Net == (netip.Prefix{}) {
		t.Fatalf("test premise: %v should be an invalid, non-zero prefix", e.Net)
	}
	if got := e.Normalize(); got != (Entry{Port: 59}) {
		t.Errorf("Normalize() = %+v, want the port only", got)
	}
}
