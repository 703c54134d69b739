package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/vsplane/vsplane/e2e/measure"
)

// ProxyRun is one proxy's run of the selection.
type ProxyRun struct {
	Proxy string        `json:"proxy"`
	Specs []SpecResult  `json:"specs"`
	Took  time.Duration `json:"took_ns"`
	// Date is the day the run ended (UTC, 2006-01-02): a run carried over
	// from an earlier report keeps its own.
	Date string `json:"date,omitempty"`
	// Error is the run's own failure (no report, a failed suite), if any.
	Error string `json:"error,omitempty"`
}

// Row is one spec across the runs.
type Row struct {
	Spec     string                `json:"spec"`
	Outcomes map[string]SpecResult `json:"outcomes"` // by proxy
	// Why explains every outcome that is not "passed" (by proxy).
	Why map[string]string `json:"why,omitempty"`
}

// Report is the side-by-side comparison `make conformance` writes.
type Report struct {
	Date    string     `json:"date"`
	Focus   string     `json:"focus"`
	Skip    string     `json:"skip"`
	Proxies []string   `json:"proxies"`
	Runs    []ProxyRun `json:"runs"`
	Rows    []Row      `json:"rows"`
	// Unexplained lists failures with no entry in Explanations: each is
	// a defect of the report until understood.
	Unexplained []string `json:"unexplained,omitempty"`
	// Regressions are specs that pass on kube-proxy and not on vsplane.
	Regressions []string `json:"regressions,omitempty"`
}

// NewReport lines up the runs of the selection focus by spec. Every spec
// of any run gets a row; a spec missing from a run is "not run" there.
func NewReport(date, focus string, runs []ProxyRun) Report {
	r := Report{Date: date, Focus: focus, Skip: SkipRegexp(), Runs: runs}
	bySpec := map[string]*Row{}
	for _, run := range runs {
		r.Proxies = append(r.Proxies, run.Proxy)
		for _, s := range run.Specs {
			row := bySpec[s.Spec]
			if row == nil {
				row = &Row{Spec: s.Spec, Outcomes: map[string]SpecResult{}, Why: map[string]string{}}
				bySpec[s.Spec] = row
			}
			row.Outcomes[run.Proxy] = s
		}
	}
	for _, row := range bySpec {
		for _, p := range r.Proxies {
			o, ok := row.Outcomes[p]
			if !ok {
				o = SpecResult{Spec: row.Spec, Outcome: NotRun}
				row.Outcomes[p] = o
			}
			switch o.Outcome {
			case Skipped:
				if reason := SkipReason(row.Spec); reason != "" {
					row.Why[p] = "skipped: " + reason
				} else {
					row.Why[p] = "skipped by the spec: " + o.Message
				}
			case NotRun:
				row.Why[p] = "not run"
				if o.Message != "" {
					row.Why[p] += ": " + o.Message
				}
			case Failed:
				if e, ok := Explanations[p][row.Spec]; ok && (strings.Contains(o.Message, e.Message) || strings.Contains(o.Detail, e.Message)) {
					row.Why[p] = e.String()
				} else {
					row.Why[p] = "not yet understood: " + o.Message
					r.Unexplained = append(r.Unexplained, p+": "+row.Spec)
				}
			}
		}
		if kp, vs := row.Outcomes["kube-proxy"], row.Outcomes["vsplane"]; kp.Outcome == Passed && vs.Outcome == Failed {
			r.Regressions = append(r.Regressions, row.Spec)
		}
		r.Rows = append(r.Rows, *row)
	}
	sort.Slice(r.Rows, func(i, j int) bool { return r.Rows[i].Spec < r.Rows[j].Spec })
	sort.Strings(r.Unexplained)
	sort.Strings(r.Regressions)
	return r
}

// Counts returns, per proxy, how many specs had each outcome.
func (r Report) Counts() map[string]map[Outcome]int {
	out := map[string]map[Outcome]int{}
	for _, p := range r.Proxies {
		out[p] = map[Outcome]int{}
		for _, row := range r.Rows {
			out[p][row.Outcomes[p].Outcome]++
		}
	}
	return out
}

// Markdown renders the report: totals, then one row per spec (spec |
// outcome per proxy | time per proxy | why).
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Kubernetes v1.37.2 sig-network e2e specs on the real-node test bed, %s.\n\n", r.Date)
	fmt.Fprintf(&b, "Focus `%s`; skipped (with reasons in the README): `%s`.\n\n", r.Focus, r.Skip)
	counts := r.Counts()
	b.WriteString("| proxy | run on | passed | failed | skipped | not run | run time (cluster start and specs) |\n|---|---|---|---|---|---|---|\n")
	for _, run := range r.Runs {
		c := counts[run.Proxy]
		took := "–" // not measured (a re-rendered report)
		if run.Took > 0 {
			took = run.Took.Round(time.Second).String()
		}
		date := run.Date
		if date == "" {
			date = r.Date
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %s |\n", run.Proxy, date, c[Passed], c[Failed], c[Skipped], c[NotRun], took)
	}
	for _, run := range r.Runs {
		if run.Error != "" {
			fmt.Fprintf(&b, "\n%s's run: %s\n", run.Proxy, run.Error)
		}
	}
	if len(r.Regressions) > 0 {
		fmt.Fprintf(&b, "\nPass on kube-proxy, not on vsplane: %d (why: below).\n", len(r.Regressions))
	}
	b.WriteString("\n| spec |")
	for _, p := range r.Proxies {
		fmt.Fprintf(&b, " %s |", p)
	}
	b.WriteString(" time | why |\n|---|")
	for range r.Proxies {
		b.WriteString("---|")
	}
	b.WriteString("---|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %s |", escape(row.Spec))
		var times, whys []string
		for _, p := range r.Proxies {
			o := row.Outcomes[p]
			fmt.Fprintf(&b, " %s |", o.Outcome)
			if o.Outcome == Passed || o.Outcome == Failed {
				times = append(times, fmt.Sprintf("%.0f s", o.Time.Seconds()))
			} else {
				times = append(times, "–")
			}
			if w := row.Why[p]; w != "" {
				whys = append(whys, p+": "+w)
			}
		}
		why := strings.Join(whys, "; ")
		if allSkippedAlike(row, r.Proxies) {
			why = row.Why[r.Proxies[0]]
		}
		fmt.Fprintf(&b, " %s | %s |\n", strings.Join(times, " / "), escape(why))
	}
	return b.String()
}

// allSkippedAlike: every proxy skipped the row for the same reason (the
// reason is then written once).
func allSkippedAlike(row Row, proxies []string) bool {
	for _, p := range proxies {
		if row.Outcomes[p].Outcome != Skipped || row.Why[p] != row.Why[proxies[0]] {
			return false
		}
	}
	return len(proxies) > 0
}

func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// ReadReport reads a report Write wrote (NAME.json).
func ReadReport(path string) (Report, error) {
	var r Report
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("conformance: %s: %w", path, err)
	}
	return r, nil
}

// CarriedRun is proxy's run in an earlier report of the same selection,
// for a report whose other proxies run now: the whole selection on both
// proxies takes longer than one sitting here, so each proxy's run can be
// kept (committed) and the other's added later. ok is false when prev
// has no run of proxy or selected other specs.
func CarriedRun(prev Report, focus, proxy string) (ProxyRun, bool) {
	if prev.Focus != focus || prev.Skip != SkipRegexp() {
		return ProxyRun{}, false
	}
	for _, run := range prev.Runs {
		if run.Proxy == proxy {
			if run.Date == "" {
				run.Date = prev.Date
			}
			return run, true
		}
	}
	return ProxyRun{}, false
}

// Write writes dir/NAME.json and dir/NAME.md.
func (r Report) Write(dir, name string) error {
	return measure.WriteReport(dir, name, r, r.Markdown())
}
