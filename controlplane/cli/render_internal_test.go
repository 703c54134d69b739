package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

var now = time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)

func ago(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(-d)) }

// fleet: node-a in sync and draining one real server, node-b behind by 3
// resources, node-c NACKing one, node-d holding a mass removal.
func fleet() StatusReport {
	caps := &vsplanev1.Capabilities{IpvsSchedulers: []string{"rr", "wrr", "mh"}, Ipv6: true, KernelVersion: "6.12.0", IptablesBackend: "nft"}
	agents := []*vsplanev1.AgentInfo{
		{NodeName: "node-a", Replica: "10.0.0.1:18000", Capabilities: caps, LastAck: ago(3 * time.Second)},
		{NodeName: "node-b", Replica: "10.0.0.2:18000", Capabilities: caps, LastAck: ago(90 * time.Second), PendingResources: 3, Lag: durationpb.New(42 * time.Second)},
		{NodeName: "node-c", Replica: "10.0.0.1:18000", Capabilities: caps, LastAck: ago(5 * time.Minute), Nacks: 7, Nacked: map[string]string{"svc/default/web": "abc: no such scheduler"}},
		{NodeName: "node-d", Replica: "10.0.0.2:18000", Capabilities: &vsplanev1.Capabilities{IpvsSchedulers: []string{"rr"}, Sctp: true}},
	}
	statuses := []*vsplanev1.AgentStatus{
		{Draining: []*vsplanev1.DrainingRealServer{{VirtualServer: "tcp/10.96.0.10:80", Address: "10.244.1.5", Port: 8080, Since: ago(time.Minute), ActiveConnections: 2}}},
		nil,
		{KernelErrors: []string{"ipvs: no such scheduler"}},
		{HeldRemoval: &vsplanev1.HeldRemoval{Removals: 40, HeldServices: 50, Since: ago(time.Minute), Target: "10.0.0.2:18000"}},
	}
	r := StatusReport{UnreachableReplicas: []string{"10.0.0.3:18000"}}
	for i, a := range agents {
		r.Nodes = append(r.Nodes, newNodeStatus(a, statuses[i]))
	}
	return r
}

func TestStatusTable(t *testing.T) {
	var b bytes.Buffer
	if err := renderStatus(&b, OutputTable, fleet(), now); err != nil {
		t.Fatal(err)
	}
	want := `NODE    REPLICA         SYNC             LAST ACK  NACKS  HELD   DRAINING  CAPABILITIES
node-a  10.0.0.1:18000  IN SYNC          3.0s      0      -      1         rr,wrr,mh ipv6 iptables-nft kernel 6.12.0
node-b  10.0.0.2:18000  BEHIND 3 (42s)   90s       0      -      0         rr,wrr,mh ipv6 iptables-nft kernel 6.12.0
node-c  10.0.0.1:18000  NACKED 1         5m        7      -      0         rr,wrr,mh ipv6 iptables-nft kernel 6.12.0
node-d  10.0.0.2:18000  HOLDING REMOVAL  -         0      40/50  0         rr sctp
replica 10.0.0.3:18000 did not answer: its agents are missing above
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestStatusInSync(t *testing.T) {
	r := fleet()
	got := map[string]bool{}
	for _, n := range r.Nodes {
		got[n.Node] = n.InSync
	}
	want := map[string]bool{"node-a": true, "node-b": false, "node-c": false, "node-d": false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("in sync (-want +got):\n%s", diff)
	}
	if r.InSync() {
		t.Error("fleet with nodes behind reported in sync")
	}
	r.Nodes, r.UnreachableReplicas = r.Nodes[:1], nil
	if !r.InSync() {
		t.Error("node-a alone is in sync")
	}
	r.UnreachableReplicas = []string{"x"}
	if r.InSync() {
		t.Error("an unreachable replica hides agents: not in sync")
	}
}

func TestStatusJSONAndYAML(t *testing.T) {
	for _, format := range []string{OutputJSON, OutputYAML} {
		t.Run(format, func(t *testing.T) {
			var b bytes.Buffer
			if err := renderStatus(&b, format, fleet(), now); err != nil {
				t.Fatal(err)
			}
			raw := b.Bytes()
			if format == OutputYAML {
				var err error
				if raw, err = yaml.YAMLToJSON(raw); err != nil {
					t.Fatalf("not YAML: %v\n%s", err, b.String())
				}
			}
			var got StatusReport
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, b.String())
			}
			if diff := cmp.Diff(fleet(), got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			for _, field := range []string{"inSync", "pendingResources", "lagSeconds", "heldRemoval", "draining", "unreachableReplicas", "nacked"} {
				if !strings.Contains(b.String(), field) {
					t.Errorf("%s lacks %q:\n%s", format, field, b.String())
				}
			}
		})
	}
}

func webExplained(ack vsplanev1.AcknowledgementState) *vsplanev1.ExplainServiceResponse {
	return &vsplanev1.ExplainServiceResponse{
		NodeName: "node-a", Namespace: "default", Name: "web", Version: "0123456789abcdef", Acknowledgement: ack,
		AcknowledgedVersion: "0123456789abcdef", Replica: "10.0.0.1:18000",
		Service: &vsplanev1.ServiceState{Namespace: "default", Name: "web", SchedulerSource: "annotation scheduler.vsplane.io/name",
			VirtualServers: []*vsplanev1.VirtualServer{
				{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: "10.96.0.10", Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
					Scheduler: "wrr", PortName: "http", TrafficPolicy: vsplanev1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
					RealServers: []*vsplanev1.RealServer{
						{Address: "10.244.1.5", Port: 8080, Weight: 1, Local: true, Ready: true, Serving: true, Reason: "ready"},
						{Address: "10.244.2.7", Port: 8080, Weight: 1, Serving: true, Terminating: true, Reason: "terminating fallback"},
					}},
				{Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT, NodePortAddresses: true, Port: 30080, Protocol: vsplanev1.Protocol_PROTOCOL_TCP,
					TrafficPolicy: vsplanev1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, Reject: true},
			}},
		Problems: []string{"EndpointSlice default/web-abc: port p9 unnamed"},
	}
}

func TestExplainOneNode(t *testing.T) {
	st := &vsplanev1.AgentStatus{KernelErrors: []string{"ipset: busy"}, Draining: []*vsplanev1.DrainingRealServer{
		{VirtualServer: "tcp/10.96.0.10:80", Address: "10.244.3.3", Port: 8080, ActiveConnections: 4, InactiveConnections: 1},
		{VirtualServer: "tcp/192.168.1.10:30080", Address: "10.244.3.3", Port: 8080},
		{VirtualServer: "tcp/10.96.0.99:80", Address: "10.244.9.9", Port: 8080}, // another Service's
	}}
	e := newExplanation(webExplained(vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED), st)
	if !e.Acknowledged() {
		t.Error("ACKNOWLEDGED not acknowledged")
	}
	if got := len(e.Draining); got != 2 {
		t.Errorf("draining of this Service: got %d %v, want the ClusterIP's and the NodePort's", got, e.Draining)
	}
	var b bytes.Buffer
	if err := renderExplanations(&b, OutputTable, []Explanation{e}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Service default/web on node node-a",
		"Agent:            ACKNOWLEDGED (acknowledged 0123456789abcdef, replica 10.0.0.1:18000)",
		"Scheduler from:   annotation scheduler.vsplane.io/name",
		"tcp/10.96.0.10:80",
		"-> 10.244.1.5:8080",
		"local   ready",
		"terminating fallback",
		"tcp/<node addresses>:30080",
		"reject (no local endpoint)",
		"Draining in the kernel (reported by the agent):",
		"Kernel error on the node: ipset: busy",
		"Problem: EndpointSlice default/web-abc: port p9 unnamed",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("explain lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := renderExplanations(&b, OutputJSON, []Explanation{e}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["acknowledgement"] != "ACKNOWLEDGED" || got["service"] != "default/web" {
		t.Errorf("json: %s", b.String())
	}
	vss := got["desired"].(map[string]any)["virtualServers"].([]any)
	if len(vss) != 2 {
		t.Errorf("json desired state: %s", b.String())
	}
}

func TestExplainNodesTable(t *testing.T) {
	a := newExplanation(webExplained(vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED), nil)
	nr := webExplained(vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NACKED)
	nr.NodeName, nr.NackError, nr.AcknowledgedVersion = "node-b", "no such scheduler wrr", "fedcba987654"
	n := newExplanation(nr, nil)
	if n.Acknowledged() {
		t.Error("NACKED counted as acknowledged")
	}
	var b bytes.Buffer
	if err := renderExplanations(&b, OutputTable, []Explanation{a, n}); err != nil {
		t.Fatal(err)
	}
	want := `NODE    AGENT         DESIRED       ACKNOWLEDGED  VIRTUAL SERVERS  REAL SERVERS  DRAINING  NACK
node-a  ACKNOWLEDGED  0123456789ab  0123456789ab  2                2 (1 local)   0         -
node-b  NACKED        0123456789ab  fedcba987654  2                2 (1 local)   0         no such scheduler wrr
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func rollout(phase string, states ...vsplanev1.RolloutNodeState) *vsplanev1.GetRolloutResponse {
	r := &vsplanev1.GetRolloutResponse{Name: "to-mh", Scheduler: "mh", Phase: phase, CurrentStep: 1, StepNodes: []int32{1, 2},
		Services: []string{"default/web"}}
	for i, s := range states {
		r.Nodes = append(r.Nodes, &vsplanev1.RolloutNode{NodeName: string(rune('a'+i)) + "-node", State: s, Capable: i != 2})
	}
	return r
}

func TestRollout(t *testing.T) {
	const (
		up   = vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_UPDATED
		pend = vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_PENDING
		fail = vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_FAILED
	)
	r := rollout("Progressing", up, pend, fail)
	r.Nodes[2].Reason = "NACK: no mh"
	var b bytes.Buffer
	if err := renderRollout(&b, OutputTable, r); err != nil {
		t.Fatal(err)
	}
	want := `SchedulerRollout to-mh: scheduler mh, phase Progressing
Services: default/web
Step 2 of 2 begun (1:1 nodes, 2*:2 nodes); nodes: 1 updated, 1 pending, 1 failed, 0 not reached

NODE    STATE    CAPABLE  REASON
a-node  UPDATED  yes      -
b-node  PENDING  yes      -
c-node  FAILED   no       NACK: no mh
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		r    *vsplanev1.GetRolloutResponse
		done bool
	}{
		{r, false},
		{rollout("Succeeded", up, up), true},
		{rollout("Succeeded", up, pend), false},
		{rollout("RolledBack", up), false},
	} {
		if got := rolloutDone(tc.r); got != tc.done {
			t.Errorf("%s %v: done %v, want %v", tc.r.GetPhase(), tc.r.GetNodes(), got, tc.done)
		}
	}
	b.Reset()
	if err := renderRollout(&b, OutputYAML, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "phase: Progressing") || !strings.Contains(b.String(), "state: ROLLOUT_NODE_STATE_FAILED") {
		t.Errorf("yaml:\n%s", b.String())
	}
}

func TestSnapshot(t *testing.T) {
	r := &vsplanev1.GetNodeSnapshotResponse{NodeName: "node-a", SystemVersion: "77", Resources: []*vsplanev1.Resource{
		{Name: "node", Version: "aaaaaaaaaaaaaaaaaaaa", Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{}}},
		{Name: "svc/default/web", Version: "bbbb", Body: &vsplanev1.Resource_Service{Service: webExplained(0).GetService()}},
	}}
	var b bytes.Buffer
	if err := renderSnapshot(&b, OutputTable, r); err != nil {
		t.Fatal(err)
	}
	want := `Node node-a, system version 77, 2 resources

NAME             VERSION       KIND           VIRTUAL SERVERS  REAL SERVERS  PROBLEMS
node             aaaaaaaaaaaa  node settings  0                0             0
svc/default/web  bbbb          service        2                2             0
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, format := range []string{OutputJSON, OutputYAML} {
		b.Reset()
		if err := renderSnapshot(&b, format, r); err != nil {
			t.Fatal(err)
		}
		raw := b.Bytes()
		if format == OutputYAML {
			var err error
			if raw, err = yaml.YAMLToJSON(raw); err != nil {
				t.Fatal(err)
			}
		}
		var got struct {
			NodeName  string
			Resources []struct{ Name, Version string }
		}
		if err := json.Unmarshal(raw, &got); err != nil || got.NodeName != "node-a" || len(got.Resources) != 2 || got.Resources[1].Version != "bbbb" {
			t.Errorf("%s: %+v %v\n%s", format, got, err, b.String())
		}
	}
}
