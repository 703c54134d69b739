package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
)

// entry is one file of an image layer. Paths are relative ("usr/sbin/x"),
// clean, without a leading slash.
type entry struct {
	Path string
	Type byte // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	Mode int64
	UID  int
	GID  int
	Data []byte // regular files
	Link string // symlinks
}

// tree is a set of entries keyed by path; adding a path twice is an error
// unless both are the same directory.
type tree struct {
	entries map[string]*entry
}

func newTree() *tree { return &tree{entries: map[string]*entry{}} }

func cleanPath(p string) (string, error) {
	c := path.Clean("/" + p)
	if c == "/" {
		return "", fmt.Errorf("empty path %q", p)
	}
	return c[1:], nil
}

func (t *tree) add(e entry) error {
	p, err := cleanPath(e.Path)
	if err != nil {
		return err
	}
	e.Path = p
	if old, ok := t.entries[p]; ok {
		if old.Type == tar.TypeDir && e.Type == tar.TypeDir {
			return nil
		}
		return fmt.Errorf("%s added twice", p)
	}
	switch e.Type {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
	default:
		return fmt.Errorf("%s: unsupported entry type %q", p, e.Type)
	}
	t.entries[p] = &e
	return nil
}

func (t *tree) file(p string, mode int64, data []byte) error {
	return t.add(entry{Path: p, Type: tar.TypeReg, Mode: mode, Data: data})
}

func (t *tree) dir(p string, mode int64) error {
	return t.add(entry{Path: p, Type: tar.TypeDir, Mode: mode})
}

func (t *tree) symlink(p, target string) error {
	return t.add(entry{Path: p, Type: tar.TypeSymlink, Mode: 0o777, Link: target})
}

// sorted returns every entry, the missing parent directories (0755,
// root-owned) included, in byte order of their paths: parents come first.
func (t *tree) sorted() []*entry {
	all := map[string]*entry{}
	for p, e := range t.entries {
		all[p] = e
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				if have, ok := t.entries[d]; ok {
					all[d] = have
				} else {
					all[d] = &entry{Path: d, Type: tar.TypeDir, Mode: 0o755}
				}
			}
		}
	}
	out := make([]*entry, 0, len(all))
	for _, e := range all {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *entry) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// tarball renders the tree as an uncompressed tar: entries sorted, every
// timestamp mtime, owners numeric only, no user or group names, no
// access/change times, no extended attributes. The same tree and mtime give
// the same bytes.
func (t *tree) tarball(mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range t.sorted() {
		h := &tar.Header{
			Typeflag: e.Type,
			Name:     e.Path,
			Mode:     e.Mode,
			Uid:      e.UID,
			Gid:      e.GID,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		switch e.Type {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = e.Link
		case tar.TypeReg:
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", e.Path, err)
		}
		if e.Type == tar.TypeReg {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// merged is the union of trees (later ones may not repeat a non-directory
// path of an earlier one): what the image's root filesystem holds.
func merged(trees ...*tree) (*tree, error) {
	out := newTree()
	for _, t := range trees {
		for _, e := range t.sorted() {
			if err := out.add(*e); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// resolve follows symlinks inside the tree (absolute targets are relative
// to the tree's root) and returns the regular file or directory p names.
func (t *tree) resolve(p string) (*entry, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	for hops := 0; hops < 40; hops++ {
		// Resolve the parents first: a link may sit on any component.
		parts := strings.Split(p, "/")
		cur := ""
		restarted := false
		for i, part := range parts {
			next := path.Join(cur, part)
			e, ok := t.entries[next]
			if !ok {
				if e = t.implicitDir(next); e == nil {
					return nil, fmt.Errorf("%s: no such file in the image", "/"+p)
				}
			}
			if e.Type == tar.TypeSymlink {
				target := e.Link
				if !strings.HasPrefix(target, "/") {
					target = path.Join("/"+cur, target)
				}
				rest := strings.Join(parts[i+1:], "/")
				if p, err = cleanPath(path.Join(target, rest)); err != nil {
					return nil, err
				}
				restarted = true
				break
			}
			cur = next
		}
		if !restarted {
			if e, ok := t.entries[p]; ok {
				return e, nil
			}
			return t.implicitDir(p), nil
		}
	}
	return nil, fmt.Errorf("%s: too many levels of symbolic links", p)
}

// implicitDir returns a directory entry for p if some entry lies below it.
func (t *tree) implicitDir(p string) *entry {
	for q := range t.entries {
		if strings.HasPrefix(q, p+"/") {
			return &entry{Path: p, Type: tar.TypeDir, Mode: 0o755}
		}
	}
	return nil
}

// checkELF checks that every dynamically linked ELF file of the tree finds
// its interpreter and each library it needs (DT_NEEDED) in libDirs, inside
// the tree: what ldd would say, without running anything.
func (t *tree) checkELF(libDirs []string) error {
	var errs []string
	n := 0
	for _, e := range t.sorted() {
		if e.Type != tar.TypeReg || !bytes.HasPrefix(e.Data, []byte("\x7fELF")) {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(e.Data))
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", e.Path, err))
			continue
		}
		n++
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b := make([]byte, p.Filesz)
				if _, err := p.ReadAt(b, 0); err != nil {
					errs = append(errs, fmt.Sprintf("%s: interpreter: %v", e.Path, err))
					continue
				}
				interp := strings.TrimRight(string(b), "\x00")
				if r, err := t.resolve(interp); err != nil || r.Type != tar.TypeReg {
					errs = append(errs, fmt.Sprintf("%s: interpreter %s missing", e.Path, interp))
				}
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", e.Path, err))
		}
		for _, lib := range libs {
			found := false
			for _, d := range libDirs {
				if r, err := t.resolve(path.Join(d, lib)); err == nil && r.Type == tar.TypeReg {
					found = true
					break
				}
			}
			if !found {
				errs = append(errs, fmt.Sprintf("%s needs %s: not in %v", e.Path, lib, libDirs))
			}
		}
		f.Close()
	}
	if len(errs) > 0 {
		return fmt.Errorf("shared libraries missing from the image:\n  %s", strings.Join(errs, "\n  "))
	}
	if n == 0 {
		return fmt.Errorf("no ELF files to check")
	}
	return nil
}
