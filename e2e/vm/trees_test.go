package vm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestAppendTrees writes a tree after an existing archive and reads both
// back with the host's cpio (what the kernel unpacks the same way):
// contents, modes, owners and symlinks survive, under the guest path.
func TestAppendTrees(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Fatalf("cpio (scripts/vm/deps.sh installs it) is needed to read the archive back: %v", err)
	}
	host := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(host, "usr", "sbin"), 0o755))
	must(os.WriteFile(filepath.Join(host, "usr", "sbin", "tool"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.Symlink("/etc/alternatives/tool", filepath.Join(host, "usr", "sbin", "link")))
	must(os.Mkdir(filepath.Join(host, "home"), 0o700))
	must(os.Chown(filepath.Join(host, "home"), 65532, 65532))
	must(os.Mkdir(filepath.Join(host, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(host, "tmp"), os.ModeSticky|0o777))

	work := t.TempDir()
	must(os.WriteFile(filepath.Join(work, "first-src"), []byte("base"), 0o644))
	cmd := exec.Command("sh", "-c", "echo first-src | cpio -o -H newc --quiet > first")
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v\n%s", err, out)
	}
	initrd := filepath.Join(work, "first")
	before, err := os.Stat(initrd)
	must(err)
	must(appendTrees(initrd, []Tree{{Host: host, Guest: "/images/x"}}))
	after, err := os.Stat(initrd)
	must(err)
	if after.Size()%512 != 0 {
		t.Errorf("initramfs size %d is not a multiple of 512", after.Size())
	}

	// cpio stops at an archive's trailer: read each archive from its offset.
	out := t.TempDir()
	cmd = exec.Command("sh", "-c", fmt.Sprintf("cpio -i -d --quiet < %[1]s && tail -c +%[2]d %[1]s | cpio -i -d --quiet", initrd, before.Size()+1))
	cmd.Dir = out
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("read back: %v\n%s", err, b)
	}
	if b, err := os.ReadFile(filepath.Join(out, "first-src")); err != nil || string(b) != "base" {
		t.Errorf("first archive: %q %v", b, err)
	}
	root := filepath.Join(out, "images", "x")
	if b, err := os.ReadFile(filepath.Join(root, "usr", "sbin", "tool")); err != nil || string(b) != "#!/bin/sh\necho hi\n" {
		t.Errorf("tool: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "usr", "sbin", "tool")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("tool mode: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(root, "usr", "sbin", "link")); err != nil || l != "/etc/alternatives/tool" {
		t.Errorf("link: %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp mode: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(root, "home")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("home: %v %v", fi, err)
	} else if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65532 || st.Gid != 65532 {
		t.Errorf("home owner %d:%d, want 65532:65532", st.Uid, st.Gid)
	}
}
