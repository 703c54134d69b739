// Package guest is vmexec's server: it runs commands inside the VM test bed on
// behalf of the host (see package wire for the protocol). It runs on the host
// too, which is how its tests exercise it.
package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

const (
	defaultRunTimeout  = 60 * time.Second
	defaultKillTimeout = 5 * time.Second
	// waitDelay bounds how long Run waits for output pipes that a command's
	// leftover background children still hold open after it exited.
	waitDelay = time.Second
)

var (
	validName  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	validNetns = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// Server executes wire requests. Its zero value is not usable; use NewServer.
type Server struct {
	log    *zap.Logger
	logDir string
	env    []string

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	name, cmd, logPath string
	pid                int
	done               chan struct{} // closed when the process has exited
	exitCode           int           // valid once done is closed
}

// NewServer returns a server whose background processes log into logDir and
// whose commands run with env (nil: the server's own environment).
func NewServer(log *zap.Logger, logDir string, env []string) (*Server, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	if env == nil {
		env = os.Environ()
	}
	return &Server{log: log, logDir: logDir, env: env, procs: map[string]*proc{}}, nil
}

// Serve accepts connections until ctx ends or the listener fails.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go s.serveConn(ctx, conn)
	}
}

func (s *Server) serveConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	var req wire.Request
	// A request is small; a peer that never sends one must not pin a goroutine forever.
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := json.NewDecoder(conn).Decode(&req); err != nil {
		s.log.Warn("bad request", zap.Error(err))
		_ = json.NewEncoder(conn).Encode(wire.Response{Error: "bad request: " + err.Error()})
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	resp := s.Handle(ctx, req)
	if err := json.NewEncoder(conn).Encode(resp); err != nil {
		s.log.Warn("cannot send response", zap.String("op", string(req.Op)), zap.Error(err))
	}
}

// Handle executes one request. It never panics on bad input: problems are
// reported in Response.Error.
func (s *Server) Handle(ctx context.Context, req wire.Request) wire.Response {
	switch req.Op {
	case wire.OpPing:
		return wire.Response{}
	case wire.OpRun:
		return s.run(ctx, req)
	case wire.OpStart:
		return s.start(req)
	case wire.OpKill:
		return s.kill(req)
	case wire.OpWait:
		return s.wait(req)
	case wire.OpLog:
		return s.logOf(req)
	case wire.OpList:
		return s.list()
	default:
		return wire.Response{Error: fmt.Sprintf("unknown op %q", req.Op)}
	}
}

func (s *Server) command(ctx context.Context, req wire.Request) (*exec.Cmd, error) {
	var cmd *exec.Cmd
	switch {
	case req.Cmd != "" && len(req.Argv) > 0:
		return nil, errors.New("give cmd or argv, not both")
	case req.Cmd != "":
		cmd = exec.CommandContext(ctx, "/bin/sh", "-c", req.Cmd)
	case len(req.Argv) > 0:
		cmd = exec.CommandContext(ctx, req.Argv[0], req.Argv[1:]...)
	default:
		return nil, errors.New("empty command")
	}
	cmd.Env = s.env
	cmd.Dir = "/"
	// Own process group, so a timeout or kill reaches the command's children too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd, nil
}

func (s *Server) run(ctx context.Context, req wire.Request) wire.Response {
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultRunTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd, err := s.command(ctx, req)
	if err != nil {
		return wire.Response{Error: err.Error()}
	}
	var stdout, stderr limitedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = bytes.NewReader(req.Stdin)
	cmd.WaitDelay = waitDelay
	if err = startIn(cmd, req.Netns); err == nil {
		err = cmd.Wait()
	}
	resp := wire.Response{Stdout: stdout.buf.Bytes(), Stderr: stderr.buf.Bytes()}
	if ctx.Err() == context.DeadlineExceeded {
		resp.TimedOut = true
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		resp.ExitCode = exitCode(exitErr.ProcessState)
	case errors.Is(err, exec.ErrWaitDelay):
		// The command finished; only leftover children kept its output open.
		resp.ExitCode = exitCode(cmd.ProcessState)
	default:
		resp.Error = err.Error()
		resp.ExitCode = -1
	}
	return resp
}

// startIn starts cmd inside the named network namespace ("" = the server's).
// The fork happens on an OS thread moved into the namespace with setns; that
// thread is never unlocked, so the runtime discards it afterwards.
func startIn(cmd *exec.Cmd, netns string) error {
	if netns == "" {
		return cmd.Start()
	}
	if !validNetns.MatchString(netns) {
		return fmt.Errorf("invalid netns name %q", netns)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(filepath.Join("/run/netns", netns))
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", netns, err)
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", netns, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

func (s *Server) start(req wire.Request) wire.Response {
	if !validName.MatchString(req.Name) {
		return wire.Response{Error: fmt.Sprintf("invalid process name %q", req.Name)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.procs[req.Name]; ok && !p.exited() {
		return wire.Response{Error: fmt.Sprintf("process %q is still running (pid %d)", req.Name, p.pid)}
	}
	logPath := filepath.Join(s.logDir, req.Name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return wire.Response{Error: err.Error()}
	}
	defer logFile.Close() // the child holds its own descriptor
	// Background processes outlive the request: not bound to its context.
	cmd, err := s.command(context.Background(), req)
	if err != nil {
		return wire.Response{Error: err.Error()}
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := startIn(cmd, req.Netns); err != nil {
		return wire.Response{Error: err.Error()}
	}
	p := &proc{name: req.Name, cmd: req.Cmd, logPath: logPath, pid: cmd.Process.Pid, done: make(chan struct{})}
	if p.cmd == "" {
		p.cmd = fmt.Sprint(req.Argv)
	}
	s.procs[req.Name] = p
	go func() {
		_ = cmd.Wait()
		p.exitCode = exitCode(cmd.ProcessState)
		s.log.Info("background process exited", zap.String("name", p.name), zap.Int("exit", p.exitCode))
		close(p.done)
	}()
	s.log.Info("background process started", zap.String("name", p.name), zap.Int("pid", p.pid))
	return wire.Response{PID: p.pid, LogPath: logPath, Running: true}
}

func (s *Server) lookup(name string) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.procs[name]
	if !ok {
		return nil, fmt.Errorf("no process named %q", name)
	}
	return p, nil
}

func (s *Server) kill(req wire.Request) wire.Response {
	p, err := s.lookup(req.Name)
	if err != nil {
		return wire.Response{Error: err.Error()}
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultKillTimeout
	}
	if !p.exited() {
		_ = syscall.Kill(-p.pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(timeout):
			_ = syscall.Kill(-p.pid, syscall.SIGKILL)
			select {
			case <-p.done:
			case <-time.After(defaultKillTimeout):
				return wire.Response{Error: fmt.Sprintf("process %q (pid %d) survived SIGKILL", p.name, p.pid)}
			}
		}
	}
	return s.state(p, req.MaxBytes)
}

func (s *Server) wait(req wire.Request) wire.Response {
	p, err := s.lookup(req.Name)
	if err != nil {
		return wire.Response{Error: err.Error()}
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultRunTimeout
	}
	select {
	case <-p.done:
		return s.state(p, req.MaxBytes)
	case <-time.After(timeout):
		resp := s.state(p, req.MaxBytes)
		resp.TimedOut = true
		return resp
	}
}

func (s *Server) logOf(req wire.Request) wire.Response {
	p, err := s.lookup(req.Name)
	if err != nil {
		return wire.Response{Error: err.Error()}
	}
	return s.state(p, req.MaxBytes)
}

func (s *Server) state(p *proc, maxBytes int) wire.Response {
	resp := wire.Response{PID: p.pid, LogPath: p.logPath, Running: !p.exited()}
	if !resp.Running {
		resp.ExitCode = p.exitCode
	}
	data, err := readTail(p.logPath, maxBytes)
	if err != nil {
		resp.Error = err.Error()
	}
	resp.Log = data
	return resp
}

func (s *Server) list() wire.Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	var resp wire.Response
	for _, p := range s.procs {
		wp := wire.Proc{Name: p.name, PID: p.pid, Cmd: p.cmd, Running: !p.exited(), LogPath: p.logPath}
		if !wp.Running {
			wp.ExitCode = p.exitCode
		}
		resp.Procs = append(resp.Procs, wp)
	}
	sort.Slice(resp.Procs, func(i, j int) bool { return resp.Procs[i].Name < resp.Procs[j].Name })
	return resp
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitCode maps a finished process to a shell-style code (128+signal if killed).
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// readTail returns the last max bytes of a file (max <= 0 or too big: wire.MaxOutput).
func readTail(path string, max int) ([]byte, error) {
	if max <= 0 || max > wire.MaxOutput {
		max = wire.MaxOutput
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > int64(max) {
		if _, err := f.Seek(st.Size()-int64(max), io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, int64(max)))
}

// limitedBuffer keeps the first wire.MaxOutput bytes and notes what it dropped.
type limitedBuffer struct {
	buf     bytes.Buffer
	dropped bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	room := wire.MaxOutput - b.buf.Len()
	if len(p) > room {
		if room > 0 {
			b.buf.Write(p[:room])
		}
		if !b.dropped {
			b.dropped = true
			b.buf.WriteString("\n[output truncated]\n")
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}
