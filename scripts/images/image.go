package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// nonroot is the control plane's user (distroless' nonroot).
const nonroot = 65532

// imageSpec is one image: its layers (base first) and its config.
type imageSpec struct {
	Name       string // e.g. vsplane-agent: the file names in the output directory
	Ref        string // the full reference; empty: REGISTRY/NAME:TAG
	Layers     []*tree
	LayerNames []string // history: what each layer holds
	Entrypoint []string
	Cmd        []string
	User       string
	Labels     map[string]string
}

// baseTree is what both images hold besides their own files: root and
// nonroot (65532) in /etc/passwd and /etc/group, /tmp, /run and nonroot's home.
func baseTree() (*tree, error) {
	t := newTree()
	steps := []error{
		t.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")),
		t.file("etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n")),
		t.dir("root", 0o700),
		t.dir("tmp", 0o1777),
		t.dir("run", 0o755),
		t.add(entry{Path: "home/nonroot", Type: tar.TypeDir, Mode: 0o700, UID: nonroot, GID: nonroot}),
	}
	for _, err := range steps {
		if err != nil {
			return nil, err
		}
	}
	return t, nil
}

// agentBase is the agent image's Debian layer: baseTree, the merged-/usr
// links, iptables and ip6tables in both variants with their libraries, the
// Debian alternatives pointing the plain names at nft (Debian's default;
// the agent picks the backend that holds the host's rules, see
// dataplane/kernel/linux/iptables.go), and mount points a runtime fills.
func agentBase(debs map[string]string, logf func(string, ...any)) (*tree, error) {
	t, err := baseTree()
	if err != nil {
		return nil, err
	}
	for _, top := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := t.symlink(top, "usr/"+top); err != nil {
			return nil, err
		}
		if err := t.dir("usr/"+top, 0o755); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"proc", "sys", "dev"} {
		if err := t.dir(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, pkg := range agentPackages {
		n, err := addDeb(t, pkg, debs[pkg], keepFromDeb)
		if err != nil {
			return nil, err
		}
		logf("%-24s %3d files from %s", pkg, n, filepath.Base(debs[pkg]))
	}
	for _, tool := range iptablesTools {
		base, suffix := splitTool(tool)
		nft := "/usr/sbin/" + base + "-nft" + suffix
		if err := t.symlink("etc/alternatives/"+tool, nft); err != nil {
			return nil, err
		}
		if err := t.symlink("usr/sbin/"+tool, "/etc/alternatives/"+tool); err != nil {
			return nil, err
		}
	}
	if err := t.checkELF(libDirs); err != nil {
		return nil, err
	}
	for _, tool := range iptablesTools {
		for _, v := range []string{"", "-legacy", "-nft"} {
			base, suffix := splitTool(tool)
			p := "usr/sbin/" + base + v + suffix
			if e, err := t.resolve(p); err != nil || e.Type != tar.TypeReg || e.Mode&0o111 == 0 {
				return nil, fmt.Errorf("%s does not resolve to an executable in the image: %v", p, err)
			}
		}
	}
	return t, nil
}

// binaryTree is a layer holding one static executable at /name.
func binaryTree(name string, data []byte) (*tree, error) {
	t := newTree()
	return t, t.file(name, 0o755, data)
}

// build assembles the image: OCI media types, one gzip layer per tree,
// every timestamp at mtime.
func (s imageSpec) build(mtime time.Time) (v1.Image, error) {
	if _, err := merged(s.Layers...); err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	created := v1.Time{Time: mtime}
	cfg := &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      created,
		Config: v1.Config{
			Entrypoint: s.Entrypoint,
			Cmd:        s.Cmd,
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			User:       s.User,
			WorkingDir: "/",
			Labels:     s.Labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	var adds []mutate.Addendum
	for i, t := range s.Layers {
		data, err := t.tarball(mtime)
		if err != nil {
			return nil, fmt.Errorf("%s layer %d: %w", s.Name, i, err)
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithCompressionLevel(gzip.BestCompression), tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{Created: created, CreatedBy: "scripts/images: " + s.LayerNames[i]}})
	}
	return mutate.Append(img, adds...)
}

// write stores img as an OCI layout in dir (replaced) and as a
// `docker save`-style tarball, both naming it ref (REGISTRY/NAME:TAG).
func write(img v1.Image, ref, dir, tarFile string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	// ref.name is the tag (skopeo's oci:DIR:TAG), containerd's key the full name (ctr import).
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": r.Identifier(),
		"io.containerd.image.name":          r.Name(),
	})); err != nil {
		return err
	}
	tmp := tarFile + ".tmp"
	if err := tarball.WriteToFile(tmp, r, img); err != nil {
		return err
	}
	return os.Rename(tmp, tarFile)
}
