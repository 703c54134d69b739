package linux

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAvailableSchedulers(t *testing.T) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	root := t.TempDir()
	ipvsDir := filepath.Join(root, release, "kernel", "net", "netfilter", "ipvs")
	if err := os.MkdirAll(ipvsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ip_vs_rr.ko.xz", "ip_vs_mh.ko", "ip_vs_ftp.ko.zst", "ip_vs.ko.xz", "ip_vs_pe_sip.ko"} {
		if err := os.WriteFile(filepath.Join(ipvsDir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	builtin := "kernel/net/netfilter/ipvs/ip_vs_wlc.ko\nkernel/net/ipv4/tcp_cubic.ko\n"
	if err := os.WriteFile(filepath.Join(root, release, "modules.builtin"), []byte(builtin), 0o644); err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(root, "modules")
	if err := os.WriteFile(proc, []byte("ip_vs_sh 12288 0 - Live 0x0\nip_vs 200704 2 ip_vs_sh, Live 0x0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := AvailableSchedulers(root, proc)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"mh", "rr", "sh", "wlc"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}

	if _, err := AvailableSchedulers(filepath.Join(root, "none"), filepath.Join(root, "none")); err == nil {
		t.Errorf("no readable source: want an error")
	}
}

func TestNetmaskConversion(t *testing.T) {
	for _, bits := range []uint8{0, 1, 8, 24, 31, 32} {
		if got := netmaskFromKernel(4, netmaskToKernel(4, bits)); got != bits {
			t.Errorf("ipv4 /%d round-trips to /%d", bits, got)
		}
	}
	if got := netmaskToKernel(6, 64); got != 64 {
		t.Errorf("ipv6 netmask travels as prefix length, got %d", got)
	}
}
