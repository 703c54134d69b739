package inspect_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// storeEnv serves inspection over a real snapshot.Store holding nodes n1 and
// n2 (node settings only) and Service default/web on n1.
func storeEnv(t *testing.T) (*env, *snapshot.Store) {
	t.Helper()
	store := snapshot.NewStore()
	e := newEnvWith(t, store, store)
	var b snapshot.Batch
	for _, n := range []string{"n1", "n2"} {
		b.StageNode(n, time.Time{})
		b.PublishNode(n)
		ns, err := snapshot.NewNodeSettingsResource(&vsplanev1.NodeSettings{DefaultScheduler: "rr"})
		if err != nil {
			t.Fatal(err)
		}
		b.Set(n, ns, time.Time{})
	}
	b.Set("n1", webResource(t, "ready"), time.Time{})
	store.Commit(&b)
	return e, store
}

// webResource is Service default/web: a ClusterIP virtual server with one
// real server chosen for reason, and a rejecting Local-policy NodePort.
func webResource(t *testing.T, reason string) *vsplanev1.Resource {
	t.Helper()
	r, err := snapshot.NewServiceResource(&vsplanev1.ServiceState{
		Namespace: "default", Name: "web",
		VirtualServers: []*vsplanev1.VirtualServer{
			{
				Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: "198.18.0.10", Port: 80,
				Protocol: vsplanev1.Protocol_PROTOCOL_TCP, PortName: "http",
				RealServers: []*vsplanev1.RealServer{{Address: "198.19.1.5", Port: 8080, Weight: 1, Ready: true, Reason: reason}},
			},
			{
				Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_NODE_PORT, NodePortAddresses: true, Port: 30080,
				Protocol: vsplanev1.Protocol_PROTOCOL_TCP, PortName: "http",
				TrafficPolicy: vsplanev1.TrafficPolicy_TRAFFIC_POLICY_LOCAL, Reject: true,
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func setWeb(t *testing.T, store *snapshot.Store, reason string) *vsplanev1.Resource {
	t.Helper()
	var b snapshot.Batch
	r := webResource(t, reason)
	b.Set("n1", r, time.Time{})
	store.Commit(&b)
	return r
}

// fakeAgent is an agent stream driven by the test.
type fakeAgent struct {
	t  *testing.T
	st grpc.BidiStreamingClient[vsplanev1.ConnectRequest, vsplanev1.ConnectResponse]
}

func connectAgent(t *testing.T, e *env, node string) *fakeAgent {
	t.Helper()
	c, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := vsplanev1.NewAgentServiceClient(e.conn).Connect(c)
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{t: t, st: st}
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{NodeName: node, AgentVersion: "test"}}})
	return a
}

func (a *fakeAgent) send(m *vsplanev1.ConnectRequest) {
	a.t.Helper()
	if err := a.st.Send(m); err != nil {
		a.t.Fatal(err)
	}
}

func (a *fakeAgent) recv() *vsplanev1.Delta {
	a.t.Helper()
	m, err := a.st.Recv()
	if err != nil {
		a.t.Fatal(err)
	}
	return m.GetDelta()
}

func (a *fakeAgent) ack(d *vsplanev1.Delta, errs ...*vsplanev1.ResourceError) {
	a.t.Helper()
	st := vsplanev1.AckStatus_ACK_STATUS_ACK
	if len(errs) > 0 {
		st = vsplanev1.AckStatus_ACK_STATUS_NACK
	}
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Ack{Ack: &vsplanev1.Ack{
		Nonce: d.GetNonce(), Status: st, Errors: errs}}})
}

// await polls cond (every 5ms, at most 10s).
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code, mention string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(err.Error(), mention) {
		t.Fatalf("%s: %v, want %v mentioning %q", what, err, code, mention)
	}
}

func TestGetNodeStatus(t *testing.T) {
	e, _ := storeEnv(t)
	c := vsplanev1.NewInspectServiceClient(e.conn)

	_, err := c.GetNodeStatus(ctx(t), &vsplanev1.GetNodeStatusRequest{})
	wantCode(t, "empty node", err, codes.InvalidArgument, "node_name")
	_, err = c.GetNodeStatus(ctx(t), &vsplanev1.GetNodeStatusRequest{NodeName: strings.Repeat("x", 300)})
	wantCode(t, "overlong node", err, codes.InvalidArgument, "node_name")
	_, err = c.GetNodeStatus(ctx(t), &vsplanev1.GetNodeStatusRequest{NodeName: "nope"})
	wantCode(t, "unknown node", err, codes.NotFound, `"nope" is not known`)
	_, err = c.GetNodeStatus(ctx(t), &vsplanev1.GetNodeStatusRequest{NodeName: "n2"})
	wantCode(t, "known node without agent", err, codes.NotFound, `no agent for node "n2" is connected`)

	a := connectAgent(t, e, "n1")
	a.ack(a.recv())
	resp, err := c.GetNodeStatus(ctx(t), &vsplanev1.GetNodeStatusRequest{NodeName: "n1"})
	if err != nil || resp.GetAgent().GetNodeName() != "n1" || resp.GetStatus() != nil {
		t.Fatalf("before any report = %v, %v; want agent info and no status", resp, err)
	}

	since := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Status{Status: &vsplanev1.AgentStatus{
		LastFullReconcile: timestamppb.New(since), DriftRepaired: 2, KernelErrors: []string{"EBUSY"},
		Draining: []*vsplanev1.DrainingRealServer{{VirtualServer: "TCP/198.18.0.10:80", Address: "198.19.1.6", Port: 8080,
			Since: timestamppb.New(since), ActiveConnections: 1, InactiveConnections: 3}},
	}}})
	await(t, "reported status", func() bool {
		resp, err = c.GetNodeStatus(ctx(t), &vsplanev1.GetNodeStatusRequest{NodeName: "n1"})
		return err == nil && resp.GetStatus() != nil && resp.GetAgent().GetLastAck() != nil
	})
	st, ag := resp.GetStatus(), resp.GetAgent()
	if st.GetDriftRepaired() != 2 || len(st.GetKernelErrors()) != 1 || len(st.GetDraining()) != 1 ||
		st.GetDraining()[0].GetActiveConnections() != 1 || st.GetDraining()[0].GetInactiveConnections() != 3 ||
		!st.GetDraining()[0].GetSince().AsTime().Equal(since) {
		t.Fatalf("status = %v", st)
	}
	if ag.GetPendingResources() != 0 || len(ag.GetAcknowledgedVersions()) != 2 || ag.GetConnectedSince() == nil {
		t.Fatalf("agent = %v", ag)
	}
}

func TestExplainService(t *testing.T) {
	e, store := storeEnv(t)
	c := vsplanev1.NewInspectServiceClient(e.conn)
	web := model.ServiceKey{Namespace: "default", Name: "web"}
	e.problems[web] = []model.Problem{{Kind: "EndpointSlice", Object: "default/web-1", Reason: model.ReasonBadIP, Detail: "999.1.1.1", Dropped: true}}
	e.problems[model.ServiceKey{Namespace: "default", Name: "broken"}] = []model.Problem{{Kind: "Service", Object: "default/broken", Reason: model.ReasonNoPorts}}
	explain := func(node, ns, name string) (*vsplanev1.ExplainServiceResponse, error) {
		return c.ExplainService(ctx(t), &vsplanev1.ExplainServiceRequest{NodeName: node, Namespace: ns, Name: name})
	}

	for _, bad := range []struct{ node, ns, name, field string }{
		{"", "default", "web", "node_name"}, {"n1", "", "web", "namespace"}, {"n1", "default", " ", "name"},
		{"n1", "a/b", "web", "'/'"}, {"n1", "default", strings.Repeat("w", 254), "name"},
	} {
		_, err := explain(bad.node, bad.ns, bad.name)
		wantCode(t, "bad request "+bad.field, err, codes.InvalidArgument, bad.field)
	}
	_, err := explain("nope", "default", "web")
	wantCode(t, "unknown node", err, codes.NotFound, `node "nope"`)
	_, err = explain("n2", "default", "web")
	wantCode(t, "Service absent on node", err, codes.NotFound, `default/web gives node "n2" nothing`)
	_, err = explain("n1", "default", "broken")
	wantCode(t, "Service with problems only", err, codes.NotFound, "no_usable_ports")

	resp, err := explain("n1", "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	vss := resp.GetService().GetVirtualServers()
	if resp.GetAcknowledgement() != vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NOT_CONNECTED ||
		len(vss) != 2 || vss[0].GetRealServers()[0].GetReason() != "ready" || !vss[1].GetReject() ||
		resp.GetVersion() == "" || len(resp.GetProblems()) != 1 || !strings.Contains(resp.GetProblems()[0], "999.1.1.1") {
		t.Fatalf("explain before agent = %v", resp)
	}

	a := connectAgent(t, e, "n1")
	d := a.recv()
	// Sent, not answered.
	resp, err = explain("n1", "default", "web")
	if err != nil || resp.GetAcknowledgement() != vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_PENDING {
		t.Fatalf("explain in flight = %v, %v; want PENDING", resp, err)
	}
	v1 := resp.GetVersion()
	a.ack(d, &vsplanev1.ResourceError{Name: "service/default/web", Version: v1, Message: "ipvs: file exists"})
	await(t, "NACKED", func() bool {
		resp, err = explain("n1", "default", "web")
		return err == nil && resp.GetAcknowledgement() == vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NACKED
	})
	if resp.GetNackError() != "ipvs: file exists" || resp.GetAcknowledgedVersion() != "" {
		t.Fatalf("NACKed explain = %v", resp)
	}

	// A new version is sent; the agent applies it.
	setWeb(t, store, "terminating fallback")
	d = a.recv()
	a.ack(d)
	await(t, "ACKNOWLEDGED", func() bool {
		resp, err = explain("n1", "default", "web")
		return err == nil && resp.GetAcknowledgement() == vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED
	})
	if resp.GetVersion() == v1 || resp.GetAcknowledgedVersion() != resp.GetVersion() || resp.GetNackError() != "" ||
		resp.GetService().GetVirtualServers()[0].GetRealServers()[0].GetReason() != "terminating fallback" {
		t.Fatalf("ACKed explain = %v", resp)
	}
}

// watch opens WatchDeltas and waits until the server registered it.
func watch(t *testing.T, e *env, node string) grpc.ServerStreamingClient[vsplanev1.WatchDeltasResponse] {
	t.Helper()
	w, err := vsplanev1.NewInspectServiceClient(e.conn).WatchDeltas(ctx(t), &vsplanev1.WatchDeltasRequest{NodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestWatchDeltas(t *testing.T) {
	e, store := storeEnv(t)
	c := vsplanev1.NewInspectServiceClient(e.conn)
	for _, bad := range []struct {
		node string
		code codes.Code
	}{{"", codes.InvalidArgument}, {"nope", codes.NotFound}} {
		w, err := c.WatchDeltas(ctx(t), &vsplanev1.WatchDeltasRequest{NodeName: bad.node})
		if err == nil {
			_, err = w.Recv()
		}
		if status.Code(err) != bad.code {
			t.Fatalf("WatchDeltas(%q) = %v, want %v", bad.node, err, bad.code)
		}
	}

	fast := watch(t, e, "n1")
	slow := watch(t, e, "n1")
	if got := e.feed.Watchers("n1"); got != 2 {
		t.Fatalf("Watchers(n1) = %d, want 2", got)
	}
	a := connectAgent(t, e, "n1")
	d := a.recv()
	got, err := fast.Recv()
	if err != nil || got.GetDelta().GetNonce() != d.GetNonce() || got.GetNodeName() != "n1" ||
		got.GetSentAt() == nil || len(got.GetDelta().GetResources()) != 2 || got.GetDroppedBefore() != 0 {
		t.Fatalf("first watched delta = %v, %v; sent %v", got, err, d.GetNonce())
	}
	a.ack(d)

	// More Deltas while the second watcher does not read yet: the agent
	// stream is not held up, and the second watcher then gets all of them in
	// order (the gRPC transport buffers this little; the drop path under real
	// back-pressure is tested on the Feed itself).
	nonces := []string{d.GetNonce()}
	for i := range 3 {
		setWeb(t, store, "ready "+string(rune('a'+i)))
		d = a.recv()
		nonces = append(nonces, d.GetNonce())
		got, err := fast.Recv()
		if err != nil || got.GetDelta().GetNonce() != d.GetNonce() || got.GetDroppedBefore() != 0 {
			t.Fatalf("fast watcher, delta %d = %v, %v", i, got, err)
		}
		a.ack(d)
	}
	for i, want := range nonces {
		got, err := slow.Recv()
		if err != nil || got.GetDelta().GetNonce() != want || got.GetDroppedBefore() != 0 {
			t.Fatalf("second watcher, delta %d = %v, %v; want %s", i, got, err, want)
		}
	}
}

// TestInspectionChangesNothing calls every inspection RPC, good and bad, and
// checks the desired state and the agent's stream state are as before.
func TestInspectionChangesNothing(t *testing.T) {
	e, store := storeEnv(t)
	a := connectAgent(t, e, "n1")
	a.ack(a.recv())
	await(t, "ack recorded", func() bool {
		info, ok := e.srv.Registry().Agent("n1")
		return ok && info.GetLastAck() != nil
	})
	snap := func() string {
		var b strings.Builder
		for _, n := range store.Nodes() {
			res, sv, _ := store.List(n)
			b.WriteString(n + "@" + sv + ";")
			for _, e := range res {
				b.WriteString(e.Resource.GetName() + "@" + e.Resource.GetVersion() + ",")
			}
		}
		info, _ := e.srv.Registry().Agent("n1")
		info.LastAck, info.ConnectedSince = nil, nil // compared separately below
		b.WriteString(info.String())
		return b.String()
	}
	before := snap()
	infoBefore, _ := e.srv.Registry().Agent("n1")

	c := vsplanev1.NewInspectServiceClient(e.conn)
	for _, node := range []string{"n1", "n2", "nope", ""} {
		_, _ = c.ListAgents(ctx(t), &vsplanev1.ListAgentsRequest{})
		_, _ = c.GetNodeSnapshot(ctx(t), &vsplanev1.GetNodeSnapshotRequest{NodeName: node})
		_, _ = c.GetNodeStatus(ctx(t), &vsplanev1.GetNodeStatusRequest{NodeName: node})
		for _, name := range []string{"web", "nope", ""} {
			_, _ = c.ExplainService(ctx(t), &vsplanev1.ExplainServiceRequest{NodeName: node, Namespace: "default", Name: name})
		}
		wctx, cancel := context.WithCancel(ctx(t))
		if w, err := c.WatchDeltas(wctx, &vsplanev1.WatchDeltasRequest{NodeName: node}); err == nil {
			_, _ = w.Header()
		}
		cancel()
	}
	await(t, "watches ended", func() bool { return e.feed.Watchers("n1") == 0 })
	if after := snap(); after != before {
		t.Fatalf("state changed by inspection:\nbefore %s\nafter  %s", before, after)
	}
	infoAfter, _ := e.srv.Registry().Agent("n1")
	if !infoAfter.GetLastAck().AsTime().Equal(infoBefore.GetLastAck().AsTime()) {
		t.Fatal("last ack changed by inspection")
	}
}

func TestWatchDeltasEndsOnFeedClose(t *testing.T) {
	e, _ := storeEnv(t)
	w := watch(t, e, "n1")
	e.feed.Close()
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("watch after Close = %v, want Unavailable", err)
	}
	w2, err := vsplanev1.NewInspectServiceClient(e.conn).WatchDeltas(ctx(t), &vsplanev1.WatchDeltasRequest{NodeName: "n1"})
	if err == nil {
		_, err = w2.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("new watch after Close = %v, want Unavailable", err)
	}
	e.feed.Close() // idempotent
}
