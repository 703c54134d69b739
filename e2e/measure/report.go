package measure

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// WriteReport writes a report as dir/NAME.json (v, indented, with a final
// newline) and dir/NAME.md (markdown), creating dir.
func WriteReport(dir, name string, v any, markdown string) error {
	if err := WriteJSON(dir, name+".json", v); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".md"), []byte(markdown), 0o644)
}

// WriteJSON writes v, indented and with a final newline, to dir/file,
// creating dir.
func WriteJSON(dir, file string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, file), append(js, '\n'), 0o644)
}
