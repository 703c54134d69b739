package guest

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

func newServer(t *testing.T) *Server {
	t.Helper()
	s, err := NewServer(zaptest.NewLogger(t), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRun(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	tests := []struct {
		name       string
		req        wire.Request
		wantOut    string
		wantErrOut string
		wantCode   int
		wantError  string
	}{
		{name: "shell", req: wire.Request{Op: wire.OpRun, Cmd: "echo hi; echo oops >&2; exit 3"},
			wantOut: "hi\n", wantErrOut: "oops\n", wantCode: 3},
		{name: "argv", req: wire.Request{Op: wire.OpRun, Argv: []string{"printf", "%s", "a b"}}, wantOut: "a b"},
		{name: "stdin", req: wire.Request{Op: wire.OpRun, Cmd: "cat", Stdin: []byte("in")}, wantOut: "in"},
		{name: "signal", req: wire.Request{Op: wire.OpRun, Cmd: "kill -9 $$"}, wantCode: 137},
		{name: "empty", req: wire.Request{Op: wire.OpRun}, wantError: "empty command"},
		{name: "both", req: wire.Request{Op: wire.OpRun, Cmd: "true", Argv: []string{"true"}}, wantError: "not both"},
		{name: "missing program", req: wire.Request{Op: wire.OpRun, Argv: []string{"/nonexistent"}}, wantError: "no such file"},
		{name: "bad netns", req: wire.Request{Op: wire.OpRun, Cmd: "true", Netns: "../x"}, wantError: "invalid netns"},
		{name: "absent netns", req: wire.Request{Op: wire.OpRun, Cmd: "true", Netns: "vsplane-absent"}, wantError: "netns vsplane-absent"},
		{name: "unknown op", req: wire.Request{Op: "frob"}, wantError: "unknown op"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := s.Handle(ctx, tc.req)
			if tc.wantError != "" {
				if !strings.Contains(r.Error, tc.wantError) {
					t.Fatalf("error %q, want it to contain %q", r.Error, tc.wantError)
				}
				return
			}
			if r.Error != "" {
				t.Fatalf("unexpected error %q", r.Error)
			}
			if string(r.Stdout) != tc.wantOut || string(r.Stderr) != tc.wantErrOut || r.ExitCode != tc.wantCode {
				t.Errorf("got out=%q err=%q code=%d, want out=%q err=%q code=%d",
					r.Stdout, r.Stderr, r.ExitCode, tc.wantOut, tc.wantErrOut, tc.wantCode)
			}
		})
	}
}

func TestRunTimeoutKillsChildren(t *testing.T) {
	s := newServer(t)
	start := time.Now()
	// The child sleep keeps stdout open; the group kill and WaitDelay end it.
	r := s.Handle(context.Background(), wire.Request{Op: wire.OpRun, Cmd: "sleep 30 & sleep 30", TimeoutMS: 300})
	if !r.TimedOut {
		t.Fatalf("want TimedOut, got %+v", r)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("timed-out command took %v to return", d)
	}
}

func TestBackground(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	r := s.Handle(ctx, wire.Request{Op: wire.OpStart, Name: "srv", Cmd: "echo started; exec sleep 30"})
	if r.Error != "" || r.PID == 0 || !r.Running {
		t.Fatalf("start: %+v", r)
	}
	if r := s.Handle(ctx, wire.Request{Op: wire.OpStart, Name: "srv", Cmd: "true"}); !strings.Contains(r.Error, "still running") {
		t.Errorf("second start with the same name: %+v", r)
	}
	if r := s.Handle(ctx, wire.Request{Op: wire.OpStart, Name: "a/b", Cmd: "true"}); !strings.Contains(r.Error, "invalid process name") {
		t.Errorf("bad name: %+v", r)
	}
	// Wait with a short timeout: still running.
	if r := s.Handle(ctx, wire.Request{Op: wire.OpWait, Name: "srv", TimeoutMS: 100}); !r.TimedOut || !r.Running {
		t.Errorf("wait on a running process: %+v", r)
	}
	r = s.Handle(ctx, wire.Request{Op: wire.OpKill, Name: "srv"})
	if r.Error != "" || r.Running || r.ExitCode != 128+15 || string(r.Log) != "started\n" {
		t.Errorf("kill: %+v (log %q)", r, r.Log)
	}
	l := s.Handle(ctx, wire.Request{Op: wire.OpList})
	if len(l.Procs) != 1 || l.Procs[0].Name != "srv" || l.Procs[0].Running {
		t.Errorf("list: %+v", l.Procs)
	}
	// The name is free again once the process has exited.
	r = s.Handle(ctx, wire.Request{Op: wire.OpStart, Name: "srv", Cmd: "echo again; exit 4"})
	if r.Error != "" {
		t.Fatalf("restart: %+v", r)
	}
	r = s.Handle(ctx, wire.Request{Op: wire.OpWait, Name: "srv", TimeoutMS: 10000})
	if r.Running || r.ExitCode != 4 || string(r.Log) != "again\n" {
		t.Errorf("wait: %+v (log %q)", r, r.Log)
	}
	if r := s.Handle(ctx, wire.Request{Op: wire.OpLog, Name: "nope"}); !strings.Contains(r.Error, "no process") {
		t.Errorf("log of unknown process: %+v", r)
	}
}

func TestServeConn(t *testing.T) {
	s := newServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Serve(ctx, ln) }()

	call := func(payload string) wire.Response {
		t.Helper()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte(payload)); err != nil {
			t.Fatal(err)
		}
		var r wire.Response
		if err := json.NewDecoder(conn).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := call(`{"op":"run","cmd":"echo ok"}`); string(r.Stdout) != "ok\n" {
		t.Errorf("run over TCP: %+v", r)
	}
	if r := call("not json\n"); !strings.Contains(r.Error, "bad request") {
		t.Errorf("garbage: %+v", r)
	}
}
