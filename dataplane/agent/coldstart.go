package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/client"
)

// The agent's cold start, from process start to the first Delta applied,
// in steps: the process (runtime and package initialization, up to main),
// the command line, the kernel handles, the agent's wiring, the TCP
// connection and TLS handshake to a replica, the Hello, the replica's first
// answer (its TokenReview of the agent and its first Delta are behind it)
// and the first apply. It is logged once, as "cold start", so where the
// time goes can be read on any node (and the benchmarks read it).
type coldStart struct {
	mu     sync.Mutex
	start  time.Time // the process's start
	steps  []coldStep
	seen   map[string]bool
	logged bool
	log    *zap.Logger
}

type coldStep struct {
	name string
	at   time.Time
}

func newColdStart(start time.Time, log *zap.Logger) *coldStart {
	return &coldStart{start: start, seen: map[string]bool{}, log: log}
}

// mark records the first time the cold start reaches step; the first
// applied Delta logs the whole timeline.
func (c *coldStart) mark(step string) {
	if c == nil {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[step] || c.logged {
		return
	}
	c.seen[step] = true
	c.steps = append(c.steps, coldStep{step, now})
	if step != string(client.StepFirstDeltaApplied) {
		return
	}
	c.logged = true
	fields := []zap.Field{zap.Duration("total", now.Sub(c.start))}
	prev := c.start
	for _, s := range c.steps {
		// Each step's own share: since the step before it.
		fields = append(fields, zap.Duration(s.name, s.at.Sub(prev)))
		prev = s.at
	}
	c.log.Info("cold start", fields...)
}

// ProcessStart is when this process started, from /proc/self/stat
// (10 ms resolution), or now if that cannot be read.
func ProcessStart() time.Time {
	t, err := processStart()
	if err != nil {
		return time.Now()
	}
	return t
}

func processStart() (time.Time, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return time.Time{}, err
	}
	// Fields after the command name (which may hold spaces), from field 3.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return time.Time{}, errors.New("/proc/self/stat: no command name")
	}
	fields := strings.Fields(string(b[i+1:]))
	const startTimeField = 22 - 3
	if len(fields) <= startTimeField {
		return time.Time{}, errors.New("/proc/self/stat: too few fields")
	}
	ticks, err := strconv.ParseUint(fields[startTimeField], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("/proc/self/stat starttime: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, err
	}
	const userHZ = 100 // /proc's clock ticks (USER_HZ) on every Linux ABI
	age := time.Duration(ts.Nano()) - time.Duration(ticks)*(time.Second/userHZ)
	if age < 0 {
		age = 0
	}
	return time.Now().Add(-age), nil
}
