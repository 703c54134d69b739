package nodes

import (
	"archive/tar"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/vsplane/vsplane/e2e/imagebuild"
)

// Where the node disk lands in the guest and what it holds. The disk is
// mounted read-only: binaries run from it, container images are imported
// from it into each node's containerd.
const (
	guestDisk   = "/opt/vsnode"
	guestBin    = guestDisk + "/bin"
	guestCNI    = guestDisk + "/cni"
	guestImages = guestDisk + "/images"
	// ociRuntime is the OCI runtime containerd's shim runs, copied with its
	// libraries from the host (Debian's runc; scripts/vm/deps.sh installs
	// it). Debian's crun 1.8.1 refuses containerd 2.4's runtime-spec 1.3
	// ("unknown version specified").
	ociRuntime = "/usr/sbin/runc"
)

// Binaries are the host directories the disk's programs come from.
type Binaries struct {
	// Kube holds kubelet and kube-proxy (scripts/kube/build.sh).
	Kube string
	// Node holds containerd, containerd-shim-runc-v2, ctr and cni/
	// (scripts/nodes/build.sh).
	Node string
	// Runtime is the host's OCI runtime, copied with its libraries (default
	// /usr/sbin/runc; containerd's shim runs it under that path).
	Runtime string
}

var (
	// kube-proxy is the baseline proxy of the conformance runs
	// (cluster.ProxyKubeProxy); the vsplane agent comes as an image.
	kubeBinaries = []string{"kubelet", "kube-proxy"}
	nodeBinaries = []string{"containerd", "containerd-shim-runc-v2", "ctr"}
	cniPlugins   = []string{"ptp", "bridge", "host-local", "loopback", "portmap"}
)

// FindBinaries locates the kube and node binary directories under the
// repository's .cache (the newest complete one of each). A missing one is
// an error saying which script builds it, never a skip.
func FindBinaries(repoRoot string) (Binaries, error) {
	var b Binaries
	var err error
	if b.Kube, err = newestDir(filepath.Join(repoRoot, ".cache", "kube", "*", "bin"), kubeBinaries); err != nil {
		return b, fmt.Errorf("nodes: %w (run scripts/kube/build.sh)", err)
	}
	need := append(append([]string{}, nodeBinaries...), prefixed("cni/", cniPlugins)...)
	if b.Node, err = newestDir(filepath.Join(repoRoot, ".cache", "nodes", "*", "bin"), need); err != nil {
		return b, fmt.Errorf("nodes: %w (run scripts/nodes/build.sh)", err)
	}
	return b, nil
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

func newestDir(pattern string, files []string) (string, error) {
	matches, _ := filepath.Glob(pattern)
	sort.Sort(sort.Reverse(sort.StringSlice(matches)))
	for _, m := range matches {
		ok := true
		for _, f := range files {
			if st, err := os.Stat(filepath.Join(m, f)); err != nil || st.Mode()&0o111 == 0 {
				ok = false
				break
			}
		}
		if ok {
			return m, nil
		}
	}
	return "", fmt.Errorf("no directory %s with %s", pattern, strings.Join(files, ", "))
}

// DiskImage is one container image on the disk: its OCI layout (as
// scripts/images writes it) and what the builder said it is.
type DiskImage struct {
	imagebuild.Image
	Layout string // the OCI layout directory
}

// BuildDisk writes an ext4 image at out holding the node programs (bin/,
// cni/), the OCI runtime with its libraries (root/, copied over the
// guest's /), and each image as an OCI layout archive (images/NAME.tar, so
// containerd keeps the builder's manifest digest) listed in images/index
// ("NAME REF DIGEST" lines). Needs mkfs.ext4 (e2fsprogs).
func BuildDisk(ctx context.Context, bins Binaries, images []DiskImage, out string) error {
	stage, err := os.MkdirTemp(filepath.Dir(out), "vsnode-disk-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	for _, b := range kubeBinaries {
		if err := linkOrCopy(filepath.Join(bins.Kube, b), filepath.Join(stage, "bin", b)); err != nil {
			return err
		}
	}
	for _, b := range nodeBinaries {
		if err := linkOrCopy(filepath.Join(bins.Node, b), filepath.Join(stage, "bin", b)); err != nil {
			return err
		}
	}
	for _, p := range cniPlugins {
		if err := linkOrCopy(filepath.Join(bins.Node, "cni", p), filepath.Join(stage, "cni", p)); err != nil {
			return err
		}
	}
	runtime := bins.Runtime
	if runtime == "" {
		runtime = ociRuntime
	}
	if err := copyWithLibraries(runtime, ociRuntime, filepath.Join(stage, "root")); err != nil {
		return err
	}
	var index strings.Builder
	for _, img := range images {
		name := img.Name()
		if err := tarDir(img.Layout, filepath.Join(stage, "images", name+".tar")); err != nil {
			return fmt.Errorf("image %s: %w", img.Ref, err)
		}
		fmt.Fprintf(&index, "%s %s %s\n", name, img.Ref, img.Digest)
	}
	if err := os.WriteFile(filepath.Join(stage, "images", "index"), []byte(index.String()), 0o644); err != nil {
		return err
	}
	size, err := dirSize(stage)
	if err != nil {
		return err
	}
	// ext4's metadata and some slack: 15% plus 32 MiB.
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(out, (size*115/100+32<<20)/4096*4096); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-L", "vsnode", "-d", stage, out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 (e2fsprogs) -d %s: %w\n%s", stage, err, b)
	}
	return nil
}

// linkOrCopy hard-links src to dst (same file system), else copies it.
func linkOrCopy(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return copyFile(src, dst)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	o, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	return o.Close()
}

// copyWithLibraries copies the dynamically linked host program prog to
// root/as and the shared objects it needs (its interpreter and DT_NEEDED,
// transitively, found where Debian's loader looks) under root, at their
// merged-/usr paths.
func copyWithLibraries(prog, as, root string) error {
	seen := map[string]bool{}
	var add func(file, dst string) error
	add = func(file, dst string) error {
		real, err := filepath.EvalSymlinks(file)
		if err != nil {
			return fmt.Errorf("%s: %w (scripts/vm/deps.sh installs it)", file, err)
		}
		dst = filepath.Join(root, canonicalUsr(dst))
		if seen[dst] {
			return nil
		}
		seen[dst] = true
		if err := copyFile(real, dst); err != nil {
			return err
		}
		f, err := elf.Open(real)
		if err != nil {
			return fmt.Errorf("%s: %w", real, err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b := make([]byte, p.Filesz)
				if _, err := p.ReadAt(b, 0); err != nil {
					return err
				}
				interp := strings.TrimRight(string(b), "\x00")
				if err := add(interp, interp); err != nil {
					return err
				}
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return err
		}
		for _, l := range libs {
			found := ""
			for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib", "/lib"} {
				if _, err := os.Stat(filepath.Join(d, l)); err == nil {
					found = filepath.Join(d, l)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s, not found on this host", file, l)
			}
			if err := add(found, found); err != nil {
				return err
			}
		}
		return nil
	}
	return add(prog, as)
}

// canonicalUsr maps /lib, /lib64, /bin, /sbin onto /usr (the guest's
// layout: those are symlinks there).
func canonicalUsr(p string) string {
	for _, top := range []string{"/bin/", "/sbin/", "/lib/", "/lib64/"} {
		if strings.HasPrefix(p, top) {
			return "/usr" + p
		}
	}
	return p
}

// tarDir writes the regular files and directories under dir into a tar at
// out (paths relative to dir): an OCI layout archive for `ctr images import`.
func tarDir(dir, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	werr := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	return errors.Join(werr, tw.Close(), f.Close())
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			n += (info.Size() + 4095) / 4096 * 4096
		}
		return nil
	})
	return n, err
}
