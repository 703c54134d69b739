// Command demo is vsplane's main job on one machine: a real etcd +
// kube-apiserver and a control-plane replica on loopback, a QEMU VM with two
// nodes each running a real vsplane-agent, and a demo Service with one pod
// on each node, answered through IPVS. It prints the node snapshot (grpcurl),
// node1's IPVS table and requests through the ClusterIP, then keeps running
// (until SIGINT/SIGTERM or --duration) so it can be poked at, and cleans up.
// With --real-nodes it runs the real-node cluster instead (kubelets,
// containerd, Pods; vsplane from its images and manifests; CoreDNS; see
// real.go). Run it with `make demo` (scripts/demo.sh ensures the
// dependencies; REAL_NODES=1 for --real-nodes).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	duration := flag.Duration("duration", 0, "stop after this long once the demo is up (0: run until interrupted)")
	period := flag.Duration("reconcile-period", 10*time.Second, "the agents' --reconcile-period")
	requests := flag.Int("requests", 10, "requests to send through the ClusterIP (1..1000)")
	verbose := flag.Bool("v", false, "log progress of every component")
	real := flag.Bool("real-nodes", false, "real nodes: kubelets, containerd and Pods in the VM, vsplane deployed from its images and manifests, CoreDNS (about 2.5 minutes to start here)")
	flag.Parse()
	if *duration < 0 || *period <= 0 || *requests < 1 || *requests > 1000 {
		return errors.New("need --duration >= 0, --reconcile-period > 0, 1 <= --requests <= 1000")
	}

	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
	if !*verbose {
		logCfg.Level = zap.NewAtomicLevelAt(zapcore.WarnLevel)
	}
	log, err := logCfg.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := measure.RepoRoot(wd)
	if err != nil {
		return err
	}
	grpcurl := filepath.Join(root, "bin", "grpcurl")
	if _, err := os.Stat(grpcurl); err != nil {
		return fmt.Errorf("%s missing: run make tools", grpcurl)
	}

	// First signal: clean shutdown, at any stage (start-up included).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *real {
		return runReal(ctx, grpcurl, *requests, *duration, log)
	}
	t0 := time.Now()
	step("starting etcd + kube-apiserver, the control plane, the VM (node1, node2) and two agents")
	c, err := cluster.Start(ctx, cluster.Options{
		Nodes:           2,
		Pods:            [][]string{{"pod-a"}, {"pod-b"}},
		ReconcilePeriod: *period,
		Log:             log,
	})
	if err != nil {
		return err
	}
	defer func() {
		step("cleaning up: agents, VM, control plane, apiserver")
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: teardown:", err)
		}
	}()
	fmt.Printf("  apiserver %s, control plane 127.0.0.1:%d, VM build %v + boot %v, all up in %v\n",
		c.Env.Host, c.CPPort, c.VM.BuildTime.Round(time.Millisecond), c.VM.BootTime.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))

	const ns, name = "demo", "hello"
	step("creating Service demo/hello (ClusterIP, TCP 80 -> 8080) with endpoints pod-a (node1) and pod-b (node2)")
	backends, err := c.Backends("pod-a", "pod-b")
	if err != nil {
		return err
	}
	created := time.Now()
	vip, err := c.CreateService(ctx, ns, name, []cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}, backends)
	if err != nil {
		return err
	}
	want := []string{backends[0].IP + ":8080", backends[1].IP + ":8080"}
	for _, n := range c.Nodes {
		if err := c.AwaitServing(ctx, n.Name, vip, 80, 1, want, 2*time.Minute); err != nil {
			return err
		}
	}
	if err := c.AwaitAcked(ctx, time.Minute); err != nil {
		return err
	}
	fmt.Printf("  ClusterIP %s; in both nodes' kernels and acknowledged %v after creation\n", vip, time.Since(created).Round(time.Millisecond))

	cp := fmt.Sprintf("127.0.0.1:%d", c.CPPort)
	// The control plane serves TLS and checks a bearer token (TokenReview +
	// RBAC), like a real deployment; grpcurl gets the CA, the name in the
	// certificate and a ServiceAccount token.
	tls, err := c.GRPCurlArgs()
	if err != nil {
		return err
	}
	section("(a) node1's desired state, from the control plane (grpcurl)")
	if err := show(ctx, grpcurl, append(tls, "-d", `{"node_name":"node1"}`, cp, "vsplane.v1.InspectService/GetNodeSnapshot")...); err != nil {
		return err
	}
	section("(a) connected agents (grpcurl ListAgents)")
	if err := show(ctx, grpcurl, append(tls, cp, "vsplane.v1.InspectService/ListAgents")...); err != nil {
		return err
	}

	section("(b) node1's kernel: ipvsadm -Ln")
	out, err := c.IPVS(ctx, "node1")
	if err != nil {
		return err
	}
	fmt.Print(out)

	section(fmt.Sprintf("(c) %d requests from the client namespace to %s:80 (routed via node1); each answer names its backend", *requests, vip))
	sum, raw, err := c.Requests(ctx, "tcp", vip+":80", *requests)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
		if !strings.HasPrefix(l, "summary ") {
			fmt.Println("  " + l)
		}
	}
	fmt.Printf("  => %d answered, %d failed; per backend: %v\n", sum.OK, sum.Fail, sum.Backends)
	if sum.Fail > 0 {
		return fmt.Errorf("%d requests through the ClusterIP failed", sum.Fail)
	}

	section("poke at it")
	fmt.Printf(`  G="%[2]s -cacert %[5]s -servername %[6]s"; T="authorization: Bearer $(cat %[7]s)"
  $G %[1]s list
  $G -H "$T" %[1]s vsplane.v1.InspectService/ListAgents
  $G -H "$T" -d '{"node_name":"node2"}' %[1]s vsplane.v1.InspectService/GetNodeSnapshot
  kubectl:    %[8]s --kubeconfig %[3]s -n demo get svc,endpointslices
              %[8]s --kubeconfig %[3]s get schedulerrollouts
  apiserver:  %[4]s
  change the Service's endpoints or add Services with the kubeconfig; the agents program node1/node2.
`, cp, grpcurl, c.Env.Kubeconfig, c.Env.Host, c.Sec.Files.CA, c.Sec.ServerName, c.Sec.TokenFile, filepath.Join(c.Env.BinDir, "kubectl"))
	return waitFor(ctx, *duration)
}

// waitFor keeps the demo up for duration (0: until interrupted).
func waitFor(ctx context.Context, duration time.Duration) error {
	if duration > 0 {
		fmt.Printf("\nrunning for %v (Ctrl-C stops earlier)\n", duration)
		select {
		case <-ctx.Done():
		case <-time.After(duration):
		}
	} else {
		fmt.Println("\nrunning until interrupted (Ctrl-C)")
		<-ctx.Done()
	}
	return nil
}

// readTrim is a file's content without surrounding space ("" if unreadable).
func readTrim(file string) string {
	b, _ := os.ReadFile(file)
	return strings.TrimSpace(string(b))
}

func step(what string) { fmt.Printf("==> %s\n", what) }

func section(title string) {
	fmt.Printf("\n===== %s =====\n", title)
}

// show runs a host command, printing its command line and output.
func show(ctx context.Context, name string, args ...string) error {
	return showEnv(ctx, nil, name, args...)
}

// showEnv is show with extra environment variables.
func showEnv(ctx context.Context, env []string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if strings.ContainsAny(a, " '\"{}$*?;&|<>()\\") {
			quoted[i] = vm.ShellQuote(a)
		}
	}
	prefix := ""
	for _, e := range env {
		prefix += e + " "
	}
	fmt.Printf("$ %s%s %s\n", prefix, filepath.Base(name), strings.Join(quoted, " "))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	fmt.Print(string(out))
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(name), err)
	}
	return nil
}
