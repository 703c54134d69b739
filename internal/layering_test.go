// Package internal_test checks the dependency rule of the repository: the
// control plane and the data plane stand side by side and share code only
// through internal/ and proto/; neither imports the other, and internal/
// imports neither.
package internal_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/vsplane/vsplane/"

func TestPlanesDoNotImportEachOther(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := map[string][]string{
		"controlplane/": {"dataplane/"},
		"dataplane/":    {"controlplane/"},
		"internal/":     {"controlplane/", "dataplane/"},
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || rel == "bin" || rel == "_out" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		var bans []string
		for dir, b := range forbidden {
			if strings.HasPrefix(rel, dir) {
				bans = b
			}
		}
		if bans == nil {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, ban := range bans {
				if strings.HasPrefix(p, module+ban) {
					t.Errorf("%s imports %s: share it through internal/ instead", rel, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d Go files checked: is the repository root right (%s)?", checked, root)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s", root)
	}
}
