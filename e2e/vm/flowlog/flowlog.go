// Package flowlog is the test bed's record of one long-lived flow: a client
// sending from one fixed source port, one attempt every interval, while the
// host changes the cluster underneath it. The guest programs (e2ehelper flow
// for UDP, sctphelper flow for SCTP) write it with Run; the host reads it
// back with Parse and judges each phase with Judge.
//
// Every attempt line carries the client's own monotonic milliseconds and the
// phase label the host last wrote to the phase file, so a phase is judged on
// the client's clock alone: the guest's and the host's clocks are never
// compared.
//
//	<ms> <phase> ok <answer>
//	<ms> <phase> fail <error>
package flowlog

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Options configure Run.
type Options struct {
	Interval  time.Duration // pause between attempts
	PhaseFile string        // read before each attempt; its first word labels it
	StopFile  string        // Run returns once this file exists
	Max       int           // bound on attempts (a loop of unknown length)
}

// Flags are the flow commands' shared flags.
type Flags struct {
	Addr       string
	SourcePort int
	Timeout    time.Duration
	Options
}

// AddFlags registers the flow flags on fs.
func AddFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.Addr, "addr", "", "HOST:PORT to send to (required)")
	fs.IntVar(&f.SourcePort, "source-port", 0, "the local port of every attempt (required)")
	fs.DurationVar(&f.Interval, "interval", 50*time.Millisecond, "pause between attempts")
	fs.DurationVar(&f.Timeout, "timeout", 300*time.Millisecond, "how long to wait for each answer")
	fs.StringVar(&f.PhaseFile, "phase-file", "", "labels each attempt with this file's first word (required)")
	fs.StringVar(&f.StopFile, "stop-file", "", "stop once this file exists (required)")
	fs.IntVar(&f.Max, "max", 100000, "bound on attempts")
	return f
}

// Check rejects what Run could not use.
func (f *Flags) Check() error {
	if f.Addr == "" || f.SourcePort < 1 || f.SourcePort > 65535 || f.Timeout <= 0 {
		return errors.New("flow needs --addr, 1 <= --source-port <= 65535 and --timeout > 0")
	}
	return f.Options.check()
}

func (o Options) check() error {
	if o.Interval < 0 || o.PhaseFile == "" || o.StopFile == "" || o.Max < 1 {
		return errors.New("flow needs --interval >= 0, --phase-file, --stop-file and --max >= 1")
	}
	return nil
}

// Run calls attempt every Interval until StopFile exists, ctx ends or Max
// attempts were made, and writes one line per attempt to out.
func Run(ctx context.Context, o Options, attempt func(context.Context) (string, error), out io.Writer) error {
	if err := o.check(); err != nil {
		return err
	}
	start := time.Now()
	w := bufio.NewWriter(out)
	defer w.Flush()
	for i := 0; i < o.Max && ctx.Err() == nil; i++ {
		if _, err := os.Stat(o.StopFile); err == nil {
			break
		}
		phase := "-"
		if b, err := os.ReadFile(o.PhaseFile); err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				phase = f[0]
			}
		}
		ms := time.Since(start).Milliseconds()
		answer, err := attempt(ctx)
		if err != nil {
			fmt.Fprintf(w, "%d %s fail %s\n", ms, phase, oneLine(err.Error()))
		} else {
			fmt.Fprintf(w, "%d %s ok %s\n", ms, phase, oneLine(answer))
		}
		// The host reads the log while the flow runs.
		if err := w.Flush(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(o.Interval):
		}
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Attempt is one parsed line.
type Attempt struct {
	MS      int64
	Phase   string
	OK      bool
	Backend string // first word of the answer
	Text    string // the answer or the error
}

// Parse reads a flow log; lines that are not attempts (a process's other
// output) are skipped.
func Parse(log string) []Attempt {
	var out []Attempt
	for _, l := range strings.Split(log, "\n") {
		f := strings.SplitN(l, " ", 4)
		if len(f) < 3 || (f[2] != "ok" && f[2] != "fail") {
			continue
		}
		ms, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		a := Attempt{MS: ms, Phase: f[1], OK: f[2] == "ok"}
		if len(f) == 4 {
			a.Text = f[3]
			if a.OK {
				a.Backend, _, _ = strings.Cut(a.Text, " ")
			}
		}
		out = append(out, a)
	}
	return out
}

// Verdict is one phase of one flow, judged.
type Verdict struct {
	Attempts int
	Lost     int // attempts without an answer
	Stale    int // answers from a backend the phase does not expect
	// Recovered: the phase ends with answers from expected backends only,
	// after its last stale answer and its last run of StuckRun failures.
	Recovered bool
	// RecoveryMS is the time from the phase's first attempt to the first
	// attempt of that good ending (0 when the flow never faltered).
	RecoveryMS int64
	Last       string // the phase's last attempt, for reports
}

// StuckRun is how many failures in a row count as an outage rather than a
// stray lost datagram on a busy machine.
const StuckRun = 3

// Judge judges the attempts labelled phase against the backends the phase
// expects to answer.
func Judge(attempts []Attempt, phase string, expected ...string) Verdict {
	var v Verdict
	var in []Attempt
	for _, a := range attempts {
		if a.Phase == phase {
			in = append(in, a)
		}
	}
	v.Attempts = len(in)
	if len(in) == 0 {
		return v
	}
	v.Last = fmt.Sprintf("%d %s", in[len(in)-1].MS, in[len(in)-1].Text)
	good := func(a Attempt) bool {
		for _, e := range expected {
			if a.OK && a.Backend == e {
				return true
			}
		}
		return false
	}
	// start of the good ending: after the last stale answer and the last
	// run of StuckRun failures, at the first good answer.
	from, run := 0, 0
	for i, a := range in {
		switch {
		case !a.OK:
			v.Lost++
			run++
			if run >= StuckRun {
				from = i + 1
			}
		case !good(a):
			v.Stale++
			run = 0
			from = i + 1
		default:
			run = 0
		}
	}
	for from < len(in) && !good(in[from]) {
		from++
	}
	if from < len(in) {
		v.Recovered = true
		v.RecoveryMS = in[from].MS - in[0].MS
	}
	return v
}
