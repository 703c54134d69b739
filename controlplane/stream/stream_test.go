package stream_test

import (
	"context"
	"net"
	"sort"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/vsplane/vsplane/controlplane/stream"
	"github.com/vsplane/vsplane/controlplane/stream/streamtest"
	"github.com/vsplane/vsplane/internal/grpcserver"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

const wait = 10 * time.Second

type env struct {
	t    *testing.T
	src  *streamtest.Source
	srv  *stream.Server
	conn *grpc.ClientConn
	acks chan stream.AckEvent
}

// newEnv serves a stream.Server over bufconn (realSocket=false) or a real
// 127.0.0.1 TCP socket (realSocket=true), through grpcserver.New.
func newEnv(t *testing.T, realSocket bool) *env {
	t.Helper()
	return newEnvOpts(t, realSocket, stream.Options{})
}

func newEnvOpts(t *testing.T, realSocket bool, opts stream.Options) *env {
	t.Helper()
	e := &env{t: t, src: streamtest.New(), acks: make(chan stream.AckEvent, 100)}
	var src stream.Source = e.src
	opts.Logger = zaptest.NewLogger(t)
	onAck := opts.Hooks.OnAck
	opts.Hooks.OnAck = func(ev stream.AckEvent) {
		if onAck != nil {
			onAck(ev)
		}
		e.acks <- ev
	}
	e.srv = stream.NewServer(src, opts)
	gs, err := grpcserver.New(grpcserver.Options{Logger: zaptest.NewLogger(t)}, func(r grpc.ServiceRegistrar) {
		vsplanev1.RegisterAgentServiceServer(r, e.srv)
	})
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	var dialOpts []grpc.DialOption
	target := "passthrough:///bufnet"
	if realSocket {
		lis, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		target = lis.Addr().String()
	} else {
		bl := bufconn.Listen(1 << 20)
		lis = bl
		dialOpts = append(dialOpts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return bl.DialContext(ctx)
		}))
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { e.srv.Shutdown(); gs.Stop(time.Second) })
	dialOpts = append(dialOpts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	e.conn, err = grpc.NewClient(target, dialOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.conn.Close() })
	return e
}

// agent is a raw protocol-level agent.
type agent struct {
	t      *testing.T
	cancel context.CancelFunc
	st     vsplanev1.AgentService_ConnectClient
	msgs   chan *vsplanev1.ConnectResponse
	errc   chan error
}

func (e *env) open() *agent { return e.openCtx(context.Background(), true) }

// openAs opens a stream whose (test) credentials name node.
func (e *env) openAs(node string) *agent {
	return e.openCtx(metadata.AppendToOutgoingContext(context.Background(), "x-test-node", node), true)
}

// openRaw opens a stream that never reads what the server sends.
func (e *env) openRaw() *agent { return e.openCtx(context.Background(), false) }

func (e *env) openCtx(ctx context.Context, read bool) *agent {
	e.t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	e.t.Cleanup(cancel)
	st, err := vsplanev1.NewAgentServiceClient(e.conn).Connect(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	a := &agent{t: e.t, cancel: cancel, st: st, msgs: make(chan *vsplanev1.ConnectResponse, 100), errc: make(chan error, 1)}
	if !read {
		return a
	}
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				a.errc <- err
				return
			}
			a.msgs <- m
		}
	}()
	return a
}

func (a *agent) send(m *vsplanev1.ConnectRequest) {
	a.t.Helper()
	if err := a.st.Send(m); err != nil {
		a.t.Fatalf("send: %v", err)
	}
}

func (a *agent) hello(node string, versions map[string]string) {
	a.t.Helper()
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Hello{Hello: &vsplanev1.Hello{
		NodeName: node, AgentVersion: "test", ResourceVersions: versions,
		Capabilities: &vsplanev1.Capabilities{IpvsSchedulers: []string{"rr"}},
	}}})
}

func (a *agent) ack(nonce string, errs ...*vsplanev1.ResourceError) {
	a.t.Helper()
	s := vsplanev1.AckStatus_ACK_STATUS_ACK
	if len(errs) > 0 {
		s = vsplanev1.AckStatus_ACK_STATUS_NACK
	}
	a.send(&vsplanev1.ConnectRequest{Message: &vsplanev1.ConnectRequest_Ack{Ack: &vsplanev1.Ack{
		Nonce: nonce, Status: s, Errors: errs,
	}}})
}

func (a *agent) delta() *vsplanev1.Delta {
	a.t.Helper()
	select {
	case m := <-a.msgs:
		return m.GetDelta()
	case err := <-a.errc:
		a.t.Fatalf("stream ended while waiting for a delta: %v", err)
	case <-time.After(wait):
		a.t.Fatal("timed out waiting for a delta")
	}
	return nil
}

// streamErr waits for the stream to end and returns its error.
func (a *agent) streamErr() error {
	a.t.Helper()
	select {
	case m := <-a.msgs:
		a.t.Fatalf("unexpected message %v while waiting for the stream to end", m)
	case err := <-a.errc:
		return err
	case <-time.After(wait):
		a.t.Fatal("timed out waiting for the stream to end")
	}
	return nil
}

// summary renders a delta as name@version lists for comparison.
func summary(d *vsplanev1.Delta) (up []string, removed []string) {
	for _, r := range d.GetResources() {
		up = append(up, r.GetName()+"@"+r.GetVersion())
	}
	removed = append(removed, d.GetRemoved()...)
	sort.Strings(removed)
	return up, removed
}

func expectDelta(t *testing.T, d *vsplanev1.Delta, wantUp, wantRemoved []string) {
	t.Helper()
	up, rm := summary(d)
	if !equal(up, wantUp) || !equal(rm, wantRemoved) {
		t.Fatalf("delta %s: got upserts %v removed %v; want upserts %v removed %v",
			d.GetNonce(), up, rm, wantUp, wantRemoved)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (e *env) waitAck(nonce string) stream.AckEvent {
	e.t.Helper()
	for {
		select {
		case ev := <-e.acks:
			if ev.Nonce == nonce {
				return ev
			}
		case <-time.After(wait):
			e.t.Fatalf("timed out waiting for ack %s to be processed", nonce)
		}
	}
}

func statusCode(t *testing.T, err error) codes.Code {
	t.Helper()
	s, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a gRPC status error: %v", err)
	}
	return s.Code()
}
