package soak

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseProcessMetrics reads RSS, goroutines and start time from a
// Prometheus text exposition.
func ParseProcessMetrics(text string) (MemorySample, bool) {
	var s MemorySample
	found := 0
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "process_resident_memory_bytes":
			s.RSS, found = int64(v), found+1
		case "go_goroutines":
			s.Goroutines, found = int(v), found+1
		case "process_start_time_seconds":
			s.Start, found = v, found+1
		}
	}
	return s, found == 3
}

// Loose bounds on the second half's slopes, asserted only over a span of
// minSpan or more: the processes restart under the soak's faults, the
// churn keeps a varying number of Services, and the Go heap grows in steps
// (GC), so a short or noisy span says little; what these catch is a steady
// leak, e.g. a goroutine per reconnect or per fault.
const (
	minSpan           = 4 * time.Minute
	maxRSSSlope       = 2 << 20 // bytes per minute
	maxGoroutineSlope = 2.0     // per minute
)

// CheckSlopes says which series grew past the bounds over a span of
// minSpan or more (each a violation's context); shorter spans go to logf.
func CheckSlopes(series []MemorySeries, logf func(string, ...any)) []string {
	var out []string
	for _, s := range series {
		if s.Span < minSpan {
			logf("%s: slopes over %v (< %v, not asserted): RSS %+.2f MiB/min, goroutines %+.2f/min",
				s.Name, s.Span.Round(time.Second), minSpan, s.RSSSlope/(1<<20), s.GoroutineSlope)
			continue
		}
		if s.RSSSlope > maxRSSSlope || s.GoroutineSlope > maxGoroutineSlope {
			out = append(out, fmt.Sprintf("%s over the last %v of its run: RSS %+.2f MiB/min (bound %d), goroutines %+.2f/min (bound %v)",
				s.Name, s.Span.Round(time.Second), s.RSSSlope/(1<<20), maxRSSSlope>>20, s.GoroutineSlope, maxGoroutineSlope))
		}
	}
	return out
}
