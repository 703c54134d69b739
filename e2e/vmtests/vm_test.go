// Package vmtests runs vsplane end to end on a real kernel: a real
// kube-apiserver + etcd and an in-process control plane on the host, and real
// vsplane-agents in node network namespaces of the QEMU test bed (e2e/vm),
// with traffic from a client namespace through IPVS to pod namespaces. It
// also runs the kernel contract suite (dataplane/kernel/linux, tag vmtest)
// and the ipvs-match iptables read-back (dataplane/rules, tag vmtest) inside
// the VM. Missing QEMU, kernel or apiserver binaries fail the test:
// run scripts/vm/deps.sh and scripts/kube/build.sh.
package vmtests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

const (
	ns      = "default"
	svcName = "web"
	// reconcilePeriod is the agents' full-reconcile period; (e) expects a
	// hand-made change repaired within it (plus slack for TCG).
	reconcilePeriod = 3 * time.Second
	converge        = 60 * time.Second
	poll            = 500 * time.Millisecond
	// restartLoop requests, one per 100ms, span the agent restart (~1-3s).
	restartLoop = 150
)

var ports = []cluster.Port{
	{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
	{Name: "dns", Port: 80, Protocol: corev1.ProtocolUDP},
}

func TestVM(t *testing.T) {
	run := newVMRun(t, 9*time.Minute)
	ctx, phase := run.ctx, run.phase

	kernelTest := buildTestBinary(t, ctx, "./dataplane/kernel/linux", "kernel-linux.test")
	rulesTest := buildTestBinary(t, ctx, "./dataplane/rules", "rules.test")
	phase("build kernel-linux.test, rules.test")

	c := run.startCluster(cluster.Options{
		Nodes:           2,
		Pods:            [][]string{{"pod-a"}, {"pod-b", "pod-c"}},
		ReconcilePeriod: reconcilePeriod,
		Binaries:        []string{kernelTest, rulesTest},
		Log:             zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	t.Logf("VM build %v, boot %v; control plane %s", c.VM.BuildTime.Round(time.Millisecond), c.VM.BootTime.Round(time.Millisecond), c.CPAddr)
	phase("apiserver+control plane+VM+agents")

	backends := func(names ...string) []cluster.Backend {
		t.Helper()
		b, err := c.Backends(names...)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var vip string
	ok := t.Run("a: ClusterIP Service with one endpoint per node is programmed and load-balanced", func(t *testing.T) {
		var err error
		vip, err = c.CreateService(ctx, ns, svcName, ports, backends("pod-a", "pod-b"))
		if err != nil {
			t.Fatal(err)
		}
		want := []string{c.Pods["pod-a"].IP + ":8080", c.Pods["pod-b"].IP + ":8080"}
		for _, n := range c.Nodes {
			awaitServing(t, ctx, c, n.Name, vip, want)
		}
		// node1 is the client's router: VIP bound, ipset entry.
		mustAwait(t, ctx, func(ctx context.Context) error {
			out, err := c.RunInNode(ctx, "node1", "/usr/sbin/ip addr show kube-ipvs0; echo ---; ipset list KUBE-CLUSTER-IP")
			if err != nil {
				return err
			}
			addrs, sets, _ := strings.Cut(out, "---")
			if !strings.Contains(addrs, " "+vip+"/32 ") {
				return fmt.Errorf("%s not bound to kube-ipvs0:\n%s", vip, addrs)
			}
			for _, e := range []string{vip + ",tcp:80", vip + ",udp:80"} {
				if !strings.Contains(sets, e) {
					return fmt.Errorf("KUBE-CLUSTER-IP lacks %s:\n%s", e, sets)
				}
			}
			return nil
		})
		sum := requests(t, ctx, c, "tcp", vip+":80", 20)
		if sum.Backends["pod-a"] == 0 || sum.Backends["pod-b"] == 0 {
			t.Fatalf("20 requests did not reach both backends: %v", sum.Backends)
		}
	})
	phase("a: create + traffic")
	if !ok {
		t.FailNow() // the rest builds on this Service
	}

	t.Run("b: endpoint change moves traffic to the new set", func(t *testing.T) {
		if err := c.SetEndpoints(ctx, ns, svcName, ports, backends("pod-b", "pod-c")); err != nil {
			t.Fatal(err)
		}
		awaitServing(t, ctx, c, "node1", vip, []string{c.Pods["pod-b"].IP + ":8080", c.Pods["pod-c"].IP + ":8080"})
		sum := requests(t, ctx, c, "tcp", vip+":80", 20)
		if sum.Backends["pod-a"] != 0 || sum.Backends["pod-b"] == 0 || sum.Backends["pod-c"] == 0 {
			t.Fatalf("want only pod-b and pod-c to answer, got %v", sum.Backends)
		}
	})
	phase("b: endpoint change")

	t.Run("c: the Service's UDP port answers", func(t *testing.T) {
		sum := requests(t, ctx, c, "udp", vip+":80", 10)
		if sum.Backends["pod-a"] != 0 || sum.Backends["pod-b"]+sum.Backends["pod-c"] != 10 {
			t.Fatalf("want UDP answers from pod-b/pod-c only, got %v", sum.Backends)
		}
	})
	phase("c: UDP")

	t.Run("d: agent restart changes nothing and drops no request", func(t *testing.T) {
		before := ipvsTable(t, ctx, c, "node1")
		loop, err := c.StartRequestLoop(ctx, "restart-loop", "tcp", vip+":80", restartLoop, "100ms")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := loop.AwaitLog(ctx, "2 ok"); err != nil {
			t.Fatalf("request loop: %v", err)
		}
		st, err := c.StopAgent(ctx, "node1", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("agent stopped (exit %d)", st.ExitCode)
		if err := c.StartAgent(ctx, "node1"); err != nil {
			t.Fatal(err)
		}
		if l, _ := loop.Log(ctx); strings.Contains(l, "summary ") {
			t.Errorf("request loop ended before the agent was back; it does not cover the restart")
		}
		sum, out, err := cluster.LoopResult(ctx, loop)
		if err != nil {
			t.Fatalf("request loop: %v\n%s", err, tail(out, 20))
		}
		if sum.Fail != 0 || sum.OK != restartLoop {
			t.Errorf("requests during the restart: %d ok, %d failed\n%s", sum.OK, sum.Fail, tail(out, 20))
		}
		after := ipvsTable(t, ctx, c, "node1")
		// Draining (weight 0) real servers may finish draining meanwhile.
		if d := cmp.Diff(before.WithoutDraining(), after.WithoutDraining()); d != "" {
			t.Errorf("ipvsadm -Ln changed across the restart (-before +after):\n%s", d)
		}
		l, err := c.AgentLog(ctx, "node1")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(l, "restored applied state") {
			t.Errorf("restarted agent did not restore its applied state:\n%s", tail(l, 20))
		}
	})
	phase("d: agent restart")

	t.Run("e: a flushed IPVS table is repaired by the periodic reconcile", func(t *testing.T) {
		before := ipvsTable(t, ctx, c, "node1")
		if _, err := c.RunInNode(ctx, "node1", "ipvsadm -C"); err != nil {
			t.Fatal(err)
		}
		flushed := time.Now()
		// Bounded: the period plus slack for a busy TCG guest.
		err := cluster.Await(ctx, reconcilePeriod+30*time.Second, poll, func(ctx context.Context) error {
			out, err := c.IPVS(ctx, "node1")
			if err != nil {
				return err
			}
			got, err := cluster.ParseIPVSADM(out)
			if err != nil {
				return err
			}
			if len(got.Find(vip, 80)) != 2 {
				return fmt.Errorf("not repaired:\n%s", got)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("repaired %v after ipvsadm -C (reconcile period %v)", time.Since(flushed).Round(time.Millisecond), reconcilePeriod)
		after := ipvsTable(t, ctx, c, "node1")
		// Draining real servers were flushed with the rest; not restoring them is right.
		if d := cmp.Diff(before.WithoutDraining(), after.WithoutDraining()); d != "" {
			t.Errorf("repaired table differs (-before +after):\n%s", d)
		}
	})
	phase("e: ipvsadm -C repair")

	t.Run("e2: a Service address deleted from kube-ipvs0 is bound again on the kernel's word", func(t *testing.T) {
		// The agent hears of the removal over rtnetlink and reconciles at
		// once (dataplane/reconcile/addrwatch.go); its log says so. The
		// periodic reconcile (3 s here) would repair it too, so the log
		// line, not the time, tells the two apart.
		if _, err := c.RunInNode(ctx, "node1", "/usr/sbin/ip addr del "+vip+"/32 dev kube-ipvs0"); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		mustAwait(t, ctx, func(ctx context.Context) error {
			out, err := c.RunInNode(ctx, "node1", "/usr/sbin/ip -4 addr show dev kube-ipvs0")
			if err != nil {
				return err
			}
			if !strings.Contains(out, " "+vip+"/32 ") {
				return fmt.Errorf("%s not bound again:\n%s", vip, out)
			}
			return nil
		})
		t.Logf("bound again %v after its deletion", time.Since(deleted).Round(time.Millisecond))
		mustAwait(t, ctx, func(ctx context.Context) error {
			l, err := c.AgentLog(ctx, "node1")
			if err != nil {
				return err
			}
			if !strings.Contains(l, "a Service address was removed from its interface") || !strings.Contains(l, vip) {
				return fmt.Errorf("the agent's log does not tell of the removal:\n%s", tail(l, 20))
			}
			return nil
		})
	})
	phase("e2: address removal repaired")

	t.Run("f: deleting the Service unbinds the VIP and removes the virtual servers", func(t *testing.T) {
		if err := c.DeleteService(ctx, ns, svcName); err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			mustAwait(t, ctx, func(ctx context.Context) error {
				out, err := c.RunInNode(ctx, n.Name, "ipvsadm -Ln; echo ---; /usr/sbin/ip addr show kube-ipvs0")
				if err != nil {
					return err
				}
				ipvs, addrs, _ := strings.Cut(out, "---")
				if strings.Contains(ipvs, vip+":") {
					return fmt.Errorf("%s: virtual server still there:\n%s", n.Name, ipvs)
				}
				if strings.Contains(addrs, " "+vip+"/") {
					return fmt.Errorf("%s: %s still bound:\n%s", n.Name, vip, addrs)
				}
				return nil
			})
		}
	})
	phase("f: delete")

	t.Run("g: kernel contract suite on the real kernel", func(t *testing.T) {
		gctx, gcancel := context.WithTimeout(ctx, 4*time.Minute)
		defer gcancel()
		res, err := c.VM.Run(gctx, "cd /tmp && "+filepath.Base(kernelTest)+" -test.v -test.run TestVM -test.timeout 3m 2>&1")
		if err != nil {
			t.Fatal(err)
		}
		passed := strings.Count(res.Stdout, "--- PASS")
		t.Logf("kernel-linux.test: exit %d, %d PASS lines, %d FAIL lines", res.ExitCode, passed, strings.Count(res.Stdout, "--- FAIL"))
		if res.ExitCode != 0 || res.TimedOut || !strings.Contains(res.Stdout, "\nPASS") || passed == 0 {
			t.Fatalf("kernel contract suite failed in the VM (exit %d, timed out %v); failures:\n%s\n...\n%s",
				res.ExitCode, res.TimedOut, failures(res.Stdout), tail(res.Stdout, 10))
		}
		// Suites that exist for the real kernel alone must have run.
		for _, name := range []string{"TestVMIPVSContract", "TestVMDestinationDumperContract", "TestVMVirtualServerDigesterContract", "TestVMLinksContract", "TestVMAddressWatcherContract"} {
			if !strings.Contains(res.Stdout, "--- PASS: "+name+" ") {
				t.Errorf("kernel-linux.test did not pass %s", name)
			}
		}
	})
	phase("g: kernel contract suite")

	// The iptables rules whose matches this host's kernel lacks (the ipvs
	// match of KUBE-IPVS-OUT-FILTER) must load and read back unchanged on
	// the real kernel, legacy and nft, v4 and v6.
	t.Run("h: iptables rules with the ipvs match on the real kernel", func(t *testing.T) {
		hctx, hcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer hcancel()
		res, err := c.VM.Run(hctx, "cd /tmp && "+filepath.Base(rulesTest)+" -test.v -test.run TestRealIPVSMatchReadBack -test.timeout 90s 2>&1")
		if err != nil {
			t.Fatal(err)
		}
		passed := strings.Count(res.Stdout, "--- PASS")
		t.Logf("rules.test: exit %d, %d PASS lines", res.ExitCode, passed)
		if res.ExitCode != 0 || res.TimedOut || !strings.Contains(res.Stdout, "\nPASS") || passed == 0 {
			t.Fatalf("ipvs-match rules failed in the VM (exit %d, timed out %v); failures:\n%s\n...\n%s",
				res.ExitCode, res.TimedOut, failures(res.Stdout), tail(res.Stdout, 10))
		}
	})
	phase("h: ipvs-match rules")
}

// buildTestBinary builds the vmtest-tagged test binary of pkg (static), to
// run inside the VM.
func buildTestBinary(t *testing.T, ctx context.Context, pkg, name string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := measure.RepoRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-tags", "vmtest", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	return out
}

func mustAwait(t *testing.T, ctx context.Context, cond func(context.Context) error) {
	t.Helper()
	if err := cluster.Await(ctx, converge, poll, cond); err != nil {
		t.Fatal(err)
	}
}

func ipvsTable(t *testing.T, ctx context.Context, c *cluster.Cluster, node string) cluster.IPVSTable {
	t.Helper()
	out, err := c.IPVS(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := cluster.ParseIPVSADM(out)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// awaitServing waits until node has a TCP and a UDP virtual server on
// vip:80, each with exactly want (non-draining) as real servers.
func awaitServing(t *testing.T, ctx context.Context, c *cluster.Cluster, node, vip string, want []string) {
	t.Helper()
	if err := c.AwaitServing(ctx, node, vip, 80, 2, want, converge); err != nil {
		t.Fatal(err)
	}
}

func requests(t *testing.T, ctx context.Context, c *cluster.Cluster, proto, addr string, n int) wire.Summary {
	t.Helper()
	s, out, err := c.Requests(ctx, proto, addr, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d %s requests to %s: %d ok, %d failed, per backend %v", n, proto, addr, s.OK, s.Fail, s.Backends)
	if s.Fail != 0 || s.OK != n {
		t.Fatalf("%d of %d requests failed:\n%s", n-s.OK, n, tail(out, 20))
	}
	return s
}

// failures picks the failing tests and their messages out of go test -v output.
func failures(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "--- FAIL") || strings.Contains(l, "panic:") || fileLine.MatchString(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

var fileLine = regexp.MustCompile(`\w+\.go:\d+: `)

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
