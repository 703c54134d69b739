package apicost_test

import (
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/apicost"
)

// TestAPICostTiny runs every scenario at a tiny size and checks what the
// API server's metrics must show if they are read right: every scenario
// converged, each of the N kube-proxy-like watchers was sent every slice
// and Service update (N x K, N x M), and the one control-plane watch at
// least K and M. No timing is asserted.
func TestAPICostTiny(t *testing.T) {
	const n, k, m = 5, 20, 2
	rep := apicost.Run(t, apicost.Options{
		Size:         apicost.Size{Watchers: n, Services: 20, Endpoints: 10},
		SliceUpdates: k, ServiceUpdates: m, Writers: 4, Timeout: 40 * time.Second,
	})
	if len(rep.Problems) > 0 {
		t.Fatalf("problems: %v", rep.Problems)
	}
	for _, c := range []struct {
		scenario     string
		slices, svcs float64
	}{
		{apicost.ScenarioKubeProxy, n * k, n * m},
		{apicost.ScenarioControlPlane, k, m},
		{apicost.ScenarioControlPlanePB, k, m},
	} {
		s := rep.Scenario(c.scenario)
		if s == nil || !s.Converged {
			t.Fatalf("%s: missing or not converged: %+v", c.scenario, s)
		}
		if got := s.Churn.Of(apicost.ResourceEndpointSlices).WatchEvents; got < c.slices {
			t.Errorf("%s: %v EndpointSlice watch events for the churn, want at least %v", c.scenario, got, c.slices)
		}
		if got := s.Churn.Of(apicost.ResourceServices).WatchEvents; got < c.svcs {
			t.Errorf("%s: %v Service watch events for the churn, want at least %v", c.scenario, got, c.svcs)
		}
		if s.Churn.Total.WatchBytes <= 0 {
			t.Errorf("%s: no watch bytes for the churn", c.scenario)
		}
	}
}
