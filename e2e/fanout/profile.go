package fanout

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"syscall"
	"time"
)

// ProfileEnv names a directory: when set, the single-change and burst
// phases are profiled into it (off by default; a diagnosis aid, not part of
// the measurement). This process gets a runtime/pprof CPU profile
// (test-<phase>.pprof) and, with FANOUT_TRACE=1, an execution trace
// (test-<phase>.trace); the control plane, its own process without a
// profiling endpoint, is sampled by perf(1) if it is installed
// (cp-<phase>.perf.data; `perf report -i ... --no-children`). Profiling
// costs CPU on the shared cores: do not compare profiled runs' times with
// unprofiled ones.
const ProfileEnv = "FANOUT_PROFILE"

// profileHeaps, when ProfileEnv is set, fetches the control plane's heap
// profile (it runs with --profiling) every interval until the
// returned function is called, and once more then: cp-<phase>-heap-N.pb.gz,
// N counting up (`go tool pprof -sample_index=inuse_space` on the one
// taken nearest the peak RSS, which the log names with its RSS). Each
// fetch runs a GC first (?gc=1): without it inuse_space is the heap of the
// last GC, which at a few hundred MB of heap can be a whole phase old.
func (b *bench) profileHeaps(phase string, interval time.Duration) (stop func()) {
	dir := os.Getenv(ProfileEnv)
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Logf("profile %s: %v", phase, err)
		return func() {}
	}
	n := 0
	fetch := func() {
		out := filepath.Join(dir, fmt.Sprintf("cp-%s-heap-%02d.pb.gz", phase, n))
		n++
		st, _ := readProcStat(b.cp.Pid())
		if err := b.cp.fetch(b.ctx, "/debug/pprof/heap?gc=1", out); err != nil {
			b.t.Logf("heap profile: %v", err)
			return
		}
		b.t.Logf("heap profile %s (control plane RSS %s, peak %s)", out, human(st.RSSBytes), human(st.HWMBytes))
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				fetch()
				return
			case <-tick.C:
				fetch()
			}
		}
	}()
	return func() { close(done); <-finished }
}

// profilePhase starts profiling phase when ProfileEnv is set and returns
// the function that stops it (a no-op otherwise).
func (b *bench) profilePhase(phase string) (stop func()) {
	dir := os.Getenv(ProfileEnv)
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Logf("profile %s: %v", phase, err)
		return func() {}
	}
	var stops []func()
	if f, err := os.Create(filepath.Join(dir, "test-"+phase+".pprof")); err != nil {
		b.t.Logf("profile %s: %v", phase, err)
	} else if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.t.Logf("profile %s: %v", phase, err)
	} else {
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if os.Getenv("FANOUT_TRACE") == "1" {
		if f, err := os.Create(filepath.Join(dir, "test-"+phase+".trace")); err != nil {
			b.t.Logf("trace %s: %v", phase, err)
		} else if err := trace.Start(f); err != nil {
			f.Close()
			b.t.Logf("trace %s: %v", phase, err)
		} else {
			stops = append(stops, func() { trace.Stop(); f.Close() })
		}
	}
	if perf, err := exec.LookPath("perf"); err == nil {
		out := filepath.Join(dir, "cp-"+phase+".perf.data")
		cmd := exec.Command(perf, "record", "-q", "-F", "997", "-g", "-p", strconv.Itoa(b.cp.Pid()), "-o", out)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			b.t.Logf("perf %s: %v", phase, err)
		} else {
			time.Sleep(200 * time.Millisecond) // perf attaches
			stops = append(stops, func() {
				_ = cmd.Process.Signal(syscall.SIGINT)
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-done
				}
			})
		}
	}
	b.t.Logf("profiling %s into %s", phase, dir)
	return func() {
		for _, s := range stops {
			s()
		}
		fmt.Fprintf(os.Stderr, "profiled %s\n", phase)
	}
}
