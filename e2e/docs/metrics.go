// Package docs keeps the operator documentation honest: the metrics
// reference in docs/operations.md must name exactly the metrics the binaries
// register, and the alerting rules and the Grafana dashboard in
// deploy/monitoring only those, with labels they have.
package docs

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/controlplane/engine"
	cpmetrics "github.com/vsplane/vsplane/controlplane/metrics"
	"github.com/vsplane/vsplane/controlplane/rollout"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	agentmetrics "github.com/vsplane/vsplane/dataplane/metrics"
	"github.com/vsplane/vsplane/internal/grpcserver"
)

// Metric is one registered metric family.
type Metric struct {
	Name, Help string
	Labels     []string
}

// recorder is a Registerer that keeps what each collector describes.
type recorder struct{ descs []*prometheus.Desc }

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		r.descs = append(r.descs, d)
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

var descRE = regexp.MustCompile(`fqName: "([^"]*)", help: "((?:[^"\\]|\\.)*)",.* variableLabels: \{([^}]*)\}`)

// Registered returns the metric families the control plane and the agent
// register themselves (not the Go and process collectors), by binary.
func Registered() (controlPlane, agent []Metric, err error) {
	cp := &recorder{}
	if _, err := cpmetrics.New(cp); err != nil {
		return nil, nil, err
	}
	if _, err := engine.New(engine.Config{Metrics: cp}, snapshot.NewStore(), zap.NewNop()); err != nil {
		return nil, nil, err
	}
	if _, err := grpcserver.New(grpcserver.Options{Registerer: cp}); err != nil {
		return nil, nil, err
	}
	cp.MustRegister(rollout.NewCollector(nil, nil))
	cp.MustRegister(config.NewReloader(config.Source{}, &config.Loaded{Config: config.Defaults()}, time.Second, zap.NewNop()).Collectors()...)
	ag := &recorder{}
	if _, err := agentmetrics.New(ag, agentmetrics.Options{}); err != nil {
		return nil, nil, err
	}
	return parse(cp.descs), parse(ag.descs), nil
}

func parse(descs []*prometheus.Desc) []Metric {
	var out []Metric
	for _, d := range descs {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		var labels []string
		for l := range strings.SplitSeq(m[3], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		out = append(out, Metric{Name: m[1], Help: m[2], Labels: labels})
	}
	slices.SortFunc(out, func(a, b Metric) int { return cmp.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b Metric) bool { return a.Name == b.Name })
}
