package soak

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vsplane/vsplane/e2e/cluster"
)

// Knobs names a soak's environment variables; Defaults are CI's values.
type Knobs struct {
	Duration, Seed, Report string // variable names
}

// Defaults are a soak's length, seed and report directory when the
// environment gives none (CI's short run).
type Defaults struct {
	Duration time.Duration
	Seed     uint64
	Report   string
}

// Params reads a soak's length (a Go duration of a minute or more), seed
// (an unsigned integer; "random", or empty with a length given: drawn from
// the clock) and report directory from the variables k names, falling back
// to def.
func Params(k Knobs, def Defaults) (time.Duration, uint64, string, error) {
	d := def.Duration
	if s := os.Getenv(k.Duration); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d < time.Minute {
			return 0, 0, "", fmt.Errorf("%s=%q: want a Go duration of a minute or more", k.Duration, s)
		}
	}
	seed := def.Seed
	switch s := os.Getenv(k.Seed); s {
	case "":
		if os.Getenv(k.Duration) != "" { // make soak without SEED: a fresh one
			seed = uint64(time.Now().UnixNano() % 1_000_000_000)
		}
	case "random":
		seed = uint64(time.Now().UnixNano() % 1_000_000_000)
	default:
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			return 0, 0, "", fmt.Errorf("%s=%q: want an unsigned integer", k.Seed, s)
		}
	}
	dir := def.Report
	if s := os.Getenv(k.Report); s != "" {
		dir = s
	}
	return d, seed, dir, nil
}

// RunFaults runs plan in order, each at its offset from the soak's start
// (since) or right after the one before when that ran long, and returns
// what each did. inject runs one fault to its end and awaits convergence;
// a fault that did not converge, or the context's end before a fault, is
// reported to violate; logf gets each converged fault.
func RunFaults(ctx context.Context, plan []Fault, since func() time.Duration, inject func(Fault) FaultResult,
	violate func(what, format string, args ...any), logf func(string, ...any)) []FaultResult {
	var out []FaultResult
	for _, f := range plan {
		if wait := f.At - since(); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait): // the schedule's own wait
			}
		}
		if ctx.Err() != nil {
			violate("deadline", "the soak's time ran out before fault %v", f)
			break
		}
		res := inject(f)
		out = append(out, res)
		if res.Err != "" {
			violate("not converged", "%v: %s", f, res.Err)
		} else {
			logf("+%v %v: converged %v after its end", res.Started.Round(100*time.Millisecond), f, res.Converged.Round(10*time.Millisecond))
		}
	}
	return out
}

// AwaitConverged polls check every poll until it passes, bound at most,
// and returns how long that took. When it never passes, the error gives
// the first three distinct answers with how often each came: under churn
// the last answer alone can mislead. When it passes after SlowConvergence
// or more, logf hears those answers too: what the time went on.
func AwaitConverged(ctx context.Context, f Fault, bound, poll time.Duration, check func(context.Context) error,
	logf func(string, ...any)) (time.Duration, error) {
	start := time.Now()
	seen := map[string]int{}
	var order []string
	err := cluster.Await(ctx, bound, poll, func(ctx context.Context) error {
		err := check(ctx)
		if err != nil {
			if seen[err.Error()] == 0 {
				order = append(order, err.Error())
			}
			seen[err.Error()]++
		}
		return err
	})
	answers := func() string {
		var b strings.Builder
		for _, e := range order[:min(3, len(order))] {
			fmt.Fprintf(&b, "\n  [%dx] %s", seen[e], e)
		}
		return fmt.Sprintf("%d distinct answers, the first:%s", len(order), b.String())
	}
	if err != nil {
		return 0, fmt.Errorf("%v: %w; %s", f, err, answers())
	}
	took := time.Since(start)
	if took >= SlowConvergence {
		logf("%v converged after %v; until then %s", f, took.Round(100*time.Millisecond), answers())
	}
	return took, nil
}

// SlowConvergence is the convergence time from which AwaitConverged says
// what it waited on (a variable for its test).
var SlowConvergence = 10 * time.Second

// WithExtra is check, then, once it passes, extra (if not nil), each call
// of extra bounded by timeout: a fault's own condition of convergence.
func WithExtra(check, extra func(context.Context) error, timeout time.Duration) func(context.Context) error {
	if extra == nil {
		return check
	}
	return func(ctx context.Context) error {
		if err := check(ctx); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return extra(cctx)
	}
}
