package fanout

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// awaitInSync waits until the control plane sees every agent connected,
// with an Ack and nothing pending (its Acks may still be on the way when
// the agents' side is done).
func (b *bench) awaitInSync(when string) {
	deadline := time.Now().Add(b.o.Timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		msg := b.fleetInSync()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			b.problem("%s: control plane's view not in sync within %v: %s", when, b.o.Timeout, msg)
			return
		}
		select {
		case <-b.ctx.Done():
			b.fatalf("%v", b.ctx.Err())
		case <-tick.C:
		}
	}
}

func (b *bench) fleetInSync() string {
	resp, err := b.insp.ListAgents(b.ctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
	if err != nil {
		return err.Error()
	}
	want := len(b.w.nodes)
	var bad []string
	seen := 0
	for _, a := range resp.GetAgents() {
		seen++
		if a.GetLastAck() == nil || a.GetPendingResources() != 0 || a.GetNacks() != 0 {
			bad = append(bad, fmt.Sprintf("%s (pending %d, NACKs %d, acked %v)", a.GetNodeName(), a.GetPendingResources(), a.GetNacks(), a.GetLastAck() != nil))
		}
	}
	if seen != want || len(bad) > 0 {
		return fmt.Sprintf("%d of %d agents connected; not in sync: %d %v", seen, want, len(bad), bad[:min(len(bad), 5)])
	}
	return ""
}

// verify compares agents' kernels with the expected IPVS state and their
// held versions with the control plane's snapshot of their node.
func (b *bench) verify() {
	b.awaitInSync("at the end")
	want := b.expectedIPVS()
	agents := b.fleet.Agents()
	pick := len(agents)
	if b.o.VerifyAgents > 0 && b.o.VerifyAgents < pick {
		pick = b.o.VerifyAgents
	}
	var bad []string // first few in detail, then only counted
	fail := func(format string, args ...any) {
		if len(bad) < 3 {
			b.problem(format, args...)
		}
		bad = append(bad, fmt.Sprintf(format, args...))
	}
	for k := range pick {
		a := agents[k*len(agents)/pick]
		if msg := diffIPVS(ipvsOf(a), want); msg != "" {
			fail("%s: IPVS state differs from the cluster's: %s", a.Node, msg)
		}
		snap, err := b.insp.GetNodeSnapshot(b.ctx, &vsplanev1.GetNodeSnapshotRequest{NodeName: a.Node})
		if err != nil {
			fail("%s: GetNodeSnapshot: %v", a.Node, err)
			continue
		}
		desired := map[string]string{}
		for _, r := range snap.GetResources() {
			desired[r.GetName()] = r.GetVersion()
		}
		if msg := diffVersions(a.Rec.Versions(), desired); msg != "" {
			fail("%s: held versions differ from the control plane's snapshot: %s", a.Node, msg)
		}
	}
	if len(bad) > 3 {
		b.problem("... and %d more agent problems", len(bad)-3)
	}
	if n := b.fleet.Counters().NACKs; n != 0 {
		b.problem("agents NACKed %d Deltas", n)
	}
	b.t.Logf("verified %d of %d agents: IPVS state and held versions", pick, len(agents))
}

// expectedIPVS is every node's IPVS state: one virtual server per Service
// (TCP ClusterIP:80, rr) with its current endpoints at weight 1, and
// default/kubernetes without real servers.
func (b *bench) expectedIPVS() map[string][]string {
	out := map[string][]string{vsKey(b.kubeSvcIP, 443): {}}
	for _, s := range b.w.svcs {
		var d []string
		for _, ip := range s.ips {
			d = append(d, fmt.Sprintf("%s:%d w=1", ip, targetPort))
		}
		sort.Strings(d)
		out[vsKey(s.clusterIP, servicePort)] = d
	}
	return out
}

// vsKey renders a virtual server as ipvsOf does: TCP, scheduler rr (the
// default), no flags, no persistence.
func vsKey(ip string, port uint16) string {
	k := kernel.VirtualServerKey{Family: kernel.FamilyIPv4, Address: netip.MustParseAddr(ip), Protocol: kernel.ProtocolTCP, Port: port}
	return renderVS(kernel.VirtualServer{Key: k, Scheduler: wire.DefaultScheduler})
}

func renderVS(vs kernel.VirtualServer) string {
	return fmt.Sprintf("%s %s flags=%#x timeout=%d", vs.Key, vs.Scheduler, uint32(vs.Flags&^kernel.FlagHashed), vs.Timeout)
}

// ipvsOf renders an agent's IPVS table: virtual server (key, scheduler,
// flags, persistence) -> sorted "addr:port w=N".
func ipvsOf(a *Agent) map[string][]string {
	k := a.Kernel.Kernel().IPVS
	vss, err := k.ListVirtualServers()
	if err != nil {
		return map[string][]string{"error": {err.Error()}}
	}
	out := map[string][]string{}
	for _, vs := range vss {
		ds, err := k.ListDestinations(vs.Key)
		if err != nil {
			out[renderVS(vs)] = []string{"error: " + err.Error()}
			continue
		}
		lines := []string{}
		for _, d := range ds {
			lines = append(lines, fmt.Sprintf("%s w=%d", d.Key(), d.Weight))
		}
		sort.Strings(lines)
		out[renderVS(vs)] = lines
	}
	return out
}

func diffIPVS(got, want map[string][]string) string {
	var diffs []string
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			diffs = append(diffs, k+" missing")
		} else if !slices.Equal(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s: got %v, want %v", k, g, w))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, k+" unexpected")
		}
	}
	sort.Strings(diffs)
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprintf("%d differences: %s", len(diffs), strings.Join(diffs[:min(len(diffs), 3)], "; "))
}

func diffVersions(got, want map[string]string) string {
	var diffs []string
	for k, w := range want {
		if g := got[k]; g != w {
			diffs = append(diffs, fmt.Sprintf("%s: held %q, desired %q", k, g, w))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, k+" held, not desired")
		}
	}
	sort.Strings(diffs)
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprintf("%d differences: %s", len(diffs), strings.Join(diffs[:min(len(diffs), 3)], "; "))
}
