package images

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
)

// guestImage is where the unpacked agent image lies in the VM.
const guestImage = "/images/vsplane-agent"

// TestAgentImageInVM runs the agent image's root filesystem on the real
// kernel: unpacked on the host, copied into the QEMU test bed, and started
// per node like a privileged DaemonSet pod (inside the node's network
// namespace, chrooted into the image with the image's environment, the
// host's /proc, /sys, /dev, /run and /lib/modules mounted), so every
// iptables program and library it runs is the image's. node1 starts empty
// and gets the image's default backend (nft; the guest's own `iptables` is
// legacy); node2 already holds a legacy rule, so its agent picks the image's
// iptables-legacy. Both program IPVS, ipsets and iptables for a ClusterIP
// Service that answers from a client routed through each node, which takes
// the agents' masquerade rules.
func TestAgentImageInVM(t *testing.T) {
	dir, imgs := built(t)
	rootfs, l := unpack(t, dir, imgs["vsplane-agent"])
	cfg := l.Config.Config
	if !slices.Equal(cfg.Entrypoint, []string{"/vsplane-agent"}) || (cfg.User != "0:0" && cfg.User != "") {
		t.Fatalf("image config: user %q, entrypoint %q", cfg.User, cfg.Entrypoint)
	}
	var path string
	for _, e := range cfg.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	if path == "" {
		t.Fatalf("the image sets no PATH: %q", cfg.Env)
	}

	deadline := time.Now().Add(10 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-20*time.Second).Before(deadline) {
		deadline = d.Add(-20 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()

	// What a runtime does for the DaemonSet: the host's /proc, /sys (the
	// node's: "ip netns exec" mounted it), /dev, /run (state, credentials,
	// the xtables lock) and /lib/modules, then the entrypoint with the
	// image's environment only. The mounts live in ip netns exec's mount
	// namespace and go with the agent.
	agentExec := fmt.Sprintf(`sh -c 'R=%s && mkdir -p $R/usr/lib/modules && `+
		`mount -o rbind /proc $R/proc && mount -o rbind /sys $R/sys && mount -o rbind /dev $R/dev && `+
		`mount -o bind /run $R/run && mount -o bind /lib/modules $R/usr/lib/modules && `+
		`exec env -i %s chroot $R %s "$@"' vsplane-agent`,
		guestImage, strings.Join(cfg.Env, " "), cfg.Entrypoint[0])
	c := cluster.StartForTest(t, ctx, cluster.Options{
		Nodes:     2,
		Pods:      [][]string{{"pod-a"}, {"pod-b"}},
		Trees:     []vm.Tree{{Host: rootfs, Guest: guestImage}},
		AgentExec: agentExec,
		AgentArgs: "--debug",
		NoAgent:   []string{"node2"},
		Log:       zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
	})
	t.Logf("cluster up in %v (VM build %v, boot %v); node1's agent runs from the image",
		time.Since(start).Round(time.Millisecond), c.VM.BuildTime.Round(time.Millisecond), c.VM.BootTime.Round(time.Millisecond))

	// node2 stands for a host whose rules are in legacy iptables (the guest's
	// own iptables is legacy): its agent must take the image's iptables-legacy.
	if _, err := c.RunInNode(ctx, "node2", "iptables-legacy -t filter -A INPUT -m comment --comment host-rule -j ACCEPT"); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(ctx, "node2"); err != nil {
		t.Fatal(err)
	}

	// The image's tools, not the guest's: the image's default iptables is
	// nft, the guest's is legacy; inside the chroot the guest's files are
	// out of reach.
	out, err := c.VM.RunOK(ctx, fmt.Sprintf("iptables --version; chroot %[1]s /usr/sbin/iptables --version; "+
		"chroot %[1]s /usr/sbin/iptables-legacy-save --version; ls -l /usr/sbin/iptables", guestImage))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 || !strings.Contains(lines[0], "(legacy)") || !strings.Contains(lines[1], "(nf_tables)") || !strings.Contains(lines[2], "(legacy)") {
		t.Fatalf("want the guest's iptables legacy and the image's nft (its -legacy legacy), got:\n%s", out)
	}

	// Each agent process: its root is the image, its environment the image's.
	// pidof also names a child the agent is forking (an iptables-restore
	// caught between fork and exec, CI 2026-12-06): only processes with a
	// --node-name are agents.
	out, err = c.VM.RunOK(ctx, `for p in $(pidof vsplane-agent); do grep -qa -- --node-name /proc/$p/cmdline || continue; echo "pid $p root $(readlink /proc/$p/root) node $(tr '\0' ' ' < /proc/$p/cmdline | sed 's/.*--node-name \([^ ]*\).*/\1/') env $(tr '\0' ' ' < /proc/$p/environ)"; done`)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 7 || f[2] != "root" || f[4] != "node" || f[6] != "env" {
			t.Fatalf("cannot read agent processes:\n%s", out)
		}
		if f[3] != guestImage {
			t.Errorf("agent on %s runs in root %q, not the image at %s", f[5], f[3], guestImage)
		}
		if env := strings.Join(f[7:], " "); env != strings.Join(cfg.Env, " ") {
			t.Errorf("agent on %s has environment %q, want the image's %q", f[5], env, cfg.Env)
		}
		nodes[f[5]] = true
	}
	if !nodes["node1"] || !nodes["node2"] {
		t.Fatalf("want an agent process per node, got:\n%s", out)
	}

	// The backend each agent chose, from its log.
	for node, want := range map[string]string{"node1": `"backend":"nft"`, "node2": `"backend":"legacy"`} {
		log, err := c.AgentLog(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		var ready string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "iptables ready") {
				ready = l
			}
		}
		if !strings.Contains(ready, want) {
			t.Errorf("agent on %s: want %s in its 'iptables ready' line, got %q", node, want, ready)
		}
	}

	// A ClusterIP Service with a backend on each node.
	ports := []cluster.Port{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	backends, err := c.Backends("pod-a", "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	vip, err := c.CreateService(ctx, "default", "web", ports, backends)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{c.Pods["pod-a"].IP + ":8080", c.Pods["pod-b"].IP + ":8080"}
	for _, n := range []string{"node1", "node2"} {
		if err := c.AwaitServing(ctx, n, vip, 80, 1, want, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.AwaitAcked(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}

	// The rules are in the backend each agent chose, and only there.
	for node, backends := range map[string][2]string{"node1": {"nft", "legacy"}, "node2": {"legacy", "nft"}} {
		out, err := c.RunInNode(ctx, node, fmt.Sprintf("iptables-%s-save -t nat; echo ---; iptables-%s-save -t nat", backends[0], backends[1]))
		if err != nil {
			t.Fatal(err)
		}
		used, other, _ := strings.Cut(out, "---")
		for _, rule := range []string{"-A PREROUTING", "-j KUBE-SERVICES", "-A KUBE-POSTROUTING", "-j MASQUERADE"} {
			if !strings.Contains(used, rule) {
				t.Errorf("%s: %s nat table lacks %q:\n%s", node, backends[0], rule, used)
			}
		}
		if strings.Contains(other, "KUBE-") {
			t.Errorf("%s: the agent wrote %s rules too:\n%s", node, backends[1], other)
		}
	}

	// What the agents ran (--debug logs each iptables-restore).
	for node, want := range map[string]string{"node1": `"cmd":"/usr/sbin/iptables-nft-restore"`, "node2": `"cmd":"/usr/sbin/iptables-legacy-restore"`} {
		log, err := c.AgentLog(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(log, want) {
			t.Errorf("agent on %s never ran %s:\n%s", node, want, tail(log, 20))
		}
	}

	// Traffic: from a client routed through each node, both backends answer;
	// the answers from the other node's pod come back only through the
	// masquerade rule in that node's chosen backend.
	client2, err := c.Topo.AddClient(ctx, "client2", c.Nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	for _, from := range []*vm.Netns{c.Client, client2} {
		sum, raw, err := c.RequestsFrom(ctx, from, "tcp", vip+":80", 20, "2s")
		if err != nil {
			t.Fatalf("requests from %s: %v\n%s", from.Name, err, raw)
		}
		if sum.Backends["pod-a"] == 0 || sum.Backends["pod-b"] == 0 || sum.OK != 20 {
			t.Errorf("20 requests from %s through %s: want every one answered by pod-a and pod-b, got %d ok, %v", from.Name, vip, sum.OK, sum.Backends)
		}
	}
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}
