package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func sampleTree(t *testing.T, order []int) *tree {
	t.Helper()
	steps := []func(tr *tree) error{
		func(tr *tree) error { return tr.file("usr/sbin/xtables-nft-multi", 0o755, []byte("nft")) },
		func(tr *tree) error { return tr.symlink("usr/sbin/iptables-nft", "xtables-nft-multi") },
		func(tr *tree) error { return tr.symlink("usr/sbin/iptables", "/etc/alternatives/iptables") },
		func(tr *tree) error { return tr.symlink("etc/alternatives/iptables", "/usr/sbin/iptables-nft") },
		func(tr *tree) error { return tr.dir("tmp", 0o1777) },
		func(tr *tree) error { return tr.symlink("sbin", "usr/sbin") },
	}
	tr := newTree()
	for _, i := range order {
		if err := steps[i](tr); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

// TestTarballDeterministic: the order files are added in does not matter;
// parents come first, every time is the given one, owners are numeric only.
func TestTarballDeterministic(t *testing.T) {
	mtime := time.Unix(0, 0)
	a, err := sampleTree(t, []int{0, 1, 2, 3, 4, 5}).tarball(mtime)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sampleTree(t, []int{5, 4, 3, 2, 1, 0}).tarball(mtime)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("the same tree added in another order gives another tarball")
	}
	tr := tar.NewReader(bytes.NewReader(a))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(mtime) || h.Uname != "" || h.Gname != "" || !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() || len(h.PAXRecords) != 0 {
			t.Errorf("%s: mtime %v uname %q gname %q atime %v ctime %v pax %v", h.Name, h.ModTime, h.Uname, h.Gname, h.AccessTime, h.ChangeTime, h.PAXRecords)
		}
		if h.Name == "tmp/" && h.Mode != 0o1777 {
			t.Errorf("tmp mode %o", h.Mode)
		}
	}
	want := "etc/ etc/alternatives/ etc/alternatives/iptables sbin tmp/ usr/ usr/sbin/ usr/sbin/iptables usr/sbin/iptables-nft usr/sbin/xtables-nft-multi"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries:\n got %s\nwant %s", got, want)
	}
}

func TestResolve(t *testing.T) {
	tr := sampleTree(t, []int{0, 1, 2, 3, 4, 5})
	for _, p := range []string{"usr/sbin/iptables", "/sbin/iptables", "sbin/iptables-nft", "usr/sbin/xtables-nft-multi"} {
		e, err := tr.resolve(p)
		if err != nil || e.Path != "usr/sbin/xtables-nft-multi" {
			t.Errorf("resolve %s: %+v %v", p, e, err)
		}
	}
	if _, err := tr.resolve("usr/sbin/iptables-legacy"); err == nil {
		t.Error("a missing file resolved")
	}
	if err := tr.file("usr/sbin/iptables", 0o755, nil); err == nil {
		t.Error("a path added twice is no error")
	}
}

// TestCheckELF: a dynamically linked program of this machine fails the
// check without its libraries in the tree.
func TestCheckELF(t *testing.T) {
	prog, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTree()
	if err := tr.file("usr/bin/true", 0o755, prog); err != nil {
		t.Fatal(err)
	}
	err = tr.checkELF(libDirs)
	if err == nil || !strings.Contains(err.Error(), "libc.so.6") || !strings.Contains(err.Error(), "interpreter") {
		t.Fatalf("want missing libc and interpreter, got %v", err)
	}
}

// TestKeepFromDeb pins the selection: the agent's iptables commands and
// extensions, the libraries, nothing of ebtables/arptables or the rest of libc6.
func TestKeepFromDeb(t *testing.T) {
	keep := []string{
		"iptables usr/sbin/xtables-nft-multi", "iptables usr/sbin/iptables-legacy-save", "iptables usr/sbin/ip6tables-nft-restore",
		"iptables usr/lib/x86_64-linux-gnu/xtables/libxt_comment.so", "iptables usr/lib/x86_64-linux-gnu/xtables/libipt_MASQUERADE.so",
		"iptables usr/share/doc/iptables/copyright", "libc6 usr/lib/x86_64-linux-gnu/libc.so.6", "libc6 usr/lib64/ld-linux-x86-64.so.2",
		"libnftnl11 usr/lib/x86_64-linux-gnu/libnftnl.so.11", "netbase etc/protocols",
	}
	drop := []string{
		"iptables usr/sbin/ebtables-nft", "iptables usr/sbin/iptables-translate", "iptables usr/lib/x86_64-linux-gnu/xtables/libebt_ip.so",
		"iptables usr/share/man/man8/iptables.8.gz", "libc6 usr/lib/x86_64-linux-gnu/libresolv.so.2", "libc6 usr/lib/x86_64-linux-gnu/gconv/UTF-16.so",
		"libnftnl11 usr/share/doc/libnftnl11/changelog.Debian.gz", "netbase etc/rpc",
	}
	for _, s := range keep {
		pkg, p, _ := strings.Cut(s, " ")
		if !keepFromDeb(pkg, p) {
			t.Errorf("%s: %s dropped", pkg, p)
		}
	}
	for _, s := range drop {
		pkg, p, _ := strings.Cut(s, " ")
		if keepFromDeb(pkg, p) {
			t.Errorf("%s: %s kept", pkg, p)
		}
	}
	if canonical("lib/x86_64-linux-gnu/libc.so.6") != "usr/lib/x86_64-linux-gnu/libc.so.6" || canonical("lib64/ld-linux-x86-64.so.2") != "usr/lib64/ld-linux-x86-64.so.2" || canonical("etc/protocols") != "etc/protocols" {
		t.Error("canonical does not map onto merged /usr")
	}
}

// TestImageDigestReproducible: the same trees and time give the same
// digest; another SOURCE_DATE_EPOCH gives another.
func TestImageDigestReproducible(t *testing.T) {
	spec := func() imageSpec {
		base, err := baseTree()
		if err != nil {
			t.Fatal(err)
		}
		bin, err := binaryTree("vsplane-controlplane", bytes.Repeat([]byte("x"), 1<<16))
		if err != nil {
			t.Fatal(err)
		}
		return imageSpec{Name: "test", Layers: []*tree{base, bin}, LayerNames: []string{"base", "bin"},
			Entrypoint: []string{"/vsplane-controlplane"}, User: "65532:65532"}
	}
	digest := func(mtime time.Time) string {
		img, err := spec().build(mtime)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	a, b := digest(time.Unix(0, 0)), digest(time.Unix(0, 0))
	if a != b {
		t.Fatalf("two builds: %s and %s", a, b)
	}
	if c := digest(time.Unix(1700000000, 0)); c == a {
		t.Fatal("another timestamp gives the same digest")
	}
	// Written twice: byte-identical tarballs and layouts.
	dir := t.TempDir()
	var sums []string
	for i := range 2 {
		img, err := spec().build(time.Unix(0, 0))
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, string(rune('a'+i)))
		if err := write(img, "example.com/x/test:dev", out, out+".tar"); err != nil {
			t.Fatal(err)
		}
		tb, err := os.ReadFile(out + ".tar")
		if err != nil {
			t.Fatal(err)
		}
		idx, err := os.ReadFile(filepath.Join(out, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, string(tb)+string(idx))
	}
	if sums[0] != sums[1] {
		t.Fatal("writing the same image twice gives different files")
	}
	// What was written reads back as a valid image with the same digest,
	// from the layout and from the tarball.
	want := digest(time.Unix(0, 0))
	idx, err := layout.ImageIndexFromPath(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("layout index: %v %v", im, err)
	}
	fromLayout, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	fromTar, err := tarball.ImageFromPath(filepath.Join(dir, "a.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for what, img := range map[string]v1.Image{"layout": fromLayout, "tarball": fromTar} {
		if err := validate.Image(img); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		if d, err := img.Digest(); err != nil || (what == "layout" && d.String() != want) {
			t.Errorf("%s: digest %v %v, want %s", what, d, err, want)
		}
	}
}

func TestSourceDateEpoch(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	if ts, err := sourceDateEpoch(); err != nil || ts.Unix() != 0 {
		t.Errorf("unset: %v %v", ts, err)
	}
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	if ts, err := sourceDateEpoch(); err != nil || ts.Unix() != 1700000000 {
		t.Errorf("set: %v %v", ts, err)
	}
	t.Setenv("SOURCE_DATE_EPOCH", "yesterday")
	if _, err := sourceDateEpoch(); err == nil {
		t.Error("a non-number is accepted")
	}
}

// TestKeepToolsAndLibraries pins the selection of agnhost's Debian layer:
// commands and ip's configuration from tool packages, shared objects and
// the loader from libraries, no documentation or locales.
func TestKeepToolsAndLibraries(t *testing.T) {
	for _, p := range []string{"usr/bin/dig", "usr/bin/nc.openbsd", "usr/sbin/tc", "etc/iproute2/rt_tables", "usr/share/doc/curl/copyright"} {
		pkg := "curl"
		if !keepTool(pkg, p) {
			t.Errorf("tool file %s dropped", p)
		}
	}
	for _, p := range []string{"usr/share/man/man1/dig.1.gz", "usr/lib/x86_64-linux-gnu/libfoo.so.1", "etc/bash.bashrc"} {
		if keepTool("curl", p) {
			t.Errorf("tool file %s kept", p)
		}
	}
	for _, p := range []string{"usr/lib/x86_64-linux-gnu/libcurl.so.4", "usr/lib/x86_64-linux-gnu/libcurl.so.4.8.0", "usr/lib64/ld-linux-x86-64.so.2"} {
		if !keepLibrary("libcurl4", p) {
			t.Errorf("library file %s dropped", p)
		}
	}
	for _, p := range []string{"usr/lib/x86_64-linux-gnu/gconv/UTF-16.so", "usr/share/locale/de/LC_MESSAGES/x.mo", "usr/bin/curl"} {
		if keepLibrary("libc6", p) {
			t.Errorf("library file %s kept", p)
		}
	}
}

// TestLockLibraryColumn: the optional fifth column marks a library of the
// tools' closure; anything else there, or a package no image names without
// it, is an error.
func TestLockLibraryColumn(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "lock")
	entries := []lockEntry{{Package: "libc6", Version: "1", File: "a.deb", SHA256: "00", Library: true}, {Package: "iptables", Version: "2", File: "b.deb", SHA256: "11"}}
	if err := writeLock(f, entries); err != nil {
		t.Fatal(err)
	}
	got, err := readLock(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Library || got[1].Library {
		t.Fatalf("read back %+v", got)
	}
	if err := os.WriteFile(f, []byte("libc6 1 a.deb 00 maybe\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readLock(f); err == nil {
		t.Error("a fifth column other than 'library' accepted")
	}
	if err := checkLockCovers([]lockEntry{{Package: "iptables"}, {Package: "stray"}}, []string{"iptables"}); err == nil {
		t.Error("an unnamed non-library package accepted")
	}
	if err := checkLockCovers([]lockEntry{{Package: "iptables"}, {Package: "libx", Library: true}}, []string{"iptables"}); err != nil {
		t.Errorf("a closure library refused: %v", err)
	}
	if err := checkLockCovers([]lockEntry{{Package: "libx", Library: true}}, []string{"iptables"}); err == nil {
		t.Error("a missing named package accepted")
	}
}
