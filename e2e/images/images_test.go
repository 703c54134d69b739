package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vsplane/vsplane/e2e/measure"
)

// The images are built once per test binary (about 15 s with a warm Go
// cache; the first run also downloads the pinned .debs into .cache/images)
// and shared by the tests; TestImagesReproducible builds them a second time.
var shared struct {
	once   sync.Once
	dir    string
	images map[string]Image // by name (vsplane-agent, vsplane-controlplane)
	log    string
	took   time.Duration
	err    error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := measure.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// built returns the shared build's output directory and images.
func built(t *testing.T) (string, map[string]Image) {
	t.Helper()
	root := repoRoot(t)
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "vsplane-images-test-")
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		start := time.Now()
		var imgs []Image
		imgs, shared.log, shared.err = Build(ctx, root, shared.dir)
		shared.took = time.Since(start)
		shared.images = map[string]Image{}
		for _, i := range imgs {
			shared.images[i.Name()] = i
		}
	})
	if shared.err != nil {
		t.Fatalf("make images (scripts/images) failed; it needs apt-get and dpkg-deb (Debian) and the Go module proxy: %v", shared.err)
	}
	for _, n := range []string{"vsplane-agent", "vsplane-controlplane"} {
		if _, ok := shared.images[n]; !ok {
			t.Fatalf("the builder printed no %s image: %v\n%s", n, shared.images, shared.log)
		}
	}
	return shared.dir, shared.images
}

// unpack opens the named image's OCI layout in dir and unpacks it into a
// fresh directory, returning the root and the image's config.
func unpack(t *testing.T, dir string, img Image) (string, *Layout) {
	t.Helper()
	l, err := OpenLayout(filepath.Join(dir, img.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if l.Manifest.Digest != img.Digest {
		t.Fatalf("%s: the layout holds %s, the builder printed %s", img.Name(), l.Manifest.Digest, img.Digest)
	}
	if ref := l.Manifest.Annotations["io.containerd.image.name"]; ref != img.Ref {
		t.Errorf("%s: layout names the image %q, want %q", img.Name(), ref, img.Ref)
	}
	root := filepath.Join(t.TempDir(), img.Name())
	if err := l.Unpack(root); err != nil {
		t.Fatalf("unpack %s: %v", img.Name(), err)
	}
	return root, l
}

func fileSHA(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestImagesReproducible builds the images a second time into another
// directory: the same digests, byte-identical tarballs and layouts.
func TestImagesReproducible(t *testing.T) {
	dir, first := built(t)
	t.Logf("first build %v:\n%s", shared.took.Round(time.Millisecond), shared.log)
	second := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	imgs, _, err := Build(ctx, repoRoot(t), second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second build %v", time.Since(start).Round(time.Millisecond))
	if len(imgs) != len(first) {
		t.Fatalf("second build made %d images, first %d", len(imgs), len(first))
	}
	for _, img := range imgs {
		if want := first[img.Name()]; img != want {
			t.Errorf("%s: second build %s, first %s (not reproducible, or the sources changed between the builds)", img.Name(), img.Digest, want.Digest)
		}
		for _, f := range []string{img.Name() + ".tar", filepath.Join(img.Name(), "index.json")} {
			if a, b := fileSHA(t, filepath.Join(dir, f)), fileSHA(t, filepath.Join(second, f)); a != b {
				t.Errorf("%s differs between the builds: %s vs %s", f, a, b)
			}
		}
		fi, err := os.Stat(filepath.Join(second, img.Name()+".tar"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s@%s (%.1f MB tarball)", img.Ref, img.Digest, float64(fi.Size())/1e6)
	}
	digests, err := os.ReadFile(filepath.Join(second, "digests.txt"))
	if err != nil || !bytes.Contains(digests, []byte(first["vsplane-agent"].Ref+"@"+first["vsplane-agent"].Digest)) {
		t.Errorf("digests.txt: %q %v", digests, err)
	}
}

// TestDeployUsesImages: deploy/base runs the two images by the names the
// builder gives them, with each image's entrypoint, and the control plane
// as the image's user.
func TestDeployUsesImages(t *testing.T) {
	dir, imgs := built(t)
	root := repoRoot(t)
	for file, name := range map[string]string{"agent.yaml": "vsplane-agent", "controlplane.yaml": "vsplane-controlplane"} {
		l, err := OpenLayout(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(root, "deploy", "base", file))
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
			var obj struct {
				Kind string
				Spec struct {
					Template struct {
						Spec struct {
							SecurityContext struct{ RunAsUser *int64 } `json:"securityContext"`
							Containers      []struct {
								Image   string
								Command []string
							}
						}
					}
				}
			}
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if obj.Kind != "Deployment" && obj.Kind != "DaemonSet" {
				continue
			}
			found = true
			c := obj.Spec.Template.Spec.Containers[0]
			if c.Image != imgs[name].Ref {
				t.Errorf("%s runs %q, the builder makes %q", file, c.Image, imgs[name].Ref)
			}
			if !slices.Equal(c.Command, l.Config.Config.Entrypoint) {
				t.Errorf("%s: command %q, the image's entrypoint %q", file, c.Command, l.Config.Config.Entrypoint)
			}
			if u := obj.Spec.Template.Spec.SecurityContext.RunAsUser; u != nil && fmt.Sprintf("%d:%d", *u, *u) != l.Config.Config.User {
				t.Errorf("%s: runAsUser %d, the image's user %q", file, *u, l.Config.Config.User)
			}
		}
		if !found {
			t.Errorf("%s has no Deployment or DaemonSet", file)
		}
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
