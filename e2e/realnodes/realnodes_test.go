// Package realnodes runs vsplane the way users run it, on real nodes in the
// VM test bed (e2e/cluster.StartReal): kubelets start the Pods, the
// EndpointSlice controller writes the slices, CoreDNS answers through a
// ClusterIP, and vsplane runs as a Deployment and a DaemonSet from its own
// images, installed from its Helm chart (deploy/helm/vsplane with
// ci/testbed-values.yaml; the conformance runs and `make demo REAL_NODES=1`
// apply deploy/overlays/testbed, which e2e/integration checks holds the same
// objects). One
// cluster serves every test (TestRealNodes' steps run in order; the last
// ones break and repair things).
package realnodes

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/soak"
)

// rc is the cluster every test shares (started by TestMain).
var (
	rc       *cluster.RealCluster
	startErr error
	started  time.Duration
)

func TestMain(m *testing.M) {
	log, _ := zap.NewDevelopment()
	t0 := time.Now()
	rc, startErr = cluster.StartReal(context.Background(), cluster.RealOptions{FromChart: true, Log: log.Named("real"),
		GoPackages: []string{soak.KStatePackage}})
	started = time.Since(t0)
	code := m.Run()
	if rc != nil {
		if err := rc.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the real cluster:", err)
		}
	}
	os.Exit(code)
}

// TestRealNodes runs the checks in order on the one cluster.
func TestRealNodes(t *testing.T) {
	if startErr != nil {
		t.Fatalf("the real-node cluster did not start: %v", startErr)
	}
	t.Logf("real-node cluster up in %v", started.Round(time.Second))
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"VsplaneRunsFromItsManifests", testVsplaneFromManifests},
		{"KubectlPluginThroughPortForward", testKubectlPlugin},
		{"PodReachesServiceByName", testServiceByName},
		{"NodePortFromOutside", testNodePortFromOutside},
		{"SessionAffinityClientIP", testSessionAffinity},
		{"UDPAcrossEndpointChange", testUDPAcrossEndpointChange},
		{"ControlPlanePodDeletedAndAgentsRolledUnderLoad", testFailoverUnderLoad},
		{"RuntimeDownNodeNotReady", testRuntimeDown},
		{"ImageImportFailureNamesImage", testImageImportFailure},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			// Later steps assume the cluster the earlier ones left.
			t.Logf("pods after %s failed:\n%s", s.name, rc.PodsSummary(context.Background()))
		}
	}
}

func stepContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func contains(s string, subs ...string) error {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return fmt.Errorf("%q not in:\n%s", sub, s)
		}
	}
	return nil
}
