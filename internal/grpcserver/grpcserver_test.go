package grpcserver_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/vsplane/vsplane/internal/grpcserver"
)

// panicService is a hand-written service whose methods panic.
var panicService = grpc.ServiceDesc{
	ServiceName: "test.Panic",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Boom",
		Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			req := new(emptypb.Empty)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(context.Context, any) (any, error) { panic("boom") }
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Panic/Boom"}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "BoomStream",
		ServerStreams: true,
		Handler:       func(any, grpc.ServerStream) error { panic("stream boom") },
	}},
}

func TestPanicsBecomeInternalAndAreLogged(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s, err := grpcserver.New(grpcserver.Options{Logger: zap.New(core), Registerer: prometheus.NewRegistry()},
		func(r grpc.ServiceRegistrar) { r.RegisterService(&panicService, struct{}{}) })
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	defer s.Stop(time.Second)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	err = conn.Invoke(ctx, "/test.Panic/Boom", &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.Internal {
		t.Fatalf("unary panic: %v, want Internal", err)
	}
	st, err := conn.NewStream(ctx, &panicService.Streams[0], "/test.Panic/BoomStream")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	if err := st.RecvMsg(&emptypb.Empty{}); status.Code(err) != codes.Internal {
		t.Fatalf("stream panic: %v, want Internal", err)
	}
	// The server survived and logged both panics with a stack.
	n := 0
	for _, e := range logs.FilterMessage("panic in gRPC handler").All() {
		if strings.Contains(e.ContextMap()["stack"].(string), "goroutine") {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("logged %d panics with stack, want 2", n)
	}
}

func TestMetricsRegisteredTwiceIsAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := grpcserver.New(grpcserver.Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := grpcserver.New(grpcserver.Options{Registerer: reg}); err == nil {
		t.Fatal("second registration on the same registry should fail")
	}
	if _, err := grpcserver.New(grpcserver.Options{}, nil); err == nil {
		t.Fatal("nil register func should fail")
	}
}

func TestCallsLoggedExceptHealthChecks(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s, err := grpcserver.New(grpcserver.Options{Logger: zap.New(core)},
		func(r grpc.ServiceRegistrar) { r.RegisterService(&panicService, struct{}{}) })
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	defer s.Stop(time.Second)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_ = conn.Invoke(ctx, "/test.Panic/Boom", &emptypb.Empty{}, &emptypb.Empty{})
	var methods []string
	for _, e := range logs.FilterMessage("finished call").All() {
		methods = append(methods, fmt.Sprint(e.ContextMap()["grpc.method"]))
	}
	if len(methods) != 1 || methods[0] != "Boom" {
		t.Fatalf("finished-call logs for methods %v, want only [Boom]", methods)
	}
	// One line per unary call: its end, with the code.
	if n := logs.FilterMessage("started call").Len(); n != 0 {
		t.Fatalf("%d started-call lines for a unary call, want 0", n)
	}
}
