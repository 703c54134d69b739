// Package wire holds the formats shared by the host and the test bed's guest
// programs. Mostly the protocol between the host and vmexec, the command
// daemon inside the VM test bed: one JSON Request per TCP connection, answered
// by one JSON Response, then the connection closes. There is no auth: vmexec
// is only reachable through QEMU's hostfwd on the host's 127.0.0.1.
package wire

// Op names what a Request asks for.
type Op string

const (
	// OpPing answers with an empty Response once the daemon is up.
	OpPing Op = "ping"
	// OpRun runs Cmd (with /bin/sh -c) or Argv to completion, bounded by TimeoutMS,
	// and returns its exit code and output.
	OpRun Op = "run"
	// OpStart starts Cmd in the background as Name, output (stdout and stderr)
	// to a log file; it answers at once with the PID and the log path.
	OpStart Op = "start"
	// OpKill sends SIGTERM to Name's process group, waits up to TimeoutMS for it
	// to exit, then SIGKILL; answers with its exit code and log.
	OpKill Op = "kill"
	// OpWait waits up to TimeoutMS for Name to exit by itself; TimedOut if it did not.
	OpWait Op = "wait"
	// OpLog returns the log of Name (its last MaxBytes bytes when MaxBytes > 0).
	OpLog Op = "log"
	// OpList lists the background processes, running or exited.
	OpList Op = "list"
)

// Request is sent by the host.
type Request struct {
	Op   Op       `json:"op"`
	Cmd  string   `json:"cmd,omitempty"`
	Argv []string `json:"argv,omitempty"`
	// Netns runs the command (OpRun, OpStart) in the network namespace
	// /run/netns/<Netns> (entered with setns; mounts, /sys included, stay the
	// VM root's). Empty: the VM root namespace.
	Netns string `json:"netns,omitempty"`
	// Name identifies a background process (OpStart, OpKill, OpWait, OpLog).
	Name      string `json:"name,omitempty"`
	Stdin     []byte `json:"stdin,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	MaxBytes  int    `json:"max_bytes,omitempty"`
}

// Response is the guest's answer. Error is set when the request itself failed
// (bad request, cannot start); a command that ran and failed has an ExitCode.
type Response struct {
	Error    string `json:"error,omitempty"`
	ExitCode int    `json:"exit_code"`
	Stdout   []byte `json:"stdout,omitempty"`
	Stderr   []byte `json:"stderr,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Running is true for a background process that has not exited.
	Running bool   `json:"running,omitempty"`
	PID     int    `json:"pid,omitempty"`
	LogPath string `json:"log_path,omitempty"`
	// Log holds a background process's output (OpKill, OpWait, OpLog).
	Log   []byte `json:"log,omitempty"`
	Procs []Proc `json:"procs,omitempty"`
}

// Proc describes one background process.
type Proc struct {
	Name     string `json:"name"`
	PID      int    `json:"pid"`
	Cmd      string `json:"cmd"`
	Running  bool   `json:"running"`
	ExitCode int    `json:"exit_code"`
	LogPath  string `json:"log_path"`
}

// MaxOutput bounds the bytes of stdout, stderr or log carried in one Response.
const MaxOutput = 8 << 20

// SummaryPrefix starts the last line of e2ehelper request and hold output;
// a JSON Summary follows it.
const SummaryPrefix = "summary "

// Summary is what e2ehelper request/hold report: answers per backend name
// (the first word of each answer) and failed attempts.
type Summary struct {
	OK       int            `json:"ok"`
	Fail     int            `json:"fail"`
	Backends map[string]int `json:"backends"`
}
