package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/vsplane/vsplane/e2e/conformance"
	"github.com/vsplane/vsplane/internal/wire"
)

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricName matches the metric names of vsplane, its kube-proxy-compatible
// metrics and the gRPC server's.
var metricName = regexp.MustCompile(`\b(?:vsplane|kubeproxy|grpc_server)_[a-z_]+\b`)

// TestOperationsGuideListsEveryMetric: docs/operations.md names every
// registered metric, and nothing that is not one.
func TestOperationsGuideListsEveryMetric(t *testing.T) {
	cp, ag, err := Registered()
	if err != nil {
		t.Fatal(err)
	}
	if len(cp) < 20 || len(ag) < 10 {
		t.Fatalf("registered metrics look incomplete: %d control plane, %d agent", len(cp), len(ag))
	}
	doc := repoFile(t, "docs/operations.md")
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(doc, -1) {
		if metricName.MatchString(m[1]) {
			documented[m[1]] = true
		}
	}
	registered := map[string]bool{}
	for _, m := range append(cp, ag...) {
		registered[m.Name] = true
		if !documented[m.Name] {
			t.Errorf("%s (%s) is not in docs/operations.md", m.Name, m.Help)
		}
	}
	for name := range documented {
		if !registered[name] {
			t.Errorf("docs/operations.md lists %s, which no binary registers", name)
		}
	}
}

// TestMigrationGuideNamesRealMetrics: every metric docs/migration.md tells
// the operator to watch is registered, and every kernel-operation kind it
// names is one the agents report.
func TestMigrationGuideNamesRealMetrics(t *testing.T) {
	cp, ag, err := Registered()
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	for _, m := range append(cp, ag...) {
		registered[m.Name] = true
	}
	doc := repoFile(t, "docs/migration.md")
	seen := 0
	for _, m := range metricName.FindAllString(doc, -1) {
		seen++
		if !registered[m] {
			t.Errorf("docs/migration.md names %s, which no binary registers", m)
		}
	}
	if seen == 0 {
		t.Error("docs/migration.md names no metric")
	}
	for _, m := range regexp.MustCompile("`((?:ipvs|ipset|addr|iptables|dummy|sysctl)_[a-z_]+)`").FindAllStringSubmatch(doc, -1) {
		if wire.KnownOp(m[1]) != m[1] {
			t.Errorf("docs/migration.md names the kernel operation %s, which the agents do not report", m[1])
		}
	}
}

// rule is one alerting rule of deploy/monitoring/prometheusrule.yaml.
type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// TestAlertRulesUseRealMetrics: the PrometheusRule decodes strictly, every
// rule has a severity and a summary, names only registered metrics with
// labels they have, and is explained in docs/operations.md.
func TestAlertRulesUseRealMetrics(t *testing.T) {
	cat := loadCatalog(t)
	var pr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []rule `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict([]byte(repoFile(t, "deploy/monitoring/prometheusrule.yaml")), &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Kind != "PrometheusRule" || len(pr.Spec.Groups) == 0 {
		t.Fatalf("not a PrometheusRule with groups: %+v", pr)
	}
	doc := repoFile(t, "docs/operations.md")
	var alerts []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v: needs alert, expr, a severity label and a summary", r)
			}
			if !strings.Contains(doc, "`"+r.Alert+"`") {
				t.Errorf("alert %s is not explained in docs/operations.md", r.Alert)
			}
			for _, problem := range cat.checkQuery(r.Expr, nil) {
				t.Errorf("alert %s: %s\n  %s", r.Alert, problem, r.Expr)
			}
		}
	}
	if distinct := slices.Compact(slices.Sorted(slices.Values(alerts))); len(distinct) != len(alerts) || len(alerts) < 5 {
		t.Errorf("alerts %v: want at least 5, each named once", alerts)
	}
}

// TestREADMEListsEverySkippedSpec: the README names every group of
// upstream specs `make conformance` skips, with its reason.
func TestREADMEListsEverySkippedSpec(t *testing.T) {
	readme := repoFile(t, "README.md")
	for _, s := range conformance.Skips {
		row := fmt.Sprintf("| `%s` | %s |", strings.ReplaceAll(s.Pattern, "|", `\|`), s.Reason)
		if !strings.Contains(readme, row) {
			t.Errorf("README.md lacks the skip row %q", row)
		}
	}
}

// TestREADMEEmbedsConformanceTable: the README carries the spec table of
// the committed conformance report, row for row (re-embed it after `make
// conformance`).
func TestREADMEEmbedsConformanceTable(t *testing.T) {
	report := repoFile(t, "bench/results/conformance.md")
	i := strings.Index(report, "| spec |")
	if i < 0 {
		t.Fatal("bench/results/conformance.md has no spec table")
	}
	readme := repoFile(t, "README.md")
	rows := 0
	for _, line := range strings.Split(strings.TrimSpace(report[i:]), "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		rows++
		if !strings.Contains(readme, line+"\n") {
			t.Errorf("README.md lacks the conformance row %.120q", line)
		}
	}
	if rows < 10 {
		t.Errorf("the conformance table has only %d rows", rows)
	}
}
