// Package contract is the test suite every kernel implementation must pass.
// The memory implementation runs it everywhere; the Linux one runs it
// against the real kernel inside a private network namespace.
//
// The suites do not assume a fresh kernel per test: every test uses its own
// names and addresses (from the benchmarking range 198.18.0.0/15 and
// 2001:2::/48) and removes what it created, so they can share one network
// namespace. They never touch anything they did not create, except the
// global IPVS timeouts and the sysctls they restore afterwards.
package contract

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// Run runs every sub-suite, asking newKernel for a kernel per test.
func Run(t *testing.T, newKernel func(t *testing.T) kernel.Kernel) {
	t.Run("IPVS", func(t *testing.T) { RunIPVS(t, func(t *testing.T) kernel.IPVS { return newKernel(t).IPVS }) })
	t.Run("IPSets", func(t *testing.T) { RunIPSets(t, func(t *testing.T) kernel.IPSets { return newKernel(t).IPSets }) })
	t.Run("Links", func(t *testing.T) { RunLinks(t, func(t *testing.T) kernel.Links { return newKernel(t).Links }) })
	t.Run("IPTables", func(t *testing.T) {
		RunIPTables(t, func(t *testing.T) kernel.IPTables { return newKernel(t).IPTables })
	})
	t.Run("Sysctl", func(t *testing.T) { RunSysctl(t, func(t *testing.T) kernel.Sysctl { return newKernel(t).Sysctl }) })
	t.Run("IPSetsWithIPTables", func(t *testing.T) { RunIPSetsWithIPTables(t, newKernel) })
	t.Run("Conntrack", func(t *testing.T) {
		RunConntrack(t, func(t *testing.T) (kernel.Conntrack, ConntrackSeeder) {
			c := newKernel(t).Conntrack
			s, ok := c.(ConntrackSeeder)
			if !ok {
				t.Fatalf("%T cannot seed entries: it must also be a contract.ConntrackSeeder (in tests)", c)
			}
			return c, s
		})
	})
}

// seq makes names and addresses unique within one test process.
var seq atomic.Uint32

func next() uint32 { return seq.Add(1) }

// uniqueName returns prefix followed by a process-unique number.
func uniqueName(prefix string) string { return fmt.Sprintf("%s%d", prefix, next()) }

// testAddr4 returns a unique address in 198.18.128.0/17 (service range of
// the test bed, never routed).
func testAddr4() netip.Addr {
	n := next()
	return netip.AddrFrom4([4]byte{198, 18, 128 + byte(n>>8&0x7f), byte(n)})
}

// testAddr6 returns a unique address in 2001:2:0:ff::/64.
func testAddr6() netip.Addr {
	n := next()
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0, 2, 0, 0, 0, 0xff, 14: byte(n >> 8), 15: byte(n)})
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: unexpected error: %v", what, err)
	}
}

func wantErr(t *testing.T, err, want error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want one wrapping %q", what, err, want)
	}
}
