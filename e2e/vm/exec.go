package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// DefaultCmdTimeout bounds a guest command when ctx has no deadline.
const DefaultCmdTimeout = 60 * time.Second

// Result is a finished guest command.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
	TimedOut       bool
}

// Err is nil when the command exited 0, else an error quoting its output.
func (r Result) Err() error {
	if r.ExitCode == 0 && !r.TimedOut {
		return nil
	}
	what := fmt.Sprintf("exit code %d", r.ExitCode)
	if r.TimedOut {
		what = "timed out"
	}
	return fmt.Errorf("%s\nstdout: %s\nstderr: %s", what, clip(r.Stdout), clip(r.Stderr))
}

func clip(s string) string {
	const max = 4000
	s = strings.TrimSpace(s)
	if len(s) > max {
		return "..." + s[len(s)-max:]
	}
	return s
}

// call sends one request to vmexec. The connection deadline allows for the
// guest-side timeout plus slack for a slow (TCG, loaded host) guest.
func (v *VM) call(ctx context.Context, req wire.Request) (wire.Response, error) {
	var resp wire.Response
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", v.execAddr)
	if err != nil {
		return resp, fmt.Errorf("dial vmexec: %w%s", err, v.guestState())
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl.Add(5 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return resp, fmt.Errorf("send to vmexec: %w%s", err, v.guestState())
	}
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		if ctx.Err() != nil {
			return resp, fmt.Errorf("vmexec %s: %w", req.Op, ctx.Err())
		}
		return resp, fmt.Errorf("read from vmexec: %w%s", err, v.guestState())
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("vmexec %s: %s", req.Op, resp.Error)
	}
	return resp, nil
}

// guestState says, for a transport error, whether QEMU is still running and
// what the guest's console ended with: a guest kernel panic (QEMU runs with
// -no-reboot, so it exits), a crashed vmexec (respawned by init) and a guest
// that stopped answering look alike from the host socket alone.
func (v *VM) guestState() string {
	if v.exited == nil {
		return ""
	}
	state := "QEMU still running"
	select {
	case <-v.exited:
		state = fmt.Sprintf("QEMU has exited (%v)", v.waitErr)
	default:
	}
	tail := v.ConsoleTail(30)
	if strings.Contains(tail, "soft lockup") || strings.Contains(tail, "detected stalls") {
		state += " but its kernel reports stalls (soft lockup, RCU): a wedged TCG guest, not the command's doing"
	}
	return fmt.Sprintf("\n%s; guest console ends:\n%s", state, tail)
}

// guestTimeout is the time left in ctx (DefaultCmdTimeout without a deadline),
// less a margin so the guest answers before the host gives up.
func guestTimeout(ctx context.Context) int64 {
	dl, ok := ctx.Deadline()
	if !ok {
		return DefaultCmdTimeout.Milliseconds()
	}
	left := time.Until(dl) - time.Second
	if left < 100*time.Millisecond {
		left = 100 * time.Millisecond
	}
	return left.Milliseconds()
}

// Ping succeeds once vmexec answers.
func (v *VM) Ping(ctx context.Context) error {
	_, err := v.call(ctx, wire.Request{Op: wire.OpPing})
	return err
}

// Run runs cmd with /bin/sh -c (busybox ash: name iproute2 as /usr/sbin/ip)
// in the VM's root namespace, bounded by ctx (DefaultCmdTimeout without a
// deadline). The error is only about transport; check Result.Err() for the
// command's own failure.
func (v *VM) Run(ctx context.Context, cmd string) (Result, error) {
	return v.RunIn(ctx, "", cmd)
}

// RunIn is Run inside the network namespace /run/netns/<netns> ("" = root).
// The command enters it with setns only: it keeps the VM root's mounts, so
// /sys/class/net shows the root's devices (use "/usr/sbin/ip netns exec" in
// the root namespace where that matters).
func (v *VM) RunIn(ctx context.Context, netns, cmd string) (Result, error) {
	return v.RunInWithInput(ctx, netns, cmd, nil)
}

// RunInWithInput is RunIn with stdin (e.g. a file's content for "cat > F";
// wire.MaxOutput bounds it like the output).
func (v *VM) RunInWithInput(ctx context.Context, netns, cmd string, stdin []byte) (Result, error) {
	if len(stdin) > wire.MaxOutput {
		return Result{}, fmt.Errorf("stdin of %d bytes is over %d", len(stdin), wire.MaxOutput)
	}
	resp, err := v.call(ctx, wire.Request{Op: wire.OpRun, Cmd: cmd, Netns: netns, Stdin: stdin, TimeoutMS: guestTimeout(ctx)})
	if err != nil {
		return Result{}, err
	}
	return Result{Stdout: string(resp.Stdout), Stderr: string(resp.Stderr),
		ExitCode: resp.ExitCode, TimedOut: resp.TimedOut}, nil
}

// RunOK runs cmd and returns its stdout; any failure, the command's included,
// is an error that quotes the command and its output.
func (v *VM) RunOK(ctx context.Context, cmd string) (string, error) {
	return v.RunInOK(ctx, "", cmd)
}

// RunInOK is RunOK inside a network namespace (see RunIn).
func (v *VM) RunInOK(ctx context.Context, netns, cmd string) (string, error) {
	r, err := v.RunIn(ctx, netns, cmd)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		where := ""
		if netns != "" {
			where = " in netns " + netns
		}
		return r.Stdout, fmt.Errorf("guest command%s %q: %w", where, clip(cmd), err)
	}
	return r.Stdout, nil
}

// Proc is a background process in the VM started by Start.
type Proc struct {
	vm      *VM
	Name    string
	PID     int
	LogPath string // inside the guest
}

// ProcState is a background process's state and output so far.
type ProcState struct {
	Running  bool
	ExitCode int
	Log      string
	TimedOut bool // Wait: still running at the deadline
}

// Start runs cmd (with /bin/sh -c) in the background as name, its output
// going to a log file in the guest. Names are unique among running processes.
func (v *VM) Start(ctx context.Context, name, cmd string) (*Proc, error) {
	return v.StartIn(ctx, "", name, cmd)
}

// StartIn is Start inside a network namespace (see RunIn).
func (v *VM) StartIn(ctx context.Context, netns, name, cmd string) (*Proc, error) {
	resp, err := v.call(ctx, wire.Request{Op: wire.OpStart, Name: name, Cmd: cmd, Netns: netns})
	if err != nil {
		return nil, err
	}
	return &Proc{vm: v, Name: name, PID: resp.PID, LogPath: resp.LogPath}, nil
}

// Kill stops the named background process (SIGTERM to its process group, then
// SIGKILL after grace) and returns its final state.
func (v *VM) Kill(ctx context.Context, name string, grace time.Duration) (ProcState, error) {
	resp, err := v.call(ctx, wire.Request{Op: wire.OpKill, Name: name, TimeoutMS: grace.Milliseconds()})
	return procState(resp), err
}

// Kill stops the process; see VM.Kill.
func (p *Proc) Kill(ctx context.Context) (ProcState, error) {
	return p.vm.Kill(ctx, p.Name, 5*time.Second)
}

// Wait waits until the process exits or ctx ends; an unfinished process is
// reported with TimedOut and is not an error.
func (p *Proc) Wait(ctx context.Context) (ProcState, error) {
	resp, err := p.vm.call(ctx, wire.Request{Op: wire.OpWait, Name: p.Name, TimeoutMS: guestTimeout(ctx)})
	return procState(resp), err
}

// Log returns the process's output so far.
func (p *Proc) Log(ctx context.Context) (string, error) {
	resp, err := p.vm.call(ctx, wire.Request{Op: wire.OpLog, Name: p.Name})
	return string(resp.Log), err
}

// LogTail returns the last maxBytes bytes of the process's output (the
// first line may be cut): cheap enough to poll, no process is started.
func (p *Proc) LogTail(ctx context.Context, maxBytes int) (string, error) {
	resp, err := p.vm.call(ctx, wire.Request{Op: wire.OpLog, Name: p.Name, MaxBytes: maxBytes})
	return string(resp.Log), err
}

// AwaitLog waits (polling, bounded by ctx) until the process's log contains
// substr, returning the log. It fails early if the process exits first.
func (p *Proc) AwaitLog(ctx context.Context, substr string) (string, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := p.vm.call(ctx, wire.Request{Op: wire.OpLog, Name: p.Name})
		if err != nil {
			return string(resp.Log), err
		}
		if strings.Contains(string(resp.Log), substr) {
			return string(resp.Log), nil
		}
		if !resp.Running {
			return string(resp.Log), fmt.Errorf("process %s exited (code %d) before logging %q:\n%s",
				p.Name, resp.ExitCode, substr, clip(string(resp.Log)))
		}
		select {
		case <-ctx.Done():
			return string(resp.Log), fmt.Errorf("process %s never logged %q: %w\n%s",
				p.Name, substr, ctx.Err(), clip(string(resp.Log)))
		case <-tick.C:
		}
	}
}

func procState(resp wire.Response) ProcState {
	return ProcState{Running: resp.Running, ExitCode: resp.ExitCode, Log: string(resp.Log), TimedOut: resp.TimedOut}
}

// ParseSummary finds the summary line of e2ehelper request or hold output.
func ParseSummary(out string) (wire.Summary, error) {
	var sum wire.Summary
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(lines[i], wire.SummaryPrefix); ok {
			if err := json.Unmarshal([]byte(rest), &sum); err != nil {
				return sum, fmt.Errorf("bad summary line %q: %w", lines[i], err)
			}
			return sum, nil
		}
	}
	return sum, errors.New("no summary line in output:\n" + clip(out))
}
