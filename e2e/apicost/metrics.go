package apicost

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// The API server's own metrics this benchmark reads (kube-apiserver v1.37;
// labels group/version/resource on the watch metrics, group/resource on the
// watch-cache metric).
const (
	// metricWatchEvents counts events written to watch clients, one per
	// event per watch (so N watchers of one object count N).
	metricWatchEvents = "apiserver_watch_events_total"
	// metricWatchSizes is the histogram of those events' encoded sizes;
	// its _sum is the bytes sent, its _count equals metricWatchEvents.
	metricWatchSizes = "apiserver_watch_events_sizes"
	// metricDispatched counts events the watch cache dispatched (once per
	// event, whatever the number of watchers).
	metricDispatched = "apiserver_watch_cache_events_dispatched_total"
	// metricRequests and metricResponseSizes give the LIST requests and
	// their response bytes (verb="LIST").
	metricRequests      = "apiserver_request_total"
	metricResponseSizes = "apiserver_response_sizes"
	// metricLongRunning is the gauge of open watches (verb="WATCH").
	metricLongRunning = "apiserver_longrunning_requests"
	// metricSelfRequests counts the API server's requests to itself.
	metricSelfRequests = "apiserver_selfrequest_total"
)

// Resource is an API resource as the metrics label it.
type Resource struct {
	Group    string `json:"group"`
	Resource string `json:"resource"`
}

func (r Resource) String() string {
	if r.Group == "" {
		return r.Resource
	}
	return r.Resource + "." + r.Group
}

// Resources a test asks a Delta about.
var (
	ResourceServices       = Resource{"", "services"}
	ResourceEndpointSlices = Resource{"discovery.k8s.io", "endpointslices"}
)

// The resources the scenarios watch; totals are taken over these only, so
// the API server's own traffic (leases, flow control) does not count.
var (
	resServices      = ResourceServices
	resSlices        = ResourceEndpointSlices
	resNodes         = Resource{"", "nodes"}
	resNamespaces    = Resource{"", "namespaces"}
	resServiceCIDRs  = Resource{"networking.k8s.io", "servicecidrs"}
	resRollouts      = Resource{"vsplane.io", "schedulerrollouts"}
	watchedResources = []Resource{resServices, resSlices, resNodes, resNamespaces, resServiceCIDRs, resRollouts}
)

// Counters are the API server's counters for one resource (cumulative in a
// scrape, a difference in a delta).
type Counters struct {
	// WatchEvents and WatchBytes: events written to watch clients and the
	// sum of their encoded sizes.
	WatchEvents float64 `json:"watch_events"`
	WatchBytes  float64 `json:"watch_bytes"`
	// Dispatched: events the watch cache dispatched.
	Dispatched float64 `json:"watch_cache_events_dispatched"`
	// ListRequests and ListBytes: LIST requests answered and their bytes;
	// SelfListRequests: how many of them the API server made to itself
	// (its ClusterIP repair loop lists every Service every few minutes).
	ListRequests     float64 `json:"list_requests"`
	ListBytes        float64 `json:"list_bytes"`
	SelfListRequests float64 `json:"self_list_requests"`
}

func (c Counters) sub(o Counters) Counters {
	return Counters{c.WatchEvents - o.WatchEvents, c.WatchBytes - o.WatchBytes, c.Dispatched - o.Dispatched,
		c.ListRequests - o.ListRequests, c.ListBytes - o.ListBytes, c.SelfListRequests - o.SelfListRequests}
}

func (c Counters) add(o Counters) Counters {
	return Counters{c.WatchEvents + o.WatchEvents, c.WatchBytes + o.WatchBytes, c.Dispatched + o.Dispatched,
		c.ListRequests + o.ListRequests, c.ListBytes + o.ListBytes, c.SelfListRequests + o.SelfListRequests}
}

func (c Counters) zero() bool { return c == Counters{} }

// Scrape is one reading of /metrics: counters by resource, and the open
// watches by resource.
type Scrape struct {
	Counters map[Resource]Counters
	Watches  map[Resource]float64
}

// Delta is what happened between two scrapes to the watched resources, by
// resource (those with a change) and in total.
type Delta struct {
	ByResource map[string]Counters `json:"by_resource"`
	Total      Counters            `json:"total"`
}

func (s Scrape) delta(since Scrape) Delta {
	d := Delta{ByResource: map[string]Counters{}}
	for r, c := range s.Counters {
		diff := c.sub(since.Counters[r])
		if diff.zero() || !slices.Contains(watchedResources, r) {
			continue
		}
		d.ByResource[r.String()] = diff
		d.Total = d.Total.add(diff)
	}
	return d
}

// Of returns the delta's counters of one resource.
func (d Delta) Of(r Resource) Counters { return d.ByResource[r.String()] }

// sub is d minus base, resource by resource (base: the same churn with no
// scenario watcher, i.e. the API server's own watchers).
func (d Delta) sub(base Delta) Delta {
	out := Delta{ByResource: map[string]Counters{}, Total: d.Total.sub(base.Total)}
	for _, r := range slices.Sorted(maps.Keys(mergeKeys(d.ByResource, base.ByResource))) {
		if c := d.ByResource[r].sub(base.ByResource[r]); !c.zero() {
			out.ByResource[r] = c
		}
	}
	return out
}

func mergeKeys(a, b map[string]Counters) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// scrape reads the API server's /metrics through the client.
func scrape(ctx context.Context, kube kubernetes.Interface) (Scrape, error) {
	b, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return Scrape{}, fmt.Errorf("apicost: GET /metrics: %w", err)
	}
	return parseMetrics(b)
}

// parseMetrics picks the metrics above out of the Prometheus text format.
// A missing metric is an error: the numbers would silently be zero.
func parseMetrics(b []byte) (Scrape, error) {
	s := Scrape{Counters: map[Resource]Counters{}, Watches: map[Resource]float64{}}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, err := parseSample(line)
		if err != nil {
			return Scrape{}, err
		}
		r := Resource{Group: labels["group"], Resource: labels["resource"]}
		c := s.Counters[r]
		switch name {
		case metricWatchEvents:
			c.WatchEvents += value
		case metricWatchSizes + "_sum":
			c.WatchBytes += value
		case metricDispatched:
			c.Dispatched += value
		case metricRequests:
			if labels["verb"] != "LIST" || labels["subresource"] != "" {
				continue
			}
			c.ListRequests += value
		case metricResponseSizes + "_sum":
			if labels["verb"] != "LIST" || labels["subresource"] != "" {
				continue
			}
			c.ListBytes += value
		case metricSelfRequests:
			if labels["verb"] != "LIST" || labels["subresource"] != "" {
				continue
			}
			c.SelfListRequests += value
		case metricLongRunning:
			seen[name] = true
			if labels["verb"] == "WATCH" {
				s.Watches[r] += value
			}
			continue
		default:
			continue
		}
		seen[name] = true
		s.Counters[r] = c
	}
	if err := sc.Err(); err != nil {
		return Scrape{}, fmt.Errorf("apicost: reading metrics: %w", err)
	}
	for _, m := range []string{metricWatchEvents, metricWatchSizes + "_sum", metricDispatched, metricRequests, metricResponseSizes + "_sum", metricLongRunning} {
		if !seen[m] {
			return Scrape{}, fmt.Errorf("apicost: the API server exposes no %s", m)
		}
	}
	return s, nil
}

// parseSample splits `name{k="v",...} value [timestamp]`.
func parseSample(line string) (name string, labels map[string]string, value float64, err error) {
	bad := func() error { return fmt.Errorf("apicost: malformed metrics line %q", line) }
	labels = map[string]string{}
	rest := line
	if i := strings.IndexAny(line, "{ "); i < 0 {
		return "", nil, 0, bad()
	} else {
		name, rest = line[:i], line[i:]
	}
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, ", ")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return "", nil, 0, bad()
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var v strings.Builder
			i := 0
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
					switch rest[i] {
					case 'n':
						v.WriteByte('\n')
					default:
						v.WriteByte(rest[i])
					}
					continue
				}
				v.WriteByte(rest[i])
			}
			if i == len(rest) {
				return "", nil, 0, bad()
			}
			labels[key] = v.String()
			rest = rest[i+1:]
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", nil, 0, bad()
	}
	switch fields[0] {
	case "+Inf":
		value = math.Inf(1)
	case "-Inf":
		value = math.Inf(-1)
	default:
		if value, err = strconv.ParseFloat(fields[0], 64); err != nil {
			return "", nil, 0, bad()
		}
	}
	return name, labels, value, nil
}
