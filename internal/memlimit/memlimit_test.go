package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestSetFromCgroupFile(t *testing.T) {
	t.Cleanup(func() { debug.SetMemoryLimit(math.MaxInt64) })
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("GOMEMLIMIT", "")
	limited := write("limited", "1073741824\n")
	fraction := Fraction // not a constant expression: rounded as Set rounds
	gib := int64(float64(1<<30) * fraction)
	cases := []struct {
		name  string
		files []string
		want  int64
	}{
		{"v2 limit", []string{limited}, gib},
		{"v2 unlimited", []string{write("max", "max\n")}, 0},
		{"v1 unlimited", []string{write("v1", "9223372036854771712\n")}, 0},
		{"first existing file wins", []string{filepath.Join(dir, "absent"), limited}, gib},
		{"no file", []string{filepath.Join(dir, "absent")}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			got, err := Set(c.files)
			if err != nil || got != c.want {
				t.Fatalf("Set = %d, %v; want %d", got, err, c.want)
			}
			if c.want > 0 && debug.SetMemoryLimit(-1) != c.want {
				t.Fatalf("runtime limit %d, want %d", debug.SetMemoryLimit(-1), c.want)
			}
		})
	}
	if _, err := Set([]string{write("bad", "lots\n")}); err == nil {
		t.Fatal("an unreadable limit is not an error")
	}
	t.Setenv("GOMEMLIMIT", "123MiB")
	debug.SetMemoryLimit(math.MaxInt64)
	if got, err := Set([]string{limited}); got != 0 || err != nil || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Fatalf("GOMEMLIMIT set: Set = %d, %v and the limit changed", got, err)
	}
}

func TestSetGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	if got, env := SetGCPercent(40); got != 40 || env {
		t.Errorf("without GOGC: got %d, %v; want 40, false", got, env)
	}
	if cur := debug.SetGCPercent(40); cur != 40 {
		t.Errorf("runtime GC percent %d after SetGCPercent(40)", cur)
	}
	t.Setenv("GOGC", "70")
	debug.SetGCPercent(70) // what the runtime read from GOGC at start
	if got, env := SetGCPercent(40); got != 70 || !env {
		t.Errorf("with GOGC=70: got %d, %v; want 70, true (GOGC wins)", got, env)
	}
	if cur := debug.SetGCPercent(70); cur != 70 {
		t.Errorf("runtime GC percent %d: GOGC's 70 was overridden", cur)
	}
}
