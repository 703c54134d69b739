package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// hostServer is a loopback TCP server on the host answering like e2ehelper
// serve, counting connections.
type hostServer struct {
	ln    net.Listener
	conns atomic.Int64
}

func startHostServer(t *testing.T) *hostServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &hostServer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			fmt.Fprintf(c, "host from %s\n", c.RemoteAddr())
			c.Close()
		}
	}()
	return s
}

func (s *hostServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// TestBed proves the VM test bed: a real kernel with IPVS, dummy links, ipset
// types loaded on demand, node and pod namespaces, and the host's loopback
// reachable from a node namespace through guestfwd.
func TestBed(t *testing.T) {
	testStart := time.Now()
	last := testStart
	phase := func(what string) {
		t.Logf("%-28s %8v (total %v)", what, time.Since(last).Round(time.Millisecond),
			time.Since(testStart).Round(time.Millisecond))
		last = time.Now()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	host := startHostServer(t)

	v, err := Boot(ctx, Options{GuestFwdPorts: []int{host.port()}, Log: zaptest.NewLogger(t)})
	if err != nil {
		if errors.Is(err, ErrDepsMissing) {
			t.Fatalf("the VM test bed cannot run here: %v", err)
		}
		t.Fatalf("boot: %v", err)
	}
	defer v.Stop()
	defer func() {
		if t.Failed() {
			t.Logf("console tail:\n%s", v.ConsoleTail(60))
		}
	}()
	t.Logf("build %v, boot %v (QEMU start until vmexec answered)", v.BuildTime.Round(time.Millisecond),
		v.BootTime.Round(time.Millisecond))
	phase("build+boot")

	out, err := v.RunOK(ctx, "uname -r; ipvsadm -v; /usr/sbin/ip -V")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest: %s", strings.ReplaceAll(strings.TrimSpace(out), "\n", " | "))

	topo, err := NewTopology(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	node, err := topo.AddNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	podA := mustPod(ctx, t, node, "pod-a")
	podB := mustPod(ctx, t, node, "pod-b")
	clientPod := mustPod(ctx, t, node, "client-pod")
	extClient, err := topo.AddClient(ctx, "client", node)
	if err != nil {
		t.Fatal(err)
	}
	phase("topology")

	servers := map[string]*Proc{}
	for _, p := range []*Pod{podA, podB} {
		proc, err := p.Start(ctx, "serve-"+p.Name, "e2ehelper serve --name "+p.Name+" --tcp :8080 --udp :8053")
		if err != nil {
			t.Fatal(err)
		}
		servers[p.Name] = proc
	}
	if _, err := servers["pod-a"].AwaitLog(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Pod{podA, podB} {
		if _, err := node.RunOK(ctx, "e2ehelper wait --timeout 60s --addr "+p.IP+":8080"); err != nil {
			t.Fatalf("backend %s not up: %v", p.Name, err)
		}
	}
	phase("backends up")

	// IPVS by hand, as kube-proxy would program a ClusterIP service.
	ipvs := fmt.Sprintf(`set -e
/usr/sbin/ip link add kube-ipvs0 type dummy
/usr/sbin/ip addr add 198.18.0.10/32 dev kube-ipvs0
ipvsadm -A -t 198.18.0.10:80 -s rr
ipvsadm -a -t 198.18.0.10:80 -r %[1]s:8080 -m
ipvsadm -a -t 198.18.0.10:80 -r %[2]s:8080 -m
ipvsadm -A -u 198.18.0.10:53 -s rr
ipvsadm -a -u 198.18.0.10:53 -r %[1]s:8053 -m
ipvsadm -a -u 198.18.0.10:53 -r %[2]s:8053 -m
`, podA.IP, podB.IP)
	if _, err := node.RunOK(ctx, ipvs); err != nil {
		t.Fatal(err)
	}
	phase("IPVS programmed")

	t.Run("tcp via IPVS from a pod", func(t *testing.T) {
		out := request(ctx, t, &clientPod.Netns, "tcp", "198.18.0.10:80", 20)
		// Masq mode without SNAT: the backends see the client pod's own address.
		if !strings.Contains(out, "from "+clientPod.IP+":") {
			t.Errorf("backends did not see the client's address %s:\n%s", clientPod.IP, out)
		}
	})
	t.Run("tcp via IPVS from a client behind the node", func(t *testing.T) {
		request(ctx, t, extClient, "tcp", "198.18.0.10:80", 20)
	})
	t.Run("udp via IPVS from a pod", func(t *testing.T) {
		request(ctx, t, &clientPod.Netns, "udp", "198.18.0.10:53", 20)
	})

	t.Run("long-lived connection through IPVS, background processes", func(t *testing.T) {
		hold, err := clientPod.Start(ctx, "hold",
			"e2ehelper hold --addr 198.18.0.10:80 --interval 200ms --duration 2s --timeout 5s")
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		st, err := hold.Wait(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Running || st.ExitCode != 0 {
			t.Fatalf("hold: running=%v exit=%d\n%s", st.Running, st.ExitCode, st.Log)
		}
		sum, err := ParseSummary(st.Log)
		if err != nil {
			t.Fatal(err)
		}
		if sum.OK < 2 || sum.Fail != 0 || len(sum.Backends) != 1 {
			t.Errorf("one connection should echo several lines from one backend: %+v\n%s", sum, st.Log)
		}
		// e2ehelper exits 0 on SIGTERM.
		st, err = servers["pod-b"].Kill(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Running || st.ExitCode != 0 || !strings.Contains(st.Log, "ready") {
			t.Errorf("killed server: running=%v exit=%d log=%q", st.Running, st.ExitCode, st.Log)
		}
	})

	t.Run("node reaches host loopback through guestfwd", func(t *testing.T) {
		before := host.conns.Load()
		addr := fmt.Sprintf("%s:%d", HostLoopIP, host.port())
		out, err := node.RunOK(ctx, "e2ehelper request --proto tcp --count 3 --timeout 10s --addr "+addr)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := ParseSummary(out)
		if err != nil {
			t.Fatal(err)
		}
		if sum.OK != 3 || sum.Backends["host"] != 3 {
			t.Errorf("want 3 answers from the host, got %+v\n%s", sum, out)
		}
		if got := host.conns.Load() - before; got != 3 {
			t.Errorf("host server saw %d connections, want 3", got)
		}
	})

	t.Run("kernel loads ipset types, xt matches, schedulers, nf_tables on demand", func(t *testing.T) {
		// None of these modules is loaded at boot: the kernel calls /sbin/modprobe.
		script := `set -e
ipset create KUBE-LOOP-BACK hash:ip,port,ip
ipset add KUBE-LOOP-BACK 198.19.1.11,tcp:8080,198.19.1.11
ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
iptables -t nat -N KUBE-TEST
iptables -t nat -A KUBE-TEST -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
iptables-save -t nat | grep -c match-set
ipvsadm -A -t 198.18.0.20:80 -s mh -b flag-1,flag-2
ipvsadm -A -u 198.18.0.20:53 -s wlc
iptables-nft -t filter -N KUBE-NFT-TEST
iptables-nft -t filter -A KUBE-NFT-TEST -m comment --comment test -j RETURN
ip6tables -t nat -N KUBE-TEST6
echo 1 > /proc/sys/net/ipv4/vs/conntrack
echo "vs.conntrack=$(cat /proc/sys/net/ipv4/vs/conntrack)"
ipvsadm -Ln
ipset list -n`
		out, err := node.RunOK(ctx, script)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"KUBE-LOOP-BACK", "KUBE-NODE-PORT-TCP", "vs.conntrack=1",
			"198.18.0.20:80 mh (mh-fallback,mh-port)", "198.18.0.20:53 wlc"} {
			if !strings.Contains(out, want) {
				t.Errorf("ipset list lacks %s:\n%s", want, out)
			}
		}
	})

	phase("checks")
	t.Logf("test wall time %v", time.Since(testStart).Round(time.Millisecond))
}

func mustPod(ctx context.Context, t *testing.T, n *Node, name string) *Pod {
	t.Helper()
	p, err := n.AddPod(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// request sends count requests from ns with e2ehelper and checks that both
// backends answered every one of them between them, round robin.
func request(ctx context.Context, t *testing.T, ns *Netns, proto, addr string, count int) string {
	t.Helper()
	out, err := ns.RunOK(ctx, fmt.Sprintf("e2ehelper request --proto %s --addr %s --count %d --timeout 5s",
		proto, addr, count))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := ParseSummary(out)
	if err != nil {
		t.Fatal(err)
	}
	if sum.OK != count || sum.Fail != 0 {
		t.Fatalf("want %d answers, got %+v\n%s", count, sum, out)
	}
	if sum.Backends["pod-a"] != count/2 || sum.Backends["pod-b"] != count/2 {
		t.Errorf("round robin over pod-a and pod-b should split %d evenly, got %v\n%s", count, sum.Backends, out)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if strings.Contains(sc.Text(), " fail:") {
			t.Errorf("failed request: %s", sc.Text())
		}
	}
	return out
}

// TestBootReplacesAWedgedGuest makes the first guest's settle check hang, as
// a guest wedged right after boot does, and expects Boot to replace it with a
// working one and keep the first console.
func TestBootReplacesAWedgedGuest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	v, err := Boot(ctx, Options{Log: zaptest.NewLogger(t), KeepWorkDir: true, hangFirstSettle: true})
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	defer func() {
		v.opts.KeepWorkDir = false
		v.Stop()
	}()
	if v.WedgedBoots != 1 {
		t.Fatalf("WedgedBoots = %d, want 1", v.WedgedBoots)
	}
	if out, err := v.RunOK(ctx, "/usr/sbin/ip netns add probe && /usr/sbin/ip netns del probe && echo ok"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("the replacement guest: %q, %v", out, err)
	}
	first, err := os.ReadFile(filepath.Join(v.WorkDir(), "console-wedged-1.log"))
	if err != nil {
		t.Fatalf("the wedged guest's console: %v", err)
	}
	if !strings.Contains(string(first), readyMarker) {
		t.Errorf("the wedged guest's console does not show vmexec serving:\n%s", first)
	}
}
