package vm

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// Tree is a host directory copied into the guest at Guest (an absolute
// path) before it boots: files, directories and symlinks with their modes
// and numeric owners (e.g. a container image's unpacked root filesystem).
type Tree struct {
	Host  string
	Guest string
}

// appendTrees appends one newc cpio archive holding trees to the initramfs
// file: the kernel unpacks concatenated archives in order, after the base
// and the Go binaries. The file's size is a multiple of 512 (cpio's block),
// so the archive starts aligned.
func appendTrees(initrd string, trees []Tree) error {
	if len(trees) == 0 {
		return nil
	}
	f, err := os.OpenFile(initrd, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	cw := &cpioWriter{w: w, n: st.Size(), ino: 1 << 20}
	// Zeros between archives are skipped; a header must start 4-aligned.
	if err := cw.pad(512); err != nil {
		return err
	}
	dirs := map[string]bool{}
	for _, t := range trees {
		if !path.IsAbs(t.Guest) || path.Clean(t.Guest) == "/" {
			return fmt.Errorf("vm: tree guest path %q must be an absolute path below /", t.Guest)
		}
		dst := strings.TrimPrefix(path.Clean(t.Guest), "/")
		// The guest path's parents, in case the base lacks them.
		var parents []string
		for d := path.Dir(dst); d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if !dirs[d] {
				dirs[d] = true
				if err := cw.entry(d, syscall.S_IFDIR|0o755, 0, 0, nil); err != nil {
					return err
				}
			}
		}
		err := filepath.WalkDir(t.Host, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(t.Host, p)
			if err != nil {
				return err
			}
			name := path.Join(dst, filepath.ToSlash(rel))
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				return fmt.Errorf("vm: no owner of %s", p)
			}
			mode := uint32(fi.Mode().Perm())
			if fi.Mode()&fs.ModeSetuid != 0 {
				mode |= syscall.S_ISUID
			}
			if fi.Mode()&fs.ModeSetgid != 0 {
				mode |= syscall.S_ISGID
			}
			if fi.Mode()&fs.ModeSticky != 0 {
				mode |= syscall.S_ISVTX
			}
			switch {
			case fi.IsDir():
				dirs[name] = true
				return cw.entry(name, syscall.S_IFDIR|mode, st.Uid, st.Gid, nil)
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				return cw.entry(name, syscall.S_IFLNK|0o777, st.Uid, st.Gid, []byte(target))
			case fi.Mode().IsRegular():
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				return cw.entry(name, syscall.S_IFREG|mode, st.Uid, st.Gid, data)
			default:
				return fmt.Errorf("vm: %s: only files, directories and symlinks can be copied into the guest", p)
			}
		})
		if err != nil {
			return fmt.Errorf("vm: tree %s: %w", t.Host, err)
		}
	}
	if err := cw.trailer(); err != nil {
		return err
	}
	return w.Flush()
}

// cpioWriter writes the newc ("070701") format the kernel's initramfs
// unpacker reads.
type cpioWriter struct {
	w   io.Writer
	n   int64 // bytes written
	ino uint32
}

func (c *cpioWriter) write(b []byte) error {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return err
}

func (c *cpioWriter) pad(to int64) error {
	if r := c.n % to; r != 0 {
		return c.write(make([]byte, to-r))
	}
	return nil
}

func (c *cpioWriter) entry(name string, mode, uid, gid uint32, data []byte) error {
	c.ino++
	nlink := 1
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, uid, gid, nlink, 0 /* mtime */, len(data), 0, 0, 0, 0, len(name)+1, 0)
	if err := c.write([]byte(hdr + name + "\x00")); err != nil {
		return err
	}
	if err := c.pad(4); err != nil {
		return err
	}
	if err := c.write(data); err != nil {
		return err
	}
	return c.pad(4)
}

func (c *cpioWriter) trailer() error {
	c.ino = 0
	if err := c.entry("TRAILER!!!", 0, 0, 0, nil); err != nil {
		return err
	}
	return c.pad(512)
}
