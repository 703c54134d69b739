package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The images the real-node test bed (e2e/nodes) runs besides vsplane's,
// under the names Kubernetes' e2e framework and kubelet use (k8s.io/kubernetes
// v1.37.2 test/utils/image/manifest.go and the kubelet's default sandbox
// image), so Pods and upstream specs find them without a registry.
const (
	pauseRef   = "registry.k8s.io/pause:3.10.2"
	busyboxRef = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	agnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	corednsRef = "registry.k8s.io/coredns/coredns:v1.14.6"
	// boomRef is the Conntrack spec "should not be vulnerable to the
	// invalid conntrack state bug" server (kubernetes#74839): it injects an
	// out-of-window TCP packet into its own connection.
	boomRef = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
)

// kubeToolsDir is the tools module that pins k8s.io/kubernetes (agnhost and
// pause come from its sources).
func kubeToolsDir(root string) string { return filepath.Join(root, "scripts", "kube", "apiserver") }

// moduleDir is where the go command keeps module mod of the tools module in dir.
func moduleDir(ctx context.Context, dir, mod string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-mod=readonly", "-m", "-f", "{{.Dir}}", mod)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s in %s: %w", mod, dir, err)
	}
	d := strings.TrimSpace(string(out))
	if d == "" {
		// Listed but not downloaded yet.
		dl := exec.CommandContext(ctx, "go", "mod", "download", mod)
		dl.Dir = dir
		if out, err := dl.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go mod download %s: %w\n%s", mod, err, out)
		}
		return moduleDir(ctx, dir, mod)
	}
	return d, nil
}

// goBuildTool builds a main package of a tools module static and
// reproducibly, into dir/name.
func goBuildTool(ctx context.Context, modDir, pkg, out string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-mod=readonly", "-trimpath", "-ldflags=-s -w -buildid=", "-o", out, pkg)
	cmd.Dir = modDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return staticBinary(out)
}

// buildPause compiles Kubernetes' pause.c (build/pause/linux of the pinned
// module) as upstream's Makefile does: static, -Os.
func buildPause(ctx context.Context, root, tmp string) ([]byte, error) {
	k8s, err := moduleDir(ctx, kubeToolsDir(root), "k8s.io/kubernetes")
	if err != nil {
		return nil, err
	}
	out := filepath.Join(tmp, "pause")
	src := filepath.Join(k8s, "build", "pause", "linux", "pause.c")
	cmd := exec.CommandContext(ctx, "gcc", "-Os", "-Wall", "-Werror", "-static", "-s",
		"-DVERSION=v3.10.2-vsplane", "-o", out, src)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("gcc pause.c (needs gcc and libc6-dev): %w\n%s", err, b)
	}
	return staticBinary(out)
}

// busyboxTree is Debian's static busybox at /bin/busybox with a link per
// applet in /bin (what `busybox --list` of that binary names, /bin/sh
// included) except those in skip.
func busyboxTree(t *tree, deb string, tmp string, skip ...string) error {
	bb, err := debFile(deb, "bin/busybox", tmp)
	if err != nil {
		return err
	}
	if err := t.file("bin/busybox", 0o755, bb); err != nil {
		return err
	}
	bin := filepath.Join(tmp, "busybox")
	if err := os.WriteFile(bin, bb, 0o755); err != nil {
		return err
	}
	list, err := exec.Command(bin, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" || t.entries["bin/"+applet] != nil || slices.Contains(skip, applet) {
			continue
		}
		if err := t.symlink("bin/"+applet, "busybox"); err != nil {
			return err
		}
	}
	return nil
}

// toolsTree is agnhost's Debian layer: the tools' commands, the libraries
// they need (checked like ldd would, against the busybox layer below it),
// the alternatives links and the merged-/usr links for the loader.
func toolsTree(below *tree, debs map[string]string, libs []string, logf func(string, ...any)) (*tree, error) {
	t := newTree()
	for _, l := range []string{"lib", "lib64"} {
		if err := t.symlink(l, "usr/"+l); err != nil {
			return nil, err
		}
	}
	for _, pkg := range agnhostTools {
		n, err := addDeb(t, pkg, debs[pkg], keepTool)
		if err != nil {
			return nil, err
		}
		logf("agnhost: %-16s %3d files", pkg, n)
	}
	if !slices.Contains(libs, "libc6") {
		return nil, fmt.Errorf("the lock's libraries for agnhost's tools lack libc6: run `make images-relock`")
	}
	for _, pkg := range libs {
		if _, err := addDeb(t, pkg, debs[pkg], keepLibrary); err != nil {
			return nil, err
		}
	}
	for link, target := range toolAlternatives {
		if err := t.symlink(link, target); err != nil {
			return nil, err
		}
	}
	all, err := merged(below, t)
	if err != nil {
		return nil, err
	}
	if err := all.checkELF(libDirs); err != nil {
		return nil, fmt.Errorf("agnhost's tools: %w", err)
	}
	return t, nil
}

// testbedSpecs returns the test bed's images.
func testbedSpecs(root string, debs map[string]string, libs []string, logf func(string, ...any)) ([]imageSpec, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	tmp, err := os.MkdirTemp("", "vsplane-testbed-images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	t0 := time.Now()
	pause, err := buildPause(ctx, root, tmp)
	if err != nil {
		return nil, err
	}
	pauseLayer := newTree()
	if err := pauseLayer.file("pause", 0o755, pause); err != nil {
		return nil, err
	}

	bbLayer := newTree()
	if err := busyboxTree(bbLayer, debs["busybox-static"], tmp); err != nil {
		return nil, err
	}
	for _, d := range []string{"tmp"} {
		if err := bbLayer.dir(d, 0o1777); err != nil {
			return nil, err
		}
	}

	agnhost, err := goBuildTool(ctx, kubeToolsDir(root), "k8s.io/kubernetes/test/images/agnhost", filepath.Join(tmp, "agnhost"))
	if err != nil {
		return nil, err
	}
	// agnhost's /bin/sh is dash: Debian's static busybox prefers its own
	// applets in its shell, so `sh -c "nc ..."` (the specs' way) would run
	// busybox's nc, not OpenBSD's; Alpine's busybox does not. Its wget
	// gives way to GNU wget (agnhostTools).
	agnBB := newTree()
	if err := busyboxTree(agnBB, debs["busybox-static"], tmp, "sh", "wget"); err != nil {
		return nil, err
	}
	if err := agnBB.dir("tmp", 0o1777); err != nil {
		return nil, err
	}
	tools, err := toolsTree(agnBB, debs, libs, logf)
	if err != nil {
		return nil, err
	}
	agnLayer := newTree()
	if err := agnLayer.file("agnhost", 0o755, agnhost); err != nil {
		return nil, err
	}
	if err := agnLayer.symlink("agnhost-2", "agnhost"); err != nil {
		return nil, err
	}
	boom, err := goBuildTool(ctx, kubeToolsDir(root), "k8s.io/kubernetes/test/images/regression-issue-74839", filepath.Join(tmp, "regression-issue-74839"))
	if err != nil {
		return nil, err
	}
	boomLayer := newTree()
	if err := boomLayer.file("regression-issue-74839", 0o755, boom); err != nil {
		return nil, err
	}
	coredns, err := goBuildTool(ctx, filepath.Join(root, "scripts", "images", "coredns"), ".", filepath.Join(tmp, "coredns"))
	if err != nil {
		return nil, err
	}
	dnsLayer := newTree()
	if err := dnsLayer.file("coredns", 0o755, coredns); err != nil {
		return nil, err
	}
	logf("test bed binaries: %v", time.Since(t0).Round(time.Millisecond))

	return []imageSpec{
		{
			Ref: pauseRef, Name: "pause",
			Layers: []*tree{pauseLayer}, LayerNames: []string{"pause.c of k8s.io/kubernetes v1.37.2 (gcc -Os -static)"},
			Entrypoint: []string{"/pause"}, User: "65535:65535",
		},
		{
			Ref: busyboxRef, Name: "busybox",
			Layers: []*tree{bbLayer}, LayerNames: []string{"busybox from Debian's busybox-static"},
			Cmd: []string{"sh"}, User: "0:0",
		},
		{
			Ref: agnhostRef, Name: "agnhost",
			Layers: []*tree{agnBB, tools, agnLayer}, LayerNames: []string{"busybox from Debian's busybox-static (/bin/sh is dash)",
				"the e2e specs' tools from Debian: " + strings.Join(agnhostTools, " ") + " and their libraries",
				"agnhost of k8s.io/kubernetes v1.37.2 (CGO_ENABLED=0 go build -trimpath)"},
			Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, User: "0:0",
		},
		{
			// Root, unlike upstream's nonroot image with a file capability
			// for port 53: these layers carry no extended attributes.
			Ref: corednsRef, Name: "coredns",
			Layers: []*tree{dnsLayer}, LayerNames: []string{"CoreDNS v1.14.6 with the test bed's plugins (scripts/images/coredns, CGO_ENABLED=0 go build -trimpath)"},
			Entrypoint: []string{"/coredns"}, User: "0:0",
		},
		{
			// Upstream's is its static binary on debian-base; it needs
			// nothing else (a raw socket, as root).
			Ref: boomRef, Name: "regression-issue-74839",
			Layers: []*tree{boomLayer}, LayerNames: []string{"regression-issue-74839 of k8s.io/kubernetes v1.37.2 (CGO_ENABLED=0 go build -trimpath)"},
			Entrypoint: []string{"/regression-issue-74839"}, User: "0:0",
		},
	}, nil
}
