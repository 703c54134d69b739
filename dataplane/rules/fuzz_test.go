package rules

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// fuzzInput decodes an Input from bytes: a header of flags, then
// load-balancer entries of (16 address bytes, port, protocol, zone length
// + zone). Anything goes, including zones, other families and port 0.
func fuzzInput(b []byte) Input {
	next := func(n int) []byte {
		n = min(n, len(b))
		out := b[:n]
		b = b[n:]
		return out
	}
	byteAt := func() byte {
		if x := next(1); len(x) == 1 {
			return x[0]
		}
		return 0
	}
	flags := byteAt()
	in := Input{
		Family:              []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6, kernel.FamilyUnspecified, 9}[flags&3],
		MasqueradeAll:       flags&4 != 0,
		RandomFully:         flags&8 != 0,
		ConntrackTCPLiberal: flags&16 != 0,
		MasqueradeBit:       byteAt() % 40,
	}
	var mask [4]byte
	copy(mask[:], next(4))
	in.NonEmpty = SetMask(binary.LittleEndian.Uint32(mask[:]))
	if flags&32 != 0 {
		var a [16]byte
		copy(a[:], next(16))
		addr := netip.AddrFrom16(a)
		if flags&64 != 0 {
			addr = addr.Unmap()
		}
		in.ClusterCIDRs = []netip.Prefix{netip.PrefixFrom(addr, int(byteAt()%130))}
	}
	if flags&128 != 0 {
		in.LocalInterface = string(next(int(byteAt() % 20)))
	}
	for len(b) > 0 {
		var a [16]byte
		copy(a[:], next(16))
		addr := netip.AddrFrom16(a)
		kind := byteAt()
		if kind&1 != 0 {
			addr = addr.Unmap()
		}
		var p [2]byte
		copy(p[:], next(2))
		vp := VirtualPort{IP: addr, Port: binary.LittleEndian.Uint16(p[:]),
			Protocol: []kernel.Protocol{kernel.ProtocolTCP, kernel.ProtocolUDP, kernel.ProtocolSCTP, 0}[kind>>1&3]}
		if zl := int(kind >> 3); zl > 0 && addr.Is6() {
			if z := string(next(zl)); z != "" {
				vp.IP = vp.IP.WithZone(z)
			}
		}
		in.LoadBalancerNoNodeAccess = append(in.LoadBalancerNoNodeAccess, vp)
		if mask[3]&0x80 != 0 {
			// The same addresses as in-cluster marks (a mark from the port).
			mark := uint32(1)<<in.MasqueradeBit | uint32(vp.Port)&InClusterMarkMask
			in.InClusterMarks = append(in.InClusterMarks, InClusterMark{Dest: vp, Mark: mark})
		}
	}
	return in
}

// fuzzSeed encodes an Input the way fuzzInput reads it.
func fuzzSeed(in Input, zones ...string) []byte {
	var b bytes.Buffer
	var flags byte
	flags |= map[kernel.Family]byte{kernel.FamilyIPv4: 0, kernel.FamilyIPv6: 1}[in.Family]
	for bit, on := range map[byte]bool{4: in.MasqueradeAll, 8: in.RandomFully, 16: in.ConntrackTCPLiberal, 32: len(in.ClusterCIDRs) > 0} {
		if on {
			flags |= bit
		}
	}
	if len(in.ClusterCIDRs) > 0 && in.ClusterCIDRs[0].Addr().Is4() {
		flags |= 64
	}
	b.WriteByte(flags)
	b.WriteByte(in.MasqueradeBit)
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(in.NonEmpty)))
	if len(in.ClusterCIDRs) > 0 {
		a := in.ClusterCIDRs[0].Addr().As16()
		b.Write(a[:])
		b.WriteByte(byte(in.ClusterCIDRs[0].Bits()))
	}
	for i, vp := range in.LoadBalancerNoNodeAccess {
		a := vp.IP.As16()
		b.Write(a[:])
		kind := byte(map[kernel.Protocol]int{kernel.ProtocolTCP: 0, kernel.ProtocolUDP: 1, kernel.ProtocolSCTP: 2}[vp.Protocol]) << 1
		if vp.IP.Is4() {
			kind |= 1
		}
		z := ""
		if i < len(zones) {
			z = zones[i]
		}
		kind |= byte(len(z)) << 3
		b.WriteByte(kind)
		b.Write(binary.LittleEndian.AppendUint16(nil, vp.Port))
		b.WriteString(z)
	}
	return b.Bytes()
}

// asSave turns a payload with every jump into what iptables-save prints
// afterwards: built-in chains declared, inserts as appends.
func asSave(payload []byte) []byte {
	var out bytes.Buffer
	// A chain declared and deleted ("-X", Table.Absent) is not saved.
	deleted := map[string]bool{}
	for _, line := range strings.Split(string(payload), "\n") {
		if c, ok := strings.CutPrefix(line, "-X "); ok {
			deleted[c] = true
		}
	}
	for _, line := range strings.Split(string(payload), "\n") {
		if c, ok := strings.CutPrefix(line, ":"); ok && deleted[strings.Fields(c)[0]] || strings.HasPrefix(line, "-X ") {
			continue
		}
		if t, ok := strings.CutPrefix(line, "*"); ok {
			out.WriteString(line + "\n")
			for _, c := range kernel.BuiltinChains(kernel.Table(t)) {
				out.WriteString(":" + c + " ACCEPT [0:0]\n")
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "-I "); ok {
			chain, rule, _ := strings.Cut(rest, " 1 ")
			line = "-A " + chain + " " + rule
		}
		if line != "" {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}

// FuzzRender: Render never panics and refuses bad input with ErrInvalid;
// what it renders passes CheckPayload (only our chains and the fixed
// jumps, with or without the jumps), never carries a zone or a control
// character, and reads back through iptables-save parsing as itself
// (Check finds nothing missing or different).
func FuzzRender(f *testing.F) {
	for _, in := range goldenCases() {
		f.Add(fuzzSeed(in))
	}
	f.Add(fuzzSeed(Input{Family: kernel.FamilyIPv6, MasqueradeBit: 14, NonEmpty: allSets,
		LoadBalancerNoNodeAccess: noNodeAccess6}, "x\n-I INPUT 1 -j ACCEPT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		in := fuzzInput(b)
		rs, err := Render(in)
		if err != nil {
			if in.Validate() == nil {
				t.Fatalf("Render(%+v) failed on valid input: %v", in, err)
			}
			return
		}
		for _, vp := range in.LoadBalancerNoNodeAccess {
			if vp.IP.Zone() != "" {
				t.Fatalf("Render accepted zoned address %q", vp.IP)
			}
		}
		full := rs.Payload(rs.Jumps)
		for _, p := range [][]byte{full, rs.Payload(nil)} {
			if err := CheckPayload(p); err != nil {
				t.Fatalf("CheckPayload refused a rendering of %+v: %v\n%s", in, err, p)
			}
		}
		dumps, err := kernel.ParseSave(asSave(full))
		if err != nil {
			t.Fatalf("rendering does not parse as iptables-save: %v\n%s", err, asSave(full))
		}
		if missing, differ := rs.Check(dumps); len(missing) > 0 || differ {
			t.Fatalf("read-back differs: missing %v, chains differ %v\n%s", missing, differ, full)
		}
		again, err := Render(in)
		if err != nil || !slices.Equal(again.Payload(again.Jumps), full) {
			t.Fatalf("Render not deterministic: %v", err)
		}
		if n := len(in.LoadBalancerNoNodeAccess); n > 0 {
			c, _ := rs.Tables[0].Chain(ChainIPVSOutFilter)
			if len(c.Rules) == 0 || len(c.Rules) > n {
				t.Fatalf("%d no-node-access entries gave %d rules", n, len(c.Rules))
			}
		}
	})
}
