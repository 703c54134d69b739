package measure

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// modulePath is the root module; a go.mod naming another one (scripts/kube/...
// build their own) is not the repository root.
const modulePath = "github.com/vsplane/vsplane"

// RepoRoot is the vsplane checkout holding dir: the nearest directory at or
// above it whose go.mod is the vsplane module.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if IsRepoRoot(d) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no vsplane go.mod above %s", dir)
		}
	}
}

// IsRepoRoot reports whether dir holds the vsplane root go.mod.
func IsRepoRoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == "module "+modulePath {
			return true
		}
	}
	return false
}
