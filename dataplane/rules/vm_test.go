//go:build vmtest

package rules_test

// Real-kernel read-back of the rules whose matches need IPVS (the ipvs match
// of KUBE-IPVS-OUT-FILTER), which this host's kernel lacks. Build with
//
//	CGO_ENABLED=0 go test -c -tags vmtest -o rules.test ./dataplane/rules
//
// and run the binary as root inside the QEMU test bed (e2e/vm); TestMain
// moves it into a fresh network namespace. Without the ipvs match the
// restore fails and so does the test.

import "testing"

// TestRealIPVSMatchReadBack is TestRealIPTablesReadBack with
// LoadBalancerNoNodeAccess rules (tcp, udp, sctp; v4 and v6; legacy and nft).
func TestRealIPVSMatchReadBack(t *testing.T) {
	if netnsErr != nil {
		t.Fatalf("cannot run real-kernel test: %v", netnsErr)
	}
	realReadBack(t, true)
}
