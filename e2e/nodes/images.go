package nodes

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/vsplane/vsplane/e2e/imagebuild"
)

// BuildImages returns every image the real nodes need: vsplane's two, built
// from the checkout into workDir (so the nodes run the code under test), and
// the test bed's (pause, busybox, agnhost, CoreDNS, regression-issue-74839), built once per change of
// their inputs into repoRoot/.cache/images/testbed-KEY (about 1.5 minutes
// cold: agnhost and CoreDNS compile from their modules).
func BuildImages(ctx context.Context, repoRoot, workDir string) ([]DiskImage, error) {
	out := filepath.Join(workDir, "images")
	imgs, _, err := imagebuild.Build(ctx, repoRoot, out, nil)
	if err != nil {
		return nil, err
	}
	all := withLayouts(imgs, out)
	tb, err := testbedImages(ctx, repoRoot)
	if err != nil {
		return nil, err
	}
	return append(all, tb...), nil
}

func withLayouts(imgs []imagebuild.Image, dir string) []DiskImage {
	out := make([]DiskImage, len(imgs))
	for i, img := range imgs {
		out[i] = DiskImage{Image: img, Layout: filepath.Join(dir, img.Name())}
	}
	return out
}

// testbedImages builds the test bed's images, or reads the cached ones.
func testbedImages(ctx context.Context, repoRoot string) ([]DiskImage, error) {
	key, err := testbedKey(repoRoot)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(repoRoot, ".cache", "images", "testbed-"+key)
	if imgs, err := readDigests(filepath.Join(dir, "testbed-digests.txt")); err == nil {
		return withLayouts(imgs, dir), nil
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	imgs, _, err := imagebuild.Build(ctx, repoRoot, tmp, []string{"-testbed"})
	if err != nil {
		return nil, err
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	// Older keys' images are dead weight.
	old, _ := filepath.Glob(filepath.Join(repoRoot, ".cache", "images", "testbed-*"))
	for _, o := range old {
		if o != dir {
			_ = os.RemoveAll(o)
		}
	}
	return withLayouts(imgs, dir), nil
}

// testbedKey hashes what the test bed's images are built from: the builder,
// its Debian lock, CoreDNS's module and main, the pinned Kubernetes module
// (agnhost, pause) and the Go version.
func testbedKey(repoRoot string) (string, error) {
	var files []string
	for _, pat := range []string{"scripts/images/*.go", "scripts/images/go.sum", "scripts/images/debian.lock",
		"scripts/images/coredns/*", "scripts/kube/apiserver/go.sum"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, pat))
		if err != nil {
			return "", err
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		fh, err := os.Open(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintln(h, filepath.Base(f))
		_, err = io.Copy(h, fh)
		fh.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// readDigests reads a builder's REF@DIGEST list.
func readDigests(file string) ([]imagebuild.Image, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []imagebuild.Image
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ref, dig, ok := strings.Cut(strings.TrimSpace(sc.Text()), "@")
		if !ok {
			return nil, fmt.Errorf("%s: bad line %q", file, sc.Text())
		}
		out = append(out, imagebuild.Image{Ref: ref, Digest: dig})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty", file)
	}
	return out, sc.Err()
}

// ImageID is the image's config digest, what the kubelet reports as a
// container's imageID for an image without registry digests (read from
// the OCI layout: index -> manifest -> config).
func (d DiskImage) ImageID() (string, error) {
	var index struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := readJSON(filepath.Join(d.Layout, "index.json"), &index); err != nil {
		return "", err
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Digest != d.Digest {
		return "", fmt.Errorf("%s: index.json does not hold exactly %s", d.Layout, d.Digest)
	}
	var manifest struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	algo, hex, _ := strings.Cut(d.Digest, ":")
	if err := readJSON(filepath.Join(d.Layout, "blobs", algo, hex), &manifest); err != nil {
		return "", err
	}
	if manifest.Config.Digest == "" {
		return "", fmt.Errorf("%s: manifest %s names no config", d.Layout, d.Digest)
	}
	return manifest.Config.Digest, nil
}

func readJSON(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}
