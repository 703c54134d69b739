// Package imagebuild runs the project's image builder (scripts/images, its
// own Go module; `make images`) for tests: vsplane's images, or with
// -testbed the real-node test bed's (pause, busybox, agnhost, CoreDNS, regression-issue-74839).
package imagebuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
)

// Image is one image the builder printed: its reference and manifest
// digest. Its OCI layout is OUT/Name() and its docker-save tarball
// OUT/Name().tar.
type Image struct {
	Ref    string // e.g. ghcr.io/vsplane/vsplane-agent:dev
	Digest string // sha256:...
}

// Name is the last path element of Ref without the tag (vsplane-agent).
func (i Image) Name() string {
	n := path.Base(i.Ref)
	n, _, _ = strings.Cut(n, ":")
	return n
}

// Build runs the image builder for the checkout at root, writing into out,
// with extra builder flags args (e.g. -testbed), and returns the images it
// printed and its stderr (progress).
func Build(ctx context.Context, root, out string, args []string, env ...string) ([]Image, string, error) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			return nil, "", fmt.Errorf("no go toolchain: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, goBin, append([]string{"run", ".", "-repo", root, "-out", out}, args...)...)
	cmd.Dir = filepath.Join(root, "scripts", "images")
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String(), fmt.Errorf("scripts/images %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var imgs []Image
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		ref, dig, ok := strings.Cut(l, "@")
		if !ok || !strings.HasPrefix(dig, "sha256:") {
			return nil, stderr.String(), fmt.Errorf("scripts/images printed %q, want REF@sha256:...", l)
		}
		imgs = append(imgs, Image{Ref: ref, Digest: dig})
	}
	return imgs, stderr.String(), nil
}
