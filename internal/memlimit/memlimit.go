// Package memlimit sets Go's soft memory limit from the container's memory
// limit, so a process near its limit collects garbage harder instead of
// being OOM-killed with half its heap garbage (by default Go lets the heap
// grow to twice what is live).
package memlimit

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Fraction of the container's limit given to Go: the rest is for what the
// Go runtime does not count (the binary, C and kernel buffers) and for
// overshooting while the collector catches up.
const Fraction = 0.9

// CgroupFiles are where the container's limit is read: cgroup v2, then v1.
var CgroupFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// Set sets the soft memory limit to Fraction of the first limit found in
// files, unless GOMEMLIMIT is set (the runtime already applied it) or no
// file holds a limit. It returns the limit set, 0 if none.
func Set(files []string) (int64, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		limit, ok, err := parse(string(b))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
		if !ok {
			return 0, nil
		}
		soft := int64(float64(limit) * Fraction)
		debug.SetMemoryLimit(soft)
		return soft, nil
	}
	return 0, nil
}

// parse reads a cgroup limit file: "max" (v2) or a huge number (v1's
// unlimited is about 2^63 rounded to pages) means no limit.
func parse(s string) (limit int64, ok bool, err error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("memory limit %q: %w", s, err)
	}
	if n == 0 || n >= math.MaxInt64/2 {
		return 0, false, nil
	}
	return int64(n), true, nil
}

// SetGCPercent sets Go's GC target to percent (heap growth over what is
// live before the next collection) unless GOGC is set (the runtime already
// applied it). It returns the target in effect and whether it came from
// GOGC. A node agent's peak is its live heap times (1 + percent/100):
// Go's default 100 doubles it.
func SetGCPercent(percent int) (effective int, fromEnv bool) {
	if os.Getenv("GOGC") != "" {
		cur := debug.SetGCPercent(100) // read it back: set, then restore
		debug.SetGCPercent(cur)
		return cur, true
	}
	debug.SetGCPercent(percent)
	return percent, false
}
