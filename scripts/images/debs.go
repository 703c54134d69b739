package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// agentPackages are the Debian packages the agent image takes files from:
// iptables (legacy and nft), the libraries its programs and xtables
// plugins link (what ldd names; checkELF verifies the result), and netbase
// for /etc/protocols and /etc/services.
var agentPackages = []string{
	"iptables", "libxtables12", "libip4tc2", "libip6tc2", "libmnl0", "libnftnl11",
	"libnetfilter-conntrack3", "libnfnetlink0", "libc6", "netbase",
}

// testbedPackages are the Debian packages the real-node test bed's images
// name (testbed.go): busybox and agnhost's tools. The lock also pins the
// libraries those tools need (libraryClosure, computed at relock).
var testbedPackages = append([]string{"busybox-static"}, agnhostTools...)

// namedPackages is every package debian.lock pins by name.
func namedPackages() []string { return append(slices.Clone(agentPackages), testbedPackages...) }

const multiarch = "usr/lib/x86_64-linux-gnu"

// libDirs are where the dynamic linker looks without an ld.so.cache
// (Debian's glibc searches the multiarch directories by default).
var libDirs = []string{multiarch, "usr/lib"}

// iptablesTools are the commands the agent runs (dataplane/kernel/linux
// iptables.go): `iptables --version` for the default backend,
// iptables-legacy / iptables-nft and their -save/-restore, and the ip6tables
// twins.
var iptablesTools = func() []string {
	var out []string
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			out = append(out, base+suffix)
		}
	}
	return out
}()

// splitTool splits "iptables-save" into "iptables" and "-save".
func splitTool(tool string) (base, suffix string) {
	base, s, ok := strings.Cut(tool, "-")
	if ok {
		suffix = "-" + s
	}
	return base, suffix
}

// keepFromDeb says which files of a package go into the image (after the
// /lib -> /usr/lib canonicalization) and is the whole selection policy.
func keepFromDeb(pkg, p string) bool {
	if p == "usr/share/doc/"+pkg+"/copyright" {
		return true
	}
	switch pkg {
	case "iptables":
		switch {
		case p == "usr/sbin/xtables-legacy-multi", p == "usr/sbin/xtables-nft-multi":
			return true
		case strings.HasPrefix(p, "usr/sbin/"):
			name := strings.TrimPrefix(p, "usr/sbin/")
			for _, tool := range iptablesTools {
				base, suffix := splitTool(tool)
				if name == base+"-legacy"+suffix || name == base+"-nft"+suffix {
					return true
				}
			}
			return false
		case strings.HasPrefix(p, multiarch+"/xtables/"):
			// Extensions of iptables and ip6tables; not ebtables/arptables.
			name := path.Base(p)
			return strings.HasPrefix(name, "libxt_") || strings.HasPrefix(name, "libipt_") || strings.HasPrefix(name, "libip6t_")
		}
		return false
	case "libc6":
		switch p {
		case "usr/lib64/ld-linux-x86-64.so.2", multiarch + "/ld-linux-x86-64.so.2", multiarch + "/libc.so.6", multiarch + "/libm.so.6":
			return true
		}
		return false
	case "netbase":
		return p == "etc/protocols" || p == "etc/services"
	default: // the libraries: their shared objects and soname links
		return path.Dir(p) == multiarch && strings.Contains(path.Base(p), ".so")
	}
}

// canonical maps a package path onto the merged-/usr layout of the image
// (bin, sbin, lib, lib64 are symlinks into usr/).
func canonical(p string) string {
	for _, top := range []string{"bin", "sbin", "lib", "lib64"} {
		if p == top || strings.HasPrefix(p, top+"/") {
			return "usr/" + p
		}
	}
	return p
}

// lockEntry pins one .deb: the exact version and the file's sha256.
// Library marks a package the lock holds because agnhost's tools need its
// shared objects (libraryClosure), not because an image names it.
type lockEntry struct {
	Package, Version, File, SHA256 string
	Library                        bool
}

func readLock(file string) ([]lockEntry, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []lockEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 && (len(f) != 5 || f[4] != "library") {
			return nil, fmt.Errorf("%s:%d: want 'package version file sha256 [library]', got %q", file, n, line)
		}
		out = append(out, lockEntry{Package: f[0], Version: f[1], File: f[2], SHA256: f[3], Library: len(f) == 5})
	}
	return out, sc.Err()
}

func writeLock(file string, entries []lockEntry) error {
	var b strings.Builder
	b.WriteString("# The Debian packages of the vsplane-agent image and the test bed's images (scripts/images), exactly.\n")
	b.WriteString("# Regenerate with `make images-relock` (apt's current candidates); commit the result.\n")
	b.WriteString("# package version file sha256 [library: pinned for the shared objects agnhost's tools need]\n")
	for _, e := range entries {
		fmt.Fprintf(&b, "%s %s %s %s", e.Package, e.Version, e.File, e.SHA256)
		if e.Library {
			b.WriteString(" library")
		}
		b.WriteString("\n")
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

func fileSHA256(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// aptDownload runs `apt-get download spec` in a fresh directory below
// cacheDir and returns the one .deb it fetched. A first failure (e.g. no
// package lists yet on a fresh machine) is retried once after apt-get update.
func aptDownload(cacheDir, spec string, logf func(string, ...any)) (string, error) {
	tmp, err := os.MkdirTemp(cacheDir, "dl.")
	if err != nil {
		return "", err
	}
	// apt's sandbox user (_apt) may then read the directory.
	_ = os.Chmod(tmp, 0o755)
	run := func(args ...string) ([]byte, error) {
		cmd := exec.Command("apt-get", args...)
		cmd.Dir = tmp
		return cmd.CombinedOutput()
	}
	out, err := run("-q", "download", spec)
	if err != nil {
		logf("apt-get download %s failed (%v); running apt-get update once", spec, err)
		if uout, uerr := run("-q", "-o", "DPkg::Lock::Timeout=600", "update"); uerr != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("apt-get update: %v\n%s", uerr, uout)
		}
		out, err = run("-q", "download", spec)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("apt-get download %s: %v\n%s", spec, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("apt-get download %s left %d .deb files", spec, len(debs))
	}
	return debs[0], nil
}

// relock resolves every package to apt's current candidate, downloads it
// into the cache and returns the new lock.
func relock(cacheDir string, pkgs []string, logf func(string, ...any)) ([]lockEntry, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	var out []lockEntry
	for _, pkg := range pkgs {
		deb, err := aptDownload(cacheDir, pkg, logf)
		if err != nil {
			return nil, err
		}
		sum, err := fileSHA256(deb)
		if err != nil {
			return nil, err
		}
		ver, err := exec.Command("dpkg-deb", "--field", deb, "Version").Output()
		if err != nil {
			return nil, fmt.Errorf("dpkg-deb --field %s Version: %w", deb, err)
		}
		e := lockEntry{Package: pkg, Version: strings.TrimSpace(string(ver)), File: filepath.Base(deb), SHA256: sum}
		if err := os.Rename(deb, filepath.Join(cacheDir, e.File)); err != nil {
			return nil, err
		}
		os.RemoveAll(filepath.Dir(deb))
		out = append(out, e)
		logf("pinned %s %s", e.Package, e.Version)
	}
	return out, nil
}

// fetchLocked returns the cached .deb of every lock entry, downloading the
// pinned version where the cache lacks it; every file's sha256 must match.
func fetchLocked(cacheDir string, lock []lockEntry, logf func(string, ...any)) (map[string]string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range lock {
		dst := filepath.Join(cacheDir, e.File)
		if sum, err := fileSHA256(dst); err == nil && sum == e.SHA256 {
			out[e.Package] = dst
			continue
		}
		logf("downloading %s=%s", e.Package, e.Version)
		deb, err := aptDownload(cacheDir, e.Package+"="+e.Version, logf)
		if err != nil {
			return nil, fmt.Errorf("%w\nthe pinned %s %s is not served any more: run `make images-relock` to pin the current Debian versions (and commit scripts/images/debian.lock)", err, e.Package, e.Version)
		}
		sum, err := fileSHA256(deb)
		if err != nil {
			return nil, err
		}
		if sum != e.SHA256 {
			os.RemoveAll(filepath.Dir(deb))
			return nil, fmt.Errorf("%s %s: downloaded sha256 %s, the lock says %s", e.Package, e.Version, sum, e.SHA256)
		}
		if err := os.Rename(deb, dst); err != nil {
			return nil, err
		}
		os.RemoveAll(filepath.Dir(deb))
		out[e.Package] = dst
	}
	return out, nil
}

// checkLockCovers fails unless the lock pins every package of pkgs, and
// besides them only libraries (the tools' closure).
func checkLockCovers(lock []lockEntry, pkgs []string) error {
	have := map[string]bool{}
	for _, e := range lock {
		have[e.Package] = true
		if !slices.Contains(pkgs, e.Package) && !e.Library {
			return fmt.Errorf("the lock pins %s, which no image uses: run `make images-relock`", e.Package)
		}
	}
	for _, p := range pkgs {
		if !have[p] {
			return fmt.Errorf("the lock does not pin %s, which an image needs: run `make images-relock`", p)
		}
	}
	return nil
}

// closureLibraries are the lock's library entries.
func closureLibraries(lock []lockEntry) []string {
	var out []string
	for _, e := range lock {
		if e.Library {
			out = append(out, e.Package)
		}
	}
	return out
}

// debFile returns one file of a .deb's data archive (p relative, as in the
// package: "bin/busybox").
func debFile(deb, p, tmp string) ([]byte, error) {
	dir, err := os.MkdirTemp(tmp, "deb.")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if out, err := exec.Command("dpkg-deb", "-x", deb, dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, p))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(deb), err)
	}
	return data, nil
}

// addDeb adds the files keep selects from a .deb's data archive (read
// through dpkg-deb, whatever its compression) to t, root-owned, with the
// package's modes and symlinks.
func addDeb(t *tree, pkg, deb string, keep func(pkg, p string) bool) (int, error) {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("dpkg-deb (Debian's dpkg): %w", err)
	}
	n := 0
	tr := tar.NewReader(stdout)
	var readErr error
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = err
			break
		}
		p, err := cleanPath(h.Name)
		if err != nil {
			continue // "./"
		}
		p = canonical(p)
		if h.Typeflag == tar.TypeDir || !keep(pkg, p) {
			continue
		}
		switch h.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				readErr = err
			} else {
				readErr = t.file(p, h.Mode&0o7777, data)
			}
		case tar.TypeSymlink:
			readErr = t.symlink(p, h.Linkname)
		default:
			readErr = fmt.Errorf("%s: unsupported tar entry type %q", p, h.Typeflag)
		}
		if readErr != nil {
			break
		}
		n++
	}
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil && readErr == nil {
		readErr = fmt.Errorf("dpkg-deb --fsys-tarfile %s: %v: %s", deb, err, stderr.String())
	}
	if readErr != nil {
		return n, fmt.Errorf("%s: %w", filepath.Base(deb), readErr)
	}
	if n == 0 {
		return 0, fmt.Errorf("%s: no file of %s selected", filepath.Base(deb), pkg)
	}
	return n, nil
}
