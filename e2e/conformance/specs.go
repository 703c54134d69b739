// Package conformance runs Kubernetes' own sig-network e2e specs (e2e.test
// built from k8s.io/kubernetes v1.37.2's test/e2e/network by
// scripts/kube/build.sh --e2e) against a real-node cluster
// (e2e/cluster.StartReal) and turns their JUnit reports into a side-by-side
// table: `make conformance` runs the whole selection on kube-proxy (IPVS
// mode) and on vsplane in one run and writes
// bench/results/conformance.{md,json}; `make conformance-quick` runs
// QuickSpecs the same way.
package conformance

import (
	"fmt"
	"regexp"
	"strings"
)

// Focus selects the specs of the comparison (the selection:
// upstream's Services, Services granular checks and Conntrack specs).
const Focus = `\[sig-network\] (Services|Networking Granular Checks: Services|Conntrack) `

// Skip is one group of specs the test bed cannot run, with the reason.
// Nothing is skipped because it fails: a failing spec runs and its failure
// is explained in Explanations.
type Skip struct {
	// Pattern is a regular expression over the spec's full text.
	Pattern string
	Reason  string
}

// Skips are the specs of Focus the test bed leaves out. The README lists
// them (e2e/docs checks it does). Specs that skip themselves (the
// [Disruptive] ones restart kube-proxy or kube-apiserver by deleting their
// Pods in kube-system, and skip where those are not Pods there) are not
// listed: the table shows their own reason.
var Skips = []Skip{
	{`\[Feature:SCTPConnectivity\]`, "opt-in SCTP connectivity specs (a feature tag: run where a cluster declares the feature); SCTP Services themselves are checked by the [Serial] SCTP spec, which runs"},
}

// SkipRegexp is --ginkgo.skip for Skips.
func SkipRegexp() string {
	parts := make([]string, len(Skips))
	for i, s := range Skips {
		parts[i] = s.Pattern
	}
	return strings.Join(parts, "|")
}

// SkipReason returns why spec is skipped ("" if it is not).
func SkipReason(spec string) string {
	for _, s := range Skips {
		if regexp.MustCompile(s.Pattern).MatchString(spec) {
			return s.Reason
		}
	}
	return ""
}

// QuickSpecs are `make conformance-quick`'s selection: a UDP Conntrack
// spec, a NodePort spec, a session-affinity spec and one that reaches a
// Service by its DNS name.
var QuickSpecs = []string{
	"[sig-network] Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service",
	"[sig-network] Services should be able to create a functioning NodePort service [Conformance]",
	"[sig-network] Services should have session affinity work for service with type clusterIP [LinuxOnly] [Conformance]",
	"[sig-network] Services should create endpoints for unready pods",
}

// ExactFocus is a --ginkgo.focus matching exactly the given spec texts.
// Ginkgo matches it against the texts of the spec's containers joined by
// spaces, which start with the (empty) top container's: hence (^|\s), not ^.
func ExactFocus(specs []string) string {
	parts := make([]string, len(specs))
	for i, s := range specs {
		parts[i] = `(^|\s)` + regexp.QuoteMeta(s) + "$"
	}
	return strings.Join(parts, "|")
}

// Explanation says why a spec has the outcome it has on one proxy.
type Explanation struct {
	// Kind classifies the reason.
	Kind ExplanationKind
	Text string
	// Message, when set, limits the explanation to failures whose message
	// (first line or whole text) contains it: the same spec failing
	// another way is not understood.
	Message string
}

// ExplanationKind is the class of a failure's reason (issue #24's list).
type ExplanationKind string

const (
	TestBedLimit         ExplanationKind = "test-bed limit"
	KubeProxyBug         ExplanationKind = "kube-proxy bug"
	VsplaneBug           ExplanationKind = "vsplane bug"
	DeliberateDifference ExplanationKind = "deliberate difference"
)

// Explanations say why a spec fails on a proxy, keyed by proxy, then by
// the spec's full text. A failure without one is reported as not
// understood (and `make conformance` fails).
var Explanations = map[string]map[string]Explanation{
	"kube-proxy": {
		"[sig-network] Services should fallback to local terminating endpoints when there are no ready endpoints with externalTrafficPolicy=Local": {
			Kind: TestBedLimit, Message: "exec pause-pod-0 -- /bin/sh -x -c curl",
			Text: "the spec deletes the only endpoint's Pod (100 s grace) and runs five rounds of three kubectl execs; " +
				"each round also waits out a 5 s connect timeout (by kube-proxy's IPVS code: its fallback to remote endpoints sends pause-pod-0's " +
				"connection to node1's NodePort to node0's endpoint unmasqueraded and the reply bypasses node1). Under TCG " +
				"the rounds outlast the grace period: pause-pod-0 finds the endpoint gone (curl exit 7, refused) before the last one " +
				"(337 s run on 2026-12-03; vsplane refuses that connection at once and passed in 104 s)",
		},
		"[sig-network] Services should serve endpoints on same port and different protocols [Conformance]": {
			Kind: TestBedLimit, Message: "service is not reachable within 30s timeout on endpoint",
			Text: "the spec turns the Service's TCP+UDP port 80 into UDP only and wants UDP answers within 30 s. In the VM, " +
				"the client's node had just finished a 13.6 s sync; its next sync began 2 s after the change and added the UDP " +
				"virtual server 32 s into it (a 49.7 s sync beside a 40.7 s IPv6 one; kube-proxy's log: \"Adding new service\" at 18:42:51 for a change at 18:42:17, " +
				"during another spec's endpoint churn), after the spec's last try. The other node added it in 5 s. The UDP " +
				"handling is right; the sync is slow under TCG (2026-12-04 run; vsplane passed in 47 s)",
		},
	},
	"vsplane": {},
}

func (e Explanation) String() string {
	if e.Kind == "" {
		return e.Text
	}
	return fmt.Sprintf("%s: %s", e.Kind, e.Text)
}
