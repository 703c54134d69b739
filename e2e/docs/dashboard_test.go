package docs

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metricCatalog is what a query may name: the metrics each binary
// registers with their labels, their types from docs/operations.md, and
// the Go and process collectors' metrics both binaries export.
type metricCatalog struct {
	labels  map[string][]string // name → variable labels
	binary  map[string]string   // name → "controlplane", "agent", "both" (runtime collectors) or "other"
	typ     map[string]string   // name → counter, gauge or histogram (documented)
	runtime map[string]bool
}

// otherExporters are the metrics of other exporters the alerting rules
// read, with their labels: kube-state-metrics' node count.
var otherExporters = map[string][]string{
	"kube_node_info": {"node", "kernel_version", "os_image", "container_runtime_version", "kubelet_version",
		"kubeproxy_version", "provider_id", "pod_cidr", "system_uuid", "internal_ip"},
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"job", "instance"}

func loadCatalog(t *testing.T) metricCatalog {
	t.Helper()
	cp, ag, err := Registered()
	if err != nil {
		t.Fatal(err)
	}
	c := metricCatalog{labels: map[string][]string{}, binary: map[string]string{}, typ: map[string]string{}, runtime: map[string]bool{}}
	for _, m := range cp {
		c.labels[m.Name], c.binary[m.Name] = m.Labels, "controlplane"
	}
	for _, m := range ag {
		c.labels[m.Name], c.binary[m.Name] = m.Labels, "agent"
	}
	// Metrics of other exporters the alerts may read.
	for name, labels := range otherExporters {
		c.labels[name], c.binary[name] = labels, "other"
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (counter|gauge|histogram) \\|")
	for _, m := range row.FindAllStringSubmatch(repoFile(t, "docs/operations.md"), -1) {
		c.typ[m[1]] = m[2]
	}
	// The runtime collectors, as both binaries register them.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		c.runtime[mf.GetName()], c.binary[mf.GetName()] = true, "both"
	}
	return c
}

// resolve returns the registered metric a series name belongs to (a
// histogram's _bucket, _sum and _count belong to it) and the labels the
// series has besides the target labels.
func (c metricCatalog) resolve(series string) (base string, labels []string, err error) {
	if c.runtime[series] {
		return series, nil, nil
	}
	if l, ok := c.labels[series]; ok {
		return series, l, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		b, ok := strings.CutSuffix(series, suffix)
		if !ok {
			continue
		}
		if _, registered := c.labels[b]; !registered {
			continue
		}
		if c.typ[b] != "histogram" {
			return "", nil, fmt.Errorf("%s: %s is a %q, not a histogram (docs/operations.md)", series, b, c.typ[b])
		}
		if suffix == "_bucket" {
			return b, append(slices.Clone(c.labels[b]), "le"), nil
		}
		return b, c.labels[b], nil
	}
	return "", nil, fmt.Errorf("%s: no binary exports it", series)
}

// checkQuery returns what is wrong with expr: a metric no binary exports, a
// label its series do not have, a function PromQL does not know. jobVars,
// when set, names the job variable each binary's metrics must be selected
// with, so a panel never reads one binary's metrics from the other's job.
func (c metricCatalog) checkQuery(expr string, jobVars map[string]string) []string {
	q, err := ParseQuery(expr)
	if err != nil {
		return []string{err.Error()}
	}
	if len(q.Selectors) == 0 && !slices.Contains(q.Functions, "time") {
		return []string{"reads no metric"}
	}
	var problems []string
	available := slices.Clone(targetLabels)
	for _, sel := range q.Selectors {
		base, labels, err := c.resolve(sel.Metric)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		have := append(slices.Clone(targetLabels), labels...)
		available = append(available, labels...)
		for name := range sel.Matchers {
			if !slices.Contains(have, name) {
				problems = append(problems, fmt.Sprintf("%s has no label %q (it has %v)", sel.Metric, name, have))
			}
		}
		if jobVars != nil {
			got, binary := sel.Matchers["job"], c.binary[base]
			ok := got == jobVars[binary]
			if binary == "both" { // the runtime collectors: either job
				ok = got == jobVars["controlplane"] || got == jobVars["agent"]
			}
			if !ok {
				problems = append(problems, fmt.Sprintf("%s is selected with job=~%q, want the %s job variable", sel.Metric, got, binary))
			}
		}
	}
	for _, l := range q.Grouping {
		if !slices.Contains(available, l) {
			problems = append(problems, fmt.Sprintf("groups by %q, which none of its series has", l))
		}
	}
	return problems
}

type dashboardPanel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

type dashboard struct {
	UID           string           `json:"uid"`
	Title         string           `json:"title"`
	SchemaVersion int              `json:"schemaVersion"`
	Panels        []dashboardPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// TestDashboardQueriesUseRealMetrics: deploy/monitoring/dashboard.json is a
// Grafana dashboard whose every query names metrics the binaries export,
// with labels they have, through the dashboard's data source and job
// variables; its panels do not overlap, and it shows what operators need.
func TestDashboardQueriesUseRealMetrics(t *testing.T) {
	cat := loadCatalog(t)
	var d dashboard
	if err := json.Unmarshal([]byte(repoFile(t, "deploy/monitoring/dashboard.json")), &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q title %q schemaVersion %d: want a uid, a title and schema 36 or later", d.UID, d.Title, d.SchemaVersion)
	}
	jobVars := map[string]string{"controlplane": "$controlplane_job", "agent": "$agent_job"}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		q, _ := v.Query.(map[string]any)
		if v.Type != "query" {
			continue
		}
		m := regexp.MustCompile(`^label_values\(([a-z_]+), job\)$`).FindStringSubmatch(fmt.Sprint(q["query"]))
		if m == nil {
			t.Errorf("variable %s: query %v, want label_values(<metric>, job)", v.Name, q["query"])
			continue
		}
		if want := "$" + v.Name; jobVars[cat.binary[m[1]]] != want {
			t.Errorf("variable %s lists the jobs of %s, which the %s exports", v.Name, m[1], cat.binary[m[1]])
		}
	}
	for _, name := range []string{"datasource", "controlplane_job", "agent_job"} {
		if !vars[name] {
			t.Errorf("no %s variable", name)
		}
	}
	used := map[string]bool{}
	ids := map[int]bool{}
	var boxes []dashboardPanel
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: grid position %+v outside the 24-column grid", p.Title, g)
		}
		for _, o := range boxes {
			og := o.GridPos
			if g.X < og.X+og.W && og.X < g.X+g.W && g.Y < og.Y+og.H && og.Y < g.Y+g.H {
				t.Errorf("panels %q and %q overlap", p.Title, o.Title)
			}
		}
		boxes = append(boxes, p)
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || p.Description == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: needs a title, a description and queries", p.ID, p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the datasource variable", p.Title)
		}
		for _, tg := range p.Targets {
			for _, problem := range cat.checkQuery(tg.Expr, jobVars) {
				t.Errorf("panel %q query %s: %s\n  %s", p.Title, tg.RefID, problem, tg.Expr)
			}
			if q, err := ParseQuery(tg.Expr); err == nil {
				for _, s := range q.Selectors {
					used[s.Metric] = true
				}
			}
		}
	}
	// What issue #29 asks the dashboard to show, by the metric that shows it.
	for what, metric := range map[string]string{
		"fleet programming latency":           "kubeproxy_network_programming_duration_seconds_bucket",
		"agents behind":                       "vsplane_controlplane_agent_pending_resources",
		"NACKs":                               "vsplane_controlplane_nacks_total",
		"held removals":                       "vsplane_agent_held_removals",
		"per-node apply durations":            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
		"control-plane memory":                "process_resident_memory_bytes",
		"control-plane CPU":                   "process_cpu_seconds_total",
		"stream counts":                       "vsplane_controlplane_connected_agents",
		"stream rejections":                   "vsplane_controlplane_agent_streams_rejected_total",
		"rollout progress":                    "vsplane_controlplane_rollout_nodes",
		"draining real servers":               "vsplane_agent_draining_real_servers",
		"resources the agents cannot program": "vsplane_agent_failed_resources",
	} {
		if !used[metric] {
			t.Errorf("the dashboard does not show %s (%s)", what, metric)
		}
	}
}

// TestQueryCheckCatchesMistakes: the checks above fail on the mistakes
// they exist for.
func TestQueryCheckCatchesMistakes(t *testing.T) {
	cat := loadCatalog(t)
	jobs := map[string]string{"controlplane": "$controlplane_job", "agent": "$agent_job"}
	for expr, want := range map[string]string{
		`sum(rate(vsplane_controlplane_deltas_sent{job=~"$controlplane_job"}[5m]))`:                  "no binary exports it",
		`sum by (node) (vsplane_controlplane_deltas_sent_total{job=~"$controlplane_job"})`:           `groups by "node"`,
		`vsplane_controlplane_nacks_total{job=~"$controlplane_job",reason="x"}`:                      `has no label "reason"`,
		`vsplane_agent_held_removals{job=~"$controlplane_job"}`:                                      "want the agent job variable",
		`process_resident_memory_bytes`:                                                              "job variable",
		`vsplane_controlplane_nothing_bucket{job=~"$controlplane_job"}`:                              "no binary exports it",
		`vsplane_controlplane_connected_agents_bucket{job=~"$controlplane_job"}`:                     "not a histogram",
		`histogram_quantil(0.9, rate(kubeproxy_network_programming_duration_seconds_bucket[5m]))`:    "not a PromQL function",
		`sum(rate(vsplane_controlplane_deltas_sent_total{job=~"$controlplane_job"}[5m])`:             "not closed",
		`vsplane_controlplane_nacks_total{job=~"$controlplane_job",node="a}`:                         "not terminated",
		`vsplane_controlplane_nacks_total{job=~"$controlplane_job",node}`:                            "malformed matcher",
		`max by (instance) (vsplane_controlplane_rollout_leader{job=~"$controlplane_job"}) == 1 ; 2`: "unexpected",
	} {
		problems := cat.checkQuery(expr, jobs)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("%s: problems %q, want one saying %q", expr, problems, want)
		}
	}
	good := `histogram_quantile(0.99, sum by (instance, le) (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{job=~"$agent_job"}[$__rate_interval])))`
	if problems := cat.checkQuery(good, jobs); len(problems) != 0 {
		t.Errorf("%s: %q", good, problems)
	}
}
