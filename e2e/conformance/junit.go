package conformance

import (
	"encoding/xml"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Outcome is what a spec did in one run.
type Outcome string

const (
	Passed  Outcome = "passed"
	Failed  Outcome = "failed"  // failed, panicked, timed out or aborted
	Skipped Outcome = "skipped" // by Skips (or by the spec itself, e.g. a missing capability)
	// NotRun: absent from the run's report, interrupted, or never reached
	// because the run was stopped (a partial run).
	NotRun Outcome = "not run"
)

// SpecResult is one spec's outcome in one run.
type SpecResult struct {
	Spec    string        `json:"spec"`
	Outcome Outcome       `json:"outcome"`
	Time    time.Duration `json:"time_ns"`
	// Message is the failure's (or the spec's own skip's) first line.
	Message string `json:"message,omitempty"`
	// Detail is a failure's whole text (what an Explanation's Message may
	// name: a timeout's first line does not say what it waited for).
	Detail string `json:"detail,omitempty"`
}

// junitCase is the part of Ginkgo's JUnit test case this package reads.
type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"error"`
}

type junitSuites struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

// leafPrefix is the "[It] " Ginkgo puts before a spec's full text; suite
// nodes ([SynchronizedBeforeSuite], [ReportAfterSuite] ...) have no spec
// text after theirs.
var leafPrefix = regexp.MustCompile(`^\[It\] `)

// ParseJUnit reads a Ginkgo JUnit report (e2e.test --report-dir's
// junit_01.xml) and returns the specs whose full text matches focus,
// sorted by text, and the failures of suite-level nodes (a failed
// BeforeSuite fails every spec).
func ParseJUnit(path string, focus *regexp.Regexp) (specs []SpecResult, suiteFailures []string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var doc junitSuites
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, nil, fmt.Errorf("conformance: %s is not a JUnit report: %w", path, err)
	}
	if len(doc.Suites) == 0 {
		return nil, nil, fmt.Errorf("conformance: %s has no test suite", path)
	}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			if !leafPrefix.MatchString(c.Name) {
				if o := outcomeOf(c); o == Failed {
					suiteFailures = append(suiteFailures, c.Name+": "+messageOf(c))
				}
				continue
			}
			spec := leafPrefix.ReplaceAllString(c.Name, "")
			if !focus.MatchString(spec) {
				continue
			}
			r := SpecResult{Spec: spec, Outcome: outcomeOf(c), Time: time.Duration(c.Time * float64(time.Second))}
			if r.Outcome != Passed {
				r.Message = messageOf(c)
			}
			switch {
			case c.Status == "interrupted":
				r.Outcome, r.Message = NotRun, "interrupted: the run was stopped while it ran"
			case r.Outcome == Skipped && (r.Message == "" || r.Message == "skipped") && SkipReason(spec) == "":
				// Ginkgo's bare "skipped" is a spec it never started: in
				// a complete run every focused spec outside Skips starts
				// (one that skips itself says why), so this run was
				// stopped before it.
				r.Outcome, r.Message = NotRun, "not reached: the run was stopped before it"
			}
			if r.Outcome == Failed {
				r.Detail = detailOf(c)
			}
			specs = append(specs, r)
		}
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Spec < specs[j].Spec })
	return specs, suiteFailures, nil
}

func outcomeOf(c junitCase) Outcome {
	switch c.Status {
	case "passed":
		return Passed
	case "skipped", "pending":
		return Skipped
	case "failed", "panicked", "timedout", "interrupted", "aborted":
		return Failed
	}
	switch {
	case c.Failure != nil || c.Error != nil:
		return Failed
	case c.Skipped != nil:
		return Skipped
	}
	return Passed
}

// detailOf is the whole text of a case's failure and error.
func detailOf(c junitCase) string {
	var b strings.Builder
	if c.Failure != nil {
		b.WriteString(c.Failure.Message + "\n" + c.Failure.Text + "\n")
	}
	if c.Error != nil {
		b.WriteString(c.Error.Message + "\n" + c.Error.Text)
	}
	return b.String()
}

// messageOf is the first meaningful line of a case's failure, error or
// skip.
func messageOf(c junitCase) string {
	var texts []string
	if c.Failure != nil {
		texts = append(texts, c.Failure.Message, c.Failure.Text)
	}
	if c.Error != nil {
		texts = append(texts, c.Error.Message, c.Error.Text)
	}
	if c.Skipped != nil {
		texts = append(texts, c.Skipped.Message)
	}
	for _, t := range texts {
		for _, line := range strings.Split(t, "\n") {
			line = strings.TrimSpace(line)
			// Ginkgo's failure text starts with a "[FAILED] " tag.
			line = strings.TrimSpace(strings.TrimPrefix(line, "[FAILED]"))
			if line != "" {
				return truncate(line, 300)
			}
		}
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
