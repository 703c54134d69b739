package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vsplane/vsplane/e2e/measure"
)

// ErrDepsMissing is wrapped by Boot's error when the host lacks QEMU, socat or
// the unpacked kernel; scripts/vm/deps.sh installs them.
var ErrDepsMissing = errors.New("VM test bed dependencies missing: run scripts/vm/deps.sh")

// kernelImage returns the uncompressed vmlinux unpacked by deps.sh.
func kernelImage(cacheDir string) (string, error) {
	k := filepath.Join(cacheDir, "kernel", "vmlinux")
	if _, err := os.Stat(filepath.Join(cacheDir, "kernel", ".done")); err != nil {
		return "", fmt.Errorf("%w (no kernel in %s)", ErrDepsMissing, filepath.Join(cacheDir, "kernel"))
	}
	if _, err := os.Stat(k); err != nil {
		return "", fmt.Errorf("%w (no %s)", ErrDepsMissing, k)
	}
	return k, nil
}

// checkHostTools reports every missing host program at once.
func checkHostTools(qemu string) error {
	var missing []string
	for _, t := range []string{qemu, "socat", "cpio", "depmod", "busybox", "ipvsadm", "ipset"} {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w (not found: %s)", ErrDepsMissing, strings.Join(missing, ", "))
	}
	return nil
}

// goBuild builds static binaries of the given packages (import paths or
// ./relative to root) into dir, returning their paths.
func goBuild(ctx context.Context, root, dir string, pkgs []string) ([]string, error) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			return nil, fmt.Errorf("no go toolchain to build guest binaries: %w", err)
		}
	}
	args := append([]string{"build", "-trimpath", "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	bins := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		bins = append(bins, filepath.Join(dir, filepath.Base(p)))
	}
	return bins, nil
}

// buildInitramfs runs scripts/vm/build-initramfs.sh (cached base + bins).
func buildInitramfs(ctx context.Context, root, cacheDir, out string, bins []string) error {
	script := filepath.Join(root, "scripts", "vm", "build-initramfs.sh")
	args := append([]string{script, "-o", out}, bins...)
	cmd := exec.CommandContext(ctx, "bash", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "VSPLANE_VM_CACHE="+cacheDir)
	if outb, err := cmd.CombinedOutput(); err != nil {
		msg := string(outb)
		if strings.Contains(msg, "deps.sh") {
			return fmt.Errorf("%w: %s", ErrDepsMissing, strings.TrimSpace(msg))
		}
		return fmt.Errorf("build-initramfs.sh: %w\n%s", err, msg)
	}
	return nil
}

// BuildStatic builds static binaries of the vsplane packages pkgs (./relative
// to the repository root) into dir and returns their paths: for host
// processes of a test (control-plane replicas), built like the guest's.
func BuildStatic(ctx context.Context, dir string, pkgs ...string) ([]string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root, err := measure.RepoRoot(wd)
	if err != nil {
		return nil, err
	}
	return goBuild(ctx, root, dir, pkgs)
}

// BuildStaticIn is BuildStatic from the Go module at root instead of this
// repository's checkout: e.g. an earlier commit of it unpacked elsewhere
// (e2e/skew builds the other side of a version skew so).
func BuildStaticIn(ctx context.Context, root, dir string, pkgs ...string) ([]string, error) {
	return goBuild(ctx, root, dir, pkgs)
}
