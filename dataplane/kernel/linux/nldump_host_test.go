package linux_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vsplane/vsplane/dataplane/kernel/linux"
)

// TestNetlinkDumpReadsEveryReply: the in-place dump (nldump.go) against
// the real kernel's rtnetlink: 300 links (veth pairs: the host kernel may lack dummy) span many reply datagrams,
// every one is read once, and a dump abandoned by its callback leaves
// replies that the next dump on the same socket skips.
func TestNetlinkDumpReadsEveryReply(t *testing.T) {
	requireNetns(t)
	want := []string{"lo"}
	for i := range 150 {
		name, peer := fmt.Sprintf("vspt-dump%d", i), fmt.Sprintf("vspt-peer%d", i)
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(name); err == nil {
				netlink.LinkDel(l) // and its peer
			}
		})
		want = append(want, name, peer)
	}
	slices.Sort(want)
	for _, stopAfter := range []int{0, 5} {
		got, err := linux.DumpLinkNames(stopAfter)
		if err != nil {
			t.Fatalf("stopAfter %d: %v", stopAfter, err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("stopAfter %d: dumped %d links, want %d (%v...)", stopAfter, len(got), len(want), got[:min(5, len(got))])
		}
	}
}
