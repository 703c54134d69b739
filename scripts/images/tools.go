package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"slices"
	"strings"
)

// agnhostTools are the Debian packages of the commands upstream's agnhost
// image installs from Alpine for the e2e specs (test/images/agnhost/
// Dockerfile): dig and nslookup, curl, OpenBSD nc, ip and ss, bash, socat.
// Left out: iperf (the IPerf2 specs) and util-linux-misc (ipcs, SELinux
// specs), which the sig-network Services specs do not run.
// dash is /bin/sh (see testbedSpecs). GNU wget stands in for the busybox
// applet: Debian's busybox before 1.36.1-5 is built without wget's -T
// (CONFIG_FEATURE_WGET_TIMEOUT) and segfaults on it, and the specs'
// `wget -q -O - -T 1` (verifyServeHostnameServiceUp, checkReachabilityFromPod)
// needs it; Alpine's busybox, upstream's, has it.
var agnhostTools = []string{"bash", "dash", "curl", "netcat-openbsd", "iproute2", "bind9-dnsutils", "socat", "wget"}

// toolAlternatives are the links Debian's maintainer scripts would make
// (update-alternatives runs at install, not in the package's files), and
// /bin/sh.
var toolAlternatives = map[string]string{"usr/bin/nc": "nc.openbsd", "bin/sh": "/usr/bin/dash"}

// keepTool selects a tool package's commands (usr/bin, usr/sbin after
// canonical), ip's configuration (/etc/iproute2) and the copyright.
func keepTool(pkg, p string) bool {
	switch {
	case p == "usr/share/doc/"+pkg+"/copyright":
		return true
	case strings.HasPrefix(p, "usr/bin/"), strings.HasPrefix(p, "usr/sbin/"):
		return true
	case strings.HasPrefix(p, "etc/iproute2/"):
		return true
	}
	return false
}

// keepLibrary selects a library package's shared objects and soname links
// in the multiarch directory, the dynamic loader, and the copyright.
func keepLibrary(pkg, p string) bool {
	switch {
	case p == "usr/share/doc/"+pkg+"/copyright":
		return true
	case p == "usr/lib64/ld-linux-x86-64.so.2":
		return true
	case path.Dir(p) == multiarch && strings.Contains(path.Base(p), ".so"):
		return true
	}
	return false
}

// elfNeeds lists the sonames the ELF files among a .deb's kept files need.
func elfNeeds(deb string, keep func(p string) bool) (needs, provides []string, err error) {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		p, err := cleanPath(h.Name)
		if err != nil {
			continue
		}
		p = canonical(p)
		if !keep(p) {
			continue
		}
		if path.Dir(p) == multiarch && strings.Contains(path.Base(p), ".so") {
			provides = append(provides, path.Base(p))
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, err
		}
		if !bytes.HasPrefix(data, []byte("\x7fELF")) {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return nil, nil, fmt.Errorf("%s in %s: %w", p, deb, err)
		}
		libs, _ := f.ImportedLibraries()
		f.Close()
		needs = append(needs, libs...)
	}
	return needs, provides, nil
}

// libraryClosure finds, among the recursive dependencies of the tools, the
// library packages that provide every shared object the tools need
// (transitively): what the agnhost image must carry, and nothing more.
func libraryClosure(cacheDir string, tools []string, logf func(string, ...any)) ([]string, error) {
	args := append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances"}, tools...)
	out, err := exec.Command("apt-cache", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache depends: %w", err)
	}
	var candidates []string
	for _, l := range strings.Split(string(out), "\n") {
		if l == "" || strings.HasPrefix(l, " ") || strings.HasPrefix(l, "<") || slices.Contains(tools, l) {
			continue
		}
		if !slices.Contains(candidates, l) {
			candidates = append(candidates, l)
		}
	}
	slices.Sort(candidates)
	// Which candidate provides which soname (each downloaded once, kept in
	// the cache for the lock).
	provider := map[string]string{}
	debs := map[string]string{}
	for _, c := range candidates {
		deb, err := aptDownload(cacheDir, c, logf)
		if err != nil {
			return nil, err
		}
		debs[c] = deb
		_, provides, err := elfNeeds(deb, func(p string) bool { return keepLibrary(c, p) })
		if err != nil {
			return nil, err
		}
		for _, so := range provides {
			if _, ok := provider[so]; !ok {
				provider[so] = c
			}
		}
	}
	chosen := map[string]bool{}
	var queue []string
	for _, t := range tools {
		deb, err := aptDownload(cacheDir, t, logf)
		if err != nil {
			return nil, err
		}
		needs, _, err := elfNeeds(deb, func(p string) bool { return keepTool(t, p) })
		if err != nil {
			return nil, err
		}
		queue = append(queue, needs...)
	}
	seen := map[string]bool{}
	for len(queue) > 0 {
		so := queue[0]
		queue = queue[1:]
		if seen[so] {
			continue
		}
		seen[so] = true
		pkg, ok := provider[so]
		if !ok {
			return nil, fmt.Errorf("no library package among the tools' dependencies provides %s", so)
		}
		if chosen[pkg] {
			continue
		}
		chosen[pkg] = true
		needs, _, err := elfNeeds(debs[pkg], func(p string) bool { return keepLibrary(pkg, p) })
		if err != nil {
			return nil, err
		}
		queue = append(queue, needs...)
	}
	return slices.Sorted(func(yield func(string) bool) {
		for p := range chosen {
			if !yield(p) {
				return
			}
		}
	}), nil
}
