package apicost

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

const sampleMetrics = `# HELP apiserver_watch_events_total [BETA] Number of events sent in watch clients
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group="",resource="services",version="v1"} 7
apiserver_watch_events_total{group="discovery.k8s.io",resource="endpointslices",version="v1"} 40
apiserver_watch_events_sizes_sum{group="discovery.k8s.io",resource="endpointslices",version="v1"} 1.5e+06
apiserver_watch_events_sizes_count{group="discovery.k8s.io",resource="endpointslices",version="v1"} 40
apiserver_watch_cache_events_dispatched_total{group="discovery.k8s.io",resource="endpointslices"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="cluster",subresource="",verb="LIST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="cluster",subresource="",verb="GET",version="v1"} 9
apiserver_response_sizes_sum{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="LIST",version="v1"} 300
apiserver_selfrequest_total{group="",resource="services",subresource="",verb="LIST"} 1
apiserver_longrunning_requests{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
some_other_metric{path="a \"quoted\", odd} label"} +Inf
`

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics([]byte(sampleMetrics))
	if err != nil {
		t.Fatal(err)
	}
	want := Scrape{
		Counters: map[Resource]Counters{
			ResourceServices:       {WatchEvents: 7, ListRequests: 2, ListBytes: 300, SelfListRequests: 1},
			ResourceEndpointSlices: {WatchEvents: 40, WatchBytes: 1.5e6, Dispatched: 4},
		},
		Watches: map[Resource]float64{ResourceServices: 3},
	}
	if d := cmp.Diff(want, s); d != "" {
		t.Errorf("parse (-want +got):\n%s", d)
	}
	later := Scrape{Counters: map[Resource]Counters{
		ResourceServices:       {WatchEvents: 9, ListRequests: 2, ListBytes: 300, SelfListRequests: 1},
		ResourceEndpointSlices: {WatchEvents: 50, WatchBytes: 2e6, Dispatched: 5},
		{"", "leases"}:         {WatchEvents: 100},
	}}
	d := later.delta(s)
	wantDelta := Delta{
		ByResource: map[string]Counters{"services": {WatchEvents: 2}, "endpointslices.discovery.k8s.io": {WatchEvents: 10, WatchBytes: 5e5, Dispatched: 1}},
		Total:      Counters{WatchEvents: 12, WatchBytes: 5e5, Dispatched: 1},
	}
	if diff := cmp.Diff(wantDelta, d); diff != "" {
		t.Errorf("delta (-want +got), leases must not count:\n%s", diff)
	}
}

func TestParseMetricsMissing(t *testing.T) {
	if _, err := parseMetrics([]byte("apiserver_watch_events_total{resource=\"services\"} 1\n")); err == nil {
		t.Error("want an error when metrics are missing")
	}
}
