package conformance

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testdata/junit_01.xml is a report e2e.test wrote (a dry run of the
// selection, trimmed) with a failed and a timed spec added in its format.
func TestParseJUnit(t *testing.T) {
	specs, suiteFailures, err := ParseJUnit("testdata/junit_01.xml", regexp.MustCompile(Focus))
	if err != nil {
		t.Fatal(err)
	}
	if len(suiteFailures) != 0 {
		t.Errorf("suite failures: %v", suiteFailures)
	}
	want := []SpecResult{
		{Spec: "[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service",
			Outcome: Failed, Time: 94250 * time.Millisecond, Message: "Failed to connect to backend 2",
			Detail: "\n[FAILED] Failed to connect to backend 2\nIn [It] at: conntrack.go:340 @ 12/03/26 08:40:01.1\n\n"},
		{Spec: "[sig-network] Services should be able to create a functioning NodePort service [Conformance]", Outcome: Passed},
		{Spec: "[sig-network] Services should be able to up and down services", Outcome: NotRun, Message: "not reached: the run was stopped before it"},
		{Spec: "[sig-network] Services should implement service.kubernetes.io/headless", Outcome: NotRun, Time: 12500 * time.Millisecond,
			Message: "interrupted: the run was stopped while it ran"},
		{Spec: "[sig-network] Services should serve a basic endpoint from pods [Conformance]", Outcome: Passed, Time: 31500 * time.Millisecond},
		{Spec: "[sig-network] Services should work after restarting kube-proxy [Disruptive]", Outcome: Skipped,
			Message: "skipped - Skipped because component:kube-proxy is not running as pod."},
		{Spec: "[sig-network] Services should work after the service has been recreated", Outcome: Passed},
	}
	if d := cmp.Diff(want, specs); d != "" {
		t.Errorf("specs (-want +got):\n%s", d)
	}
}

func TestParseJUnitErrors(t *testing.T) {
	focus := regexp.MustCompile(Focus)
	if _, _, err := ParseJUnit("testdata/missing.xml", focus); err == nil {
		t.Error("a missing report parsed")
	}
	if _, _, err := ParseJUnit("report_test.go", focus); err == nil || !strings.Contains(err.Error(), "not a JUnit report") {
		t.Errorf("a Go file parsed as a report: %v", err)
	}
}

func TestSkips(t *testing.T) {
	for spec, skipped := range map[string]bool{
		"[sig-network] Networking Granular Checks: Services should function for pod-Service: sctp [Feature:SCTPConnectivity]":         true,
		"[sig-network] Services should work after restarting kube-proxy [Disruptive]":                                                 false,
		"[sig-network] Services should allow creating a basic SCTP service with pod and endpoints [LinuxOnly] [Serial]":               false,
		"[sig-network] Networking Granular Checks: Services should update nodePort: udp [Slow]":                                       false,
		"[sig-network] Services should serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer": false,
		"[sig-network] Services should be able to create a functioning NodePort service [Conformance]":                                false,
		"[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service":                false,
	} {
		if got := SkipReason(spec) != ""; got != skipped {
			t.Errorf("skipped(%q) = %v, want %v", spec, got, skipped)
		}
		if got := regexp.MustCompile(SkipRegexp()).MatchString(spec); got != skipped {
			t.Errorf("SkipRegexp matches %q: %v, want %v", spec, got, skipped)
		}
	}
	for _, s := range QuickSpecs {
		if SkipReason(s) != "" || !regexp.MustCompile(Focus).MatchString(s) {
			t.Errorf("quick spec %q is outside the selection", s)
		}
		if !regexp.MustCompile(ExactFocus(QuickSpecs)).MatchString(s) || regexp.MustCompile(ExactFocus(QuickSpecs)).MatchString(s+" x") {
			t.Errorf("ExactFocus does not match exactly %q", s)
		}
	}
}

func TestReport(t *testing.T) {
	const (
		both    = "[sig-network] Services should serve a basic endpoint from pods [Conformance]"
		regress = "[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service"
		skipped = "[sig-network] Services should work after restarting kube-proxy [Disruptive]"
		kpOnly  = "[sig-network] Services should be rejected when no endpoints exist"
	)
	runs := []ProxyRun{
		{Proxy: "kube-proxy", Took: time.Minute, Specs: []SpecResult{
			{Spec: both, Outcome: Passed, Time: 30 * time.Second},
			{Spec: regress, Outcome: Passed, Time: 40 * time.Second},
			{Spec: skipped, Outcome: Skipped, Message: "skipped"},
			{Spec: kpOnly, Outcome: Failed, Message: "timed out"},
		}},
		{Proxy: "vsplane", Took: time.Minute, Specs: []SpecResult{
			{Spec: both, Outcome: Passed, Time: 20 * time.Second},
			{Spec: regress, Outcome: Failed, Message: "Failed to connect to backend 2"},
			{Spec: skipped, Outcome: Skipped, Message: "skipped"},
		}},
	}
	r := NewReport("2026-12-03", Focus, runs)
	if d := cmp.Diff([]string{regress}, r.Regressions); d != "" {
		t.Errorf("regressions (-want +got):\n%s", d)
	}
	// kpOnly did not run on vsplane: not run, not a failure to explain.
	wantUnexplained := []string{"kube-proxy: " + kpOnly, "vsplane: " + regress}
	if d := cmp.Diff(wantUnexplained, r.Unexplained); d != "" {
		t.Errorf("unexplained (-want +got):\n%s", d)
	}
	c := r.Counts()
	if c["vsplane"][NotRun] != 1 || c["vsplane"][Passed] != 1 || c["kube-proxy"][Failed] != 1 || c["kube-proxy"][Skipped] != 1 {
		t.Errorf("counts: %v", c)
	}
	md := r.Markdown()
	for _, want := range []string{
		"| kube-proxy | 2026-12-03 | 2 | 1 | 1 | 0 | 1m0s |",
		"| vsplane | 2026-12-03 | 1 | 1 | 1 | 1 | 1m0s |",
		"| " + both + " | passed | passed | 30 s / 20 s |  |",
		"Pass on kube-proxy, not on vsplane: 1 (why: below).",
		"| " + skipped + " | skipped | skipped | – / – | skipped by the spec: skipped |",
		"vsplane: not yet understood: Failed to connect to backend 2",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}

	// An explanation for another failure message does not explain it.
	Explanations["vsplane"][regress] = Explanation{Kind: TestBedLimit, Text: "slow", Message: "Timed out after"}
	defer delete(Explanations["vsplane"], regress)
	if r = NewReport("2026-12-03", Focus, runs); !strings.Contains(strings.Join(r.Unexplained, "\n"), regress) {
		t.Errorf("failure explained by another message's explanation: %v", r.Unexplained)
	}
	// An explained failure is not reported as unexplained.
	Explanations["vsplane"][regress] = Explanation{Kind: VsplaneBug, Text: "fixed in abc", Message: "backend 2"}
	r = NewReport("2026-12-03", Focus, runs)
	if strings.Contains(strings.Join(r.Unexplained, "\n"), regress) {
		t.Errorf("explained failure still unexplained: %v", r.Unexplained)
	}
	if !strings.Contains(r.Markdown(), "vsplane: vsplane bug: fixed in abc") {
		t.Errorf("explanation not in the table:\n%s", r.Markdown())
	}
	// A message may be matched in the failure's whole text (a timeout's
	// first line does not say what it waited for).
	Explanations["vsplane"][regress] = Explanation{Kind: TestBedLimit, Text: "no image", Message: "ImagePullBackOff"}
	runs[1].Specs[1].Detail = "Failed to connect to backend 2\n  reason: ImagePullBackOff"
	if r = NewReport("2026-12-03", Focus, runs); strings.Contains(strings.Join(r.Unexplained, "\n"), regress) {
		t.Errorf("failure with the message in its detail still unexplained: %v", r.Unexplained)
	}
}

// A proxy's run is carried from an earlier report of the same selection
// only, with its own date, through the JSON Write wrote (the failure's
// whole text included, which explanations may match).
func TestCarriedRun(t *testing.T) {
	prev := NewReport("2026-12-04", Focus, []ProxyRun{{Proxy: "kube-proxy", Took: time.Hour, Specs: []SpecResult{
		{Spec: "[sig-network] Services a", Outcome: Failed, Message: "timed out", Detail: "timed out\nImagePullBackOff"}}}})
	dir := t.TempDir()
	if err := prev.Write(dir, "conformance"); err != nil {
		t.Fatal(err)
	}
	read, err := ReadReport(dir + "/conformance.json")
	if err != nil {
		t.Fatal(err)
	}
	run, ok := CarriedRun(read, Focus, "kube-proxy")
	if !ok || run.Date != "2026-12-04" || run.Took != time.Hour || run.Specs[0].Detail != "timed out\nImagePullBackOff" {
		t.Errorf("carried run %+v, %v", run, ok)
	}
	if _, ok := CarriedRun(read, Focus, "vsplane"); ok {
		t.Error("a run the report does not hold was carried")
	}
	if _, ok := CarriedRun(read, `\[sig-network\] Conntrack `, "kube-proxy"); ok {
		t.Error("a run of another selection was carried")
	}
	md := NewReport("2026-12-05", Focus, []ProxyRun{run, {Proxy: "vsplane", Date: "2026-12-05"}}).Markdown()
	if !strings.Contains(md, "| kube-proxy | 2026-12-04 |") || !strings.Contains(md, "| vsplane | 2026-12-05 |") {
		t.Errorf("each run's own date not in the table:\n%s", md)
	}
	if _, err := ReadReport(dir + "/missing.json"); err == nil {
		t.Error("a missing report read")
	}
}

// The node count reaches e2e.test: unset, specs needing two nodes skip
// themselves ("Requires at least 2 nodes (not -1)").
func TestE2EArgsNodeCount(t *testing.T) {
	if args := e2eArgs(RunOptions{Nodes: 2}); !slices.Contains(args, "--num-nodes=2") {
		t.Errorf("e2e.test args %v lack --num-nodes=2", args)
	}
	if _, err := Run(context.Background(), RunOptions{BinDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "node count") {
		t.Errorf("Run without a node count: %v, want an error naming it", err)
	}
}
