// Command soakreport renders a chaos soak's report again from its JSON:
// the Markdown beside it and the memory plot (PNG). For reports written
// before the soak drew the plot itself, or after the Markdown's format
// changed.
//
//	go run ./e2e/soak/cmd/soakreport bench/results/soak-2026-12-06.json
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vsplane/vsplane/e2e/soak"
)

func main() {
	if len(os.Args) != 2 || !strings.HasSuffix(os.Args[1], ".json") {
		fmt.Fprintln(os.Stderr, "usage: soakreport <soak-DATE.json>")
		os.Exit(2)
	}
	if err := render(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "soakreport:", err)
		os.Exit(1)
	}
}

func render(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep soak.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(rep.Memory) == 0 {
		return fmt.Errorf("%s: no memory samples (not a soak report?)", path)
	}
	rep.Aggregate() // with this version's kinds
	base := strings.TrimSuffix(path, ".json")
	rep.Plot = filepath.Base(base) + ".png"
	if err := rep.WritePlot(base + ".png"); err != nil {
		return err
	}
	return os.WriteFile(base+".md", []byte(rep.Markdown()), 0o644)
}
