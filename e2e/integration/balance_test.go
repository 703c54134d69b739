package integration_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/vsplane/vsplane/controlplane/app"
	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/dataplane/agent"
	"github.com/vsplane/vsplane/dataplane/kernel/memory"
)

// balanceReport is what TestAgentsSpreadOverReplicas measures; it is
// written to _out/bench/balance.json.
type balanceReport struct {
	Agents   int `json:"agents"`
	Replicas int `json:"replicas"`
	Services int `json:"services"`
	// Agents per replica (in address order) at each stage.
	Start            []int   `json:"start"`
	AfterRestart     []int   `json:"after_restart"`
	AfterAgeing      []int   `json:"after_ageing"`
	RestartedAgents  int     `json:"restarted_replica_agents"`
	BurstSeconds     float64 `json:"reconnect_burst_seconds"`
	ResourcesResent  int     `json:"resources_resent"`
	RemovalsSent     int     `json:"removals_sent"`
	MaxConnectionAge string  `json:"max_connection_age"`
	// Requests all replicas (and the test's Service creates) made to the
	// API server over the run.
	APIServerWrites int64 `json:"apiserver_writes"`
	APIServerReads  int64 `json:"apiserver_reads"`
}

// Several hundred agents over three replicas: they start spread; when one
// replica goes away its agents split over the others and resume with
// nothing resent (the reconnect burst is measured); connections age out
// (MaxConnectionAge), so the agents spread over all three again, including
// the restarted one. Measured, written to _out/bench/balance.json.
func TestAgentsSpreadOverReplicas(t *testing.T) {
	const agentsN, services = 300, 50
	env, _, ctx := startKubeEnv(t, nodeNamesN(agentsN)...)
	// Every request the replicas make, counted: the fleet-wide view and the
	// agents' churn must cost the API server no writes.
	var reads, writes atomic.Int64
	rc := env.RESTConfig()
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet {
				reads.Add(1)
			} else {
				writes.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range services {
		mustCreateService(t, ctx, kube, clusterIPService("default", fmt.Sprintf("svc-%02d", i), 80))
	}
	const age = 4 * time.Second
	lns := []net.Listener{listen(t), listen(t), listen(t)}
	addrs := []string{lns[0].Addr().String(), lns[1].Addr().String(), lns[2].Addr().String()}
	logs := []*deltaLog{{}, {}, {}}
	replicas := make([]*app.Replica, 3)
	stops := make([]func(), 3)
	cfg := func(i int, ln net.Listener) app.Config {
		return app.Config{Kube: kube, GRPCListener: ln, Advertise: addrs[i], Peers: addrs,
			MaxConnectionAge: time.Hour, Stream: stream.Options{Hooks: logs[i].hooks()}}
	}
	for i := range 3 {
		replicas[i], stops[i] = runReplica(t, ctx, cfg(i, lns[i]))
		awaitReady(t, replicas[i], converge)
	}
	stateDir := t.TempDir()
	agents := make([]*testAgent, agentsN)
	for i, n := range nodeNamesN(agentsN) {
		agents[i] = startAgentCfg(t, ctx, agent.Config{ControlPlane: addrs, NodeName: n,
			Kernel: ptr(memory.New().Kernel()), StateDir: filepath.Join(stateDir, n)})
	}
	t.Cleanup(func() {
		for _, a := range agents {
			a.stop(t)
		}
	})
	spread := func() []int {
		out := make([]int, 3)
		for i, r := range replicas {
			if r != nil {
				out[i] = r.Streams.Registry().Len()
			}
		}
		return out
	}
	inSync := func(rs ...int) string {
		n := 0
		for _, i := range rs {
			for _, info := range replicas[i].Streams.Registry().ListAgents(false) {
				if info.GetLastAck() != nil && info.GetPendingResources() == 0 {
					n++
				}
			}
		}
		if n != agentsN {
			return fmt.Sprintf("%d of %d agents in sync (spread %v)", n, agentsN, spread())
		}
		return ""
	}
	eventually(t, 2*time.Minute, func() string { return inSync(0, 1, 2) })
	rep := balanceReport{Agents: agentsN, Replicas: 3, Services: services, Start: spread(), MaxConnectionAge: age.String()}
	t.Logf("agents per replica at start: %v", rep.Start)
	for i, n := range rep.Start {
		if n == 0 {
			t.Errorf("replica %d got no agents at start: %v", i, rep.Start)
		}
	}

	// Replica 0 goes away: its agents move to 1 and 2.
	rep.RestartedAgents = rep.Start[0]
	marks := []int{0, logs[1].mark(), logs[2].mark()}
	stops[0]()
	replicas[0] = nil
	start := time.Now()
	eventually(t, 2*time.Minute, func() string { return inSync(1, 2) })
	rep.BurstSeconds = time.Since(start).Seconds()
	rep.AfterRestart = spread()
	for i := 1; i < 3; i++ {
		for _, d := range logs[i].since(marks[i]) {
			rep.ResourcesResent += len(d.resources)
			rep.RemovalsSent += len(d.removed)
		}
	}
	t.Logf("replica 0's %d agents resumed on the others in %.2fs; spread %v; resent %d resources, %d removals",
		rep.RestartedAgents, rep.BurstSeconds, rep.AfterRestart, rep.ResourcesResent, rep.RemovalsSent)
	if rep.ResourcesResent != 0 || rep.RemovalsSent != 0 {
		t.Errorf("resuming agents were sent %d resources and %d removals; want none", rep.ResourcesResent, rep.RemovalsSent)
	}
	if rep.AfterRestart[1] <= rep.Start[1] || rep.AfterRestart[2] <= rep.Start[2] {
		t.Errorf("the stopped replica's agents did not split over both others: %v -> %v", rep.Start, rep.AfterRestart)
	}

	// Replica 0 comes back (same address) and the others are restarted
	// too, all with a short connection age (a rollout setting the flag):
	// as connections age out, agents spread over all three again.
	var restarted time.Time
	for i := range 3 {
		if i > 0 {
			stops[i]()
		}
		ln, err := net.Listen("tcp", addrs[i])
		if err != nil {
			t.Fatal(err)
		}
		c := cfg(i, ln)
		c.MaxConnectionAge, c.MaxConnectionAgeGrace = age, time.Second
		replicas[i], _ = runReplica(t, ctx, c)
		awaitReady(t, replicas[i], converge)
		restarted = time.Now()
	}
	// Wait until every agent connected after its connection had to age out
	// twice (age minus gRPC's 10% jitter), then count.
	eventually(t, 2*time.Minute, func() string {
		for i := range 3 {
			for _, info := range replicas[i].Streams.Registry().ListAgents(false) {
				if info.GetConnectedSince().AsTime().Before(restarted.Add(2 * age * 9 / 10)) {
					return fmt.Sprintf("%s has not moved twice yet (on replica %d)", info.GetNodeName(), i)
				}
			}
		}
		return inSync(0, 1, 2)
	})
	rep.AfterAgeing = spread()
	t.Logf("after the restarts and connection ageing (%v): spread %v", age, rep.AfterAgeing)
	if slices.Contains(rep.AfterAgeing, 0) {
		t.Errorf("a replica has no agents after connections aged out: %v", rep.AfterAgeing)
	}
	rep.APIServerWrites, rep.APIServerReads = writes.Load(), reads.Load()
	t.Logf("requests to the API server through the replicas' client over the whole run: %d writes (the test's own %d Service creates), %d reads (lists and watches)",
		rep.APIServerWrites, services, rep.APIServerReads)
	if rep.APIServerWrites != int64(services) {
		t.Errorf("replicas wrote to the API server %d times (beyond the %d Services this test created through the same client); the fleet view must cost none", rep.APIServerWrites-int64(services), services)
	}
	writeReport(t, "balance.json", rep)
}

func nodeNamesN(n int) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = fmt.Sprintf("node-%03d", i)
	}
	return out
}

// writeReport writes v as JSON to _out/bench/name at the repository root.
func writeReport(t *testing.T, name string, v any) {
	t.Helper()
	dir := filepath.Join("..", "..", "_out", "bench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", filepath.Join(dir, name))
}
