// Package images builds vsplane's OCI images with the project's own builder
// (scripts/images, `make images`) and unpacks them into root filesystems
// with nothing but the standard library, checking every blob's digest and
// every layer's diff ID on the way: what a container runtime does before it
// starts a container. Its tests run those root filesystems (see
// images_test.go).
package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vsplane/vsplane/e2e/imagebuild"
)

// Image is one image the builder printed (see imagebuild.Image).
type Image = imagebuild.Image

// Build runs the image builder (scripts/images, its own Go module) for the
// checkout at root, writing into out, and returns the images it printed.
// The builder's stderr (progress) is returned too.
func Build(ctx context.Context, root, out string, env ...string) ([]Image, string, error) {
	return imagebuild.Build(ctx, root, out, nil, env...)
}

// Config is the part of an OCI image config a runtime uses to start it.
type Config struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Created      string `json:"created"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Env        []string          `json:"Env"`
		User       string            `json:"User"`
		WorkingDir string            `json:"WorkingDir"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// Layout is an image in an OCI image layout directory.
type Layout struct {
	Dir      string
	Manifest descriptor
	Config   Config
	Layers   []descriptor
}

// OpenLayout reads the one image of an OCI layout directory, checking the
// digests and sizes of its manifest and config.
func OpenLayout(dir string) (*Layout, error) {
	var marker struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := readJSON(filepath.Join(dir, "oci-layout"), &marker); err != nil || marker.Version != "1.0.0" {
		return nil, fmt.Errorf("%s: not an OCI image layout (oci-layout: %+v, %v)", dir, marker, err)
	}
	var index struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Manifests     []descriptor `json:"manifests"`
	}
	if err := readJSON(filepath.Join(dir, "index.json"), &index); err != nil {
		return nil, err
	}
	if index.SchemaVersion != 2 || len(index.Manifests) != 1 {
		return nil, fmt.Errorf("%s/index.json: want schemaVersion 2 and one manifest, got %d and %d", dir, index.SchemaVersion, len(index.Manifests))
	}
	l := &Layout{Dir: dir, Manifest: index.Manifests[0]}
	if l.Manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" {
		return nil, fmt.Errorf("%s: manifest media type %q", dir, l.Manifest.MediaType)
	}
	var manifest struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Config        descriptor   `json:"config"`
		Layers        []descriptor `json:"layers"`
	}
	if err := l.readBlobJSON(l.Manifest, &manifest); err != nil {
		return nil, err
	}
	if manifest.Config.MediaType != "application/vnd.oci.image.config.v1+json" {
		return nil, fmt.Errorf("%s: config media type %q", dir, manifest.Config.MediaType)
	}
	if err := l.readBlobJSON(manifest.Config, &l.Config); err != nil {
		return nil, err
	}
	l.Layers = manifest.Layers
	if len(l.Layers) == 0 || len(l.Layers) != len(l.Config.RootFS.DiffIDs) {
		return nil, fmt.Errorf("%s: %d layers, %d diff IDs", dir, len(l.Layers), len(l.Config.RootFS.DiffIDs))
	}
	return l, nil
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

func (l *Layout) blobPath(d descriptor) (string, error) {
	alg, hex, ok := strings.Cut(d.Digest, ":")
	if !ok || alg != "sha256" || len(hex) != 64 {
		return "", fmt.Errorf("bad digest %q", d.Digest)
	}
	return filepath.Join(l.Dir, "blobs", alg, hex), nil
}

// readBlob returns a blob's content after checking its size and digest.
func (l *Layout) readBlob(d descriptor) ([]byte, error) {
	p, err := l.blobPath(d)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s: %d bytes, descriptor says %d", d.Digest, len(b), d.Size)
	}
	if got := digestOf(b); got != d.Digest {
		return nil, fmt.Errorf("blob %s has digest %s", d.Digest, got)
	}
	return b, nil
}

func (l *Layout) readBlobJSON(d descriptor, v any) error {
	b, err := l.readBlob(d)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// Unpack extracts the layers in order into dst (created), as a runtime
// would: files, directories and symlinks with their modes and numeric
// owners. Each layer's uncompressed digest must equal its diff ID. Paths
// leaving dst, writes through a symlink, whiteouts and hard links are
// errors (the builder makes none).
func (l *Layout) Unpack(dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for i, d := range l.Layers {
		if d.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			return fmt.Errorf("layer %d: media type %q", i, d.MediaType)
		}
		b, err := l.readBlob(d)
		if err != nil {
			return err
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		h := sha256.New()
		if err := untar(io.TeeReader(zr, h), dst); err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, d.Digest, err)
		}
		// The rest of the stream (tar's end padding) counts for the diff ID.
		if _, err := io.Copy(h, zr); err != nil {
			return err
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != l.Config.RootFS.DiffIDs[i] {
			return fmt.Errorf("layer %d: uncompressed digest %s, diff ID %s", i, got, l.Config.RootFS.DiffIDs[i])
		}
	}
	return nil
}

func untar(r io.Reader, dst string) error {
	tr := tar.NewReader(bufio.NewReader(r))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		rel := path.Clean(h.Name)
		if path.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Errorf("entry %q leaves the root", h.Name)
		}
		if strings.HasPrefix(path.Base(rel), ".wh.") {
			return fmt.Errorf("whiteout %q: not expected in these images", h.Name)
		}
		target := filepath.Join(dst, filepath.FromSlash(rel))
		// No parent may be a symlink: a layer must not write outside dst.
		for p := filepath.Dir(target); p != dst && strings.HasPrefix(p, dst); p = filepath.Dir(p) {
			if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
				return fmt.Errorf("entry %q is below the symlink %s", h.Name, p)
			}
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(target, 0o700); err != nil && !os.IsExist(err) {
				return err
			}
		case tar.TypeReg:
			_ = os.Remove(target)
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.Remove(target)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: type %q not supported", h.Name, h.Typeflag)
		}
		if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeSymlink {
			// The raw mode: setuid, setgid and sticky bits included.
			if err := syscall.Chmod(target, uint32(h.Mode&0o7777)); err != nil {
				return fmt.Errorf("chmod %s: %w", target, err)
			}
		}
	}
}
