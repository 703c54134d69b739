// Package vm boots the real-kernel test bed: Debian's kernel under QEMU (TCG)
// with the project's initramfs, and drives it through vmexec. See README.md.
package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/e2e/measure"

	"github.com/vsplane/vsplane/e2e/freeport"
)

// Fixed addresses of the VM's user network (see DESIGN.md's address plan).
const (
	GuestIP     = "198.19.255.15" // the VM's eth0
	GatewayIP   = "198.19.255.2"  // QEMU's slirp host address, the VM's default route
	HostLoopIP  = "198.19.255.100"
	userNet     = "198.19.255.0/24"
	guestExecPt = 7000 // vmexec's port inside the VM
)

// Options configure Boot. The zero value boots a 1 GiB, 2-CPU VM.
type Options struct {
	// RepoRoot is the vsplane checkout (default: found above the working directory).
	RepoRoot string
	// CacheDir holds the kernel and base initramfs (default RepoRoot/.cache/vm).
	CacheDir string
	MemoryMB int // default 1024
	CPUs     int // default 2
	// GuestFwdPorts are host loopback TCP ports the guest reaches as
	// 198.19.255.100:PORT (one socat per connection, QEMU's guestfwd cmd: form).
	GuestFwdPorts []int
	// HostFwdPorts are guest TCP ports (on GuestIP, the root namespace) the
	// host reaches at HostFwdAddr(port), a free 127.0.0.1 port picked at boot.
	HostFwdPorts []int
	// GoPackages are extra packages (./path or import path) built with
	// CGO_ENABLED=0 into the guest's /usr/local/bin; vmexec and e2ehelper are
	// always included.
	GoPackages []string
	// Binaries are extra host files (static executables) put in /usr/local/bin.
	Binaries []string
	// Trees are host directories copied into the guest (e.g. an unpacked
	// container image to chroot into), appended to the initramfs.
	Trees []Tree
	// Disks are host files attached read-only as virtio disks, /dev/vda,
	// /dev/vdb, ... in order (e.g. an ext4 image of the real nodes'
	// binaries and container images, e2e/nodes).
	Disks []string
	// TmpfsRoot makes /init copy the initramfs into a tmpfs and switch_root
	// into it before anything starts: container runtimes pivot_root, which
	// the initramfs (rootfs) cannot be pivoted away from.
	TmpfsRoot bool
	// KernelArgs are appended to the kernel command line.
	KernelArgs []string
	// BootTimeout bounds the build plus the boot (default 3 minutes).
	BootTimeout time.Duration
	// KeepWorkDir keeps the work directory (console log, initramfs) after Stop.
	KeepWorkDir bool
	Log         *zap.Logger

	// hangFirstSettle makes the first boot's settle check hang, as in a
	// wedged guest (this package's test of the reboot).
	hangFirstSettle bool
}

// VM is a running test-bed VM. Its methods are safe for concurrent use.
type VM struct {
	opts     Options
	log      *zap.Logger
	workDir  string
	console  string
	qemuOut  string
	execAddr string         // host address of vmexec (hostfwd)
	hostFwd  map[int]string // guest port -> host address (Options.HostFwdPorts)

	cmd     *exec.Cmd
	exited  chan struct{} // closed when qemu has exited
	waitErr error

	// BuildTime is how long building the binaries and the initramfs took;
	// BootTime how long from starting QEMU until vmexec answered and the
	// settle check passed (the last boot's, see WedgedBoots).
	BuildTime, BootTime time.Duration
	// WedgedBoots counts guests that wedged right after boot and were
	// replaced (see settle).
	WedgedBoots int

	stopOnce sync.Once
}

// Boot builds what the guest needs, starts QEMU and waits until vmexec answers.
// A missing QEMU or kernel yields an error wrapping ErrDepsMissing.
func Boot(ctx context.Context, opts Options) (*VM, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.BootTimeout)
	defer cancel()
	if err := checkHostTools("qemu-system-x86_64"); err != nil {
		return nil, err
	}
	kernel, err := kernelImage(opts.CacheDir)
	if err != nil {
		return nil, err
	}
	fwd, err := guestFwdRules(opts.GuestFwdPorts)
	if err != nil {
		return nil, err
	}
	workDir, err := os.MkdirTemp("", "vsplane-vm-")
	if err != nil {
		return nil, err
	}
	v := &VM{opts: opts, log: opts.Log, workDir: workDir,
		console: filepath.Join(workDir, "console.log"), qemuOut: filepath.Join(workDir, "qemu.log")}
	if err := v.boot(ctx, kernel, fwd); err != nil {
		tail := v.ConsoleTail(40)
		v.Stop()
		return nil, fmt.Errorf("%w\n--- console tail ---\n%s", err, tail)
	}
	return v, nil
}

func (o *Options) defaults() error {
	if o.RepoRoot == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if o.RepoRoot, err = measure.RepoRoot(wd); err != nil {
			return err
		}
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(o.RepoRoot, ".cache", "vm")
	}
	for _, p := range o.HostFwdPorts {
		if p <= 0 || p > 65535 || p == guestExecPt {
			return fmt.Errorf("vm.Options.HostFwdPorts: %d is out of range or vmexec's", p)
		}
	}
	if o.MemoryMB < 0 || o.CPUs < 0 || o.BootTimeout < 0 {
		return fmt.Errorf("negative MemoryMB, CPUs or BootTimeout in vm.Options")
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 1024
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 3 * time.Minute
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	for _, d := range o.Disks {
		if st, err := os.Stat(d); err != nil {
			return fmt.Errorf("vm.Options.Disks: %w", err)
		} else if !st.Mode().IsRegular() {
			return fmt.Errorf("vm.Options.Disks: %s is not a regular file", d)
		}
		if strings.ContainsAny(d, ",") {
			return fmt.Errorf("vm.Options.Disks: %s: QEMU cannot take a comma in a path", d)
		}
	}
	return nil
}

func guestFwdRules(ports []int) (string, error) {
	var b strings.Builder
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || p > 65535 {
			return "", fmt.Errorf("guest forward port %d out of range", p)
		}
		if seen[p] {
			return "", fmt.Errorf("guest forward port %d given twice", p)
		}
		seen[p] = true
		fmt.Fprintf(&b, ",guestfwd=tcp:%s:%d-cmd:socat - TCP:127.0.0.1:%d", HostLoopIP, p, p)
	}
	return b.String(), nil
}

func (v *VM) boot(ctx context.Context, kernel, fwd string) error {
	start := time.Now()
	binDir := filepath.Join(v.workDir, "bin")
	pkgs := append([]string{"./e2e/cmd/vmexec", "./e2e/cmd/e2ehelper"}, v.opts.GoPackages...)
	bins, err := goBuild(ctx, v.opts.RepoRoot, binDir, pkgs)
	if err != nil {
		return err
	}
	bins = append(bins, v.opts.Binaries...)
	initrd := filepath.Join(v.workDir, "initramfs.img")
	if err := buildInitramfs(ctx, v.opts.RepoRoot, v.opts.CacheDir, initrd, bins); err != nil {
		return err
	}
	if err := appendTrees(initrd, v.opts.Trees); err != nil {
		return err
	}
	v.BuildTime = time.Since(start)

	// The hostfwd port is picked free here and may be taken before QEMU binds
	// it (other tests run alongside): retry with a new one.
	for attempt := 0; ; attempt++ {
		hostPort, err := freeport.One()
		if err != nil {
			return err
		}
		bootStart := time.Now()
		if err := v.startQEMU(kernel, initrd, hostPort, fwd); err != nil {
			return err
		}
		err = v.awaitExec(ctx)
		if err == nil {
			err = v.settle(ctx)
			if errors.Is(err, errGuestWedged) && v.WedgedBoots < maxWedgedBoots {
				v.WedgedBoots++
				v.log.Warn("guest wedged right after boot; booting it again",
					zap.Int("wedged", v.WedgedBoots), zap.Error(err), zap.String("console", v.ConsoleTail(12)))
				if kerr := v.restartAfterWedge(); kerr != nil {
					return fmt.Errorf("%w; and stopping it: %v", err, kerr)
				}
				continue
			}
			if err != nil {
				return err
			}
			v.BootTime = time.Since(bootStart)
			v.log.Info("VM up", zap.Duration("build", v.BuildTime), zap.Duration("boot", v.BootTime),
				zap.Int("wedged boots", v.WedgedBoots), zap.String("workdir", v.workDir))
			return nil
		}
		out, _ := os.ReadFile(v.qemuOut)
		if attempt < 3 && strings.Contains(string(out), "host forwarding rule") {
			v.log.Warn("hostfwd port taken, retrying", zap.Int("port", hostPort))
			continue
		}
		return fmt.Errorf("%w\n--- qemu output ---\n%s", err, out)
	}
}

func (v *VM) startQEMU(kernel, initrd string, hostPort int, fwd string) error {
	v.execAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(hostPort))
	v.hostFwd = map[int]string{}
	for _, gp := range v.opts.HostFwdPorts {
		hp, err := freeport.One()
		if err != nil {
			return err
		}
		v.hostFwd[gp] = net.JoinHostPort("127.0.0.1", strconv.Itoa(hp))
		fwd += fmt.Sprintf(",hostfwd=tcp:%s-%s:%d", v.hostFwd[gp], GuestIP, gp)
	}
	kargs := []string{
		"console=ttyS0", "panic=-1", "quiet", "cryptomgr.notests", "mitigations=off",
		"vsplane.vmexec_port=" + strconv.Itoa(guestExecPt),
	}
	if v.opts.TmpfsRoot {
		kargs = append(kargs, "vsplane.tmpfsroot=1")
	}
	args := []string{
		"-accel", tcgAccel(), // KVM hangs a standard kernel on this host
		"-m", strconv.Itoa(v.opts.MemoryMB), "-smp", strconv.Itoa(v.opts.CPUs),
		"-nodefaults", "-display", "none", "-no-reboot",
		"-serial", "file:" + v.console,
		"-kernel", kernel, "-initrd", initrd,
		"-append", strings.Join(append(kargs, v.opts.KernelArgs...), " "),
		"-nic", fmt.Sprintf("user,model=virtio-net-pci,restrict=on,net=%s,host=%s,hostfwd=tcp:%s-%s:%d%s",
			userNet, GatewayIP, v.execAddr, GuestIP, guestExecPt, fwd),
		// Entropy from the host (virtio_rng, loaded by /init): the guest's
		// CRNG is ready at boot, as on a cloud VM, instead of after ~4 s
		// of uptime, which held the first TLS handshake of an agent ~1 s.
		"-object", "rng-random,filename=/dev/urandom,id=rng0",
		"-device", "virtio-rng-pci,rng=rng0",
	}
	for _, d := range v.opts.Disks {
		args = append(args, "-drive", "file="+d+",format=raw,if=virtio,readonly=on,cache=unsafe")
	}
	out, err := os.Create(v.qemuOut)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = out, out
	// Never outlive the test process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	v.cmd = cmd
	v.exited = make(chan struct{})
	go func() {
		v.waitErr = cmd.Wait()
		close(v.exited)
	}()
	v.log.Debug("qemu started", zap.Int("pid", cmd.Process.Pid), zap.Strings("args", args))
	return nil
}

// awaitExec waits until vmexec answers, QEMU exits or ctx ends. It pings as
// soon as the console shows vmexec listening, and every 2 s regardless (in
// case the console says nothing), since a ping sent before the guest's
// network is up can sit in slirp's retransmission for seconds.
func (v *VM) awaitExec(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastPing time.Time
	var err error = errors.New("not tried yet")
	start, seen := time.Now(), false
	for {
		if !seen && v.consoleSays(readyMarker) {
			seen = true
			v.log.Info("console shows vmexec listening", zap.Duration("after", time.Since(start)),
				zap.String("guest", v.consoleLine(readyMarker)))
		}
		if seen || time.Since(lastPing) > 2*time.Second {
			lastPing = time.Now()
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = v.Ping(pctx)
			cancel()
			if err == nil {
				return nil
			}
		}
		select {
		case <-v.exited:
			return fmt.Errorf("qemu exited during boot: %v", v.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("VM did not come up (vmexec at %s: %v): %w", v.execAddr, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// maxWedgedBoots is how many guests wedged right after boot Boot replaces
// before it gives up.
const maxWedgedBoots = 2

// errGuestWedged marks a guest that stopped scheduling right after boot.
var errGuestWedged = errors.New("guest kernel wedged right after boot")

// settleTimeout bounds the settle check; a healthy guest on a loaded host
// answers it in a few seconds after settleUptime.
const settleTimeout = 45 * time.Second

// settleUptime is the guest uptime the settle check waits for.
const settleUptime = 15 * time.Second

// settle checks, once vmexec answers, that the guest schedules on every CPU
// and completes the cross-CPU work of creating a network namespace (RCU grace
// periods, code patched on every CPU). Twice a TCG guest booted beside other
// guests on a busy 2-core host wedged right after boot (CI runs of
// 2026-12-07): CPU 0 stuck in the idle task from ~4 s of uptime, CPU 1
// spinning in vmexec on a cross-CPU call to it, RCU stalls and soft lockups on
// the console; the test's first netns command never answered. Such a guest
// cannot be mended from inside, so Boot starts a new one (errGuestWedged).
//
// The check waits until settleUptime of the guest's uptime first: a guest
// wedged at ~8 s after passing the check at ~6 s (a burner run of
// 2026-12-07); the wedges seen began within 10 s of boot.
func (v *VM) settle(ctx context.Context) error {
	cmd := fmt.Sprintf(`set -e
while [ "$(cut -d. -f1 /proc/uptime)" -lt %d ]; do sleep 0.5; done
n=%d
c=0
while [ $c -lt $n ]; do taskset -c $c true; c=$((c+1)); done
/usr/sbin/ip netns add vsplane-settle
/usr/sbin/ip netns del vsplane-settle`, int(settleUptime.Seconds()), v.opts.CPUs)
	timeout := settleTimeout
	if v.opts.hangFirstSettle && v.WedgedBoots == 0 {
		cmd, timeout = "sleep 600", 3*time.Second // the unit test of a wedged guest
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := v.Run(sctx, cmd)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("settle check: %w", ctx.Err())
	case err != nil || r.TimedOut:
		select {
		case <-v.exited:
			return fmt.Errorf("settle check: %v%s", err, v.guestState())
		default:
		}
		if err == nil {
			err = errors.New("vmexec's own timeout ended it")
		}
		return fmt.Errorf("%w: settle check (a process on each of %d CPUs, a netns added and deleted) "+
			"did not finish within %v: %v", errGuestWedged, v.opts.CPUs, timeout, err)
	case r.ExitCode != 0:
		return fmt.Errorf("settle check failed: %w", r.Err())
	}
	return nil
}

// restartAfterWedge kills QEMU and keeps the wedged guest's console beside
// the next one's (console-wedged-N.log) for whoever reads the work directory.
func (v *VM) restartAfterWedge() error {
	if err := v.killQEMU(); err != nil {
		return err
	}
	return os.Rename(v.console, filepath.Join(v.workDir, fmt.Sprintf("console-wedged-%d.log", v.WedgedBoots)))
}

// TCGThreadEnv, set to "single", runs every vCPU of the VMs this process
// boots on one host thread (QEMU's -accel tcg,thread=single) instead of one
// thread each: a way to try whether a guest's wedge (see settle) is
// multi-threaded TCG's. Not the default: beside two CPU burners the VM
// tests' five-node flows test missed its 45 s settle windows with it.
const TCGThreadEnv = "VSPLANE_VM_TCG_THREAD"

// tcgAccel is QEMU's -accel value: TCG, multi-threaded unless TCGThreadEnv
// says single.
func tcgAccel() string {
	if os.Getenv(TCGThreadEnv) == "single" {
		return "tcg,thread=single"
	}
	return "tcg"
}

// readyMarker is what vmexec logs on the console once it listens.
const readyMarker = "vmexec serving"

// consoleLine returns the first console line containing marker.
func (v *VM) consoleLine(marker string) string {
	data, _ := os.ReadFile(v.console)
	for _, l := range strings.Split(string(data), "\n") {
		if i := strings.Index(l, marker); i >= 0 {
			return l[i:]
		}
	}
	return ""
}

func (v *VM) consoleSays(marker string) bool {
	data, err := os.ReadFile(v.console)
	return err == nil && strings.Contains(string(data), marker)
}

// HostFwdAddr is the host address (127.0.0.1:PORT) forwarded to guestPort
// in the VM's root namespace, one of Options.HostFwdPorts; "" for others.
func (v *VM) HostFwdAddr(guestPort int) string { return v.hostFwd[guestPort] }

// WorkDir holds the console log, QEMU's output and the initramfs.
func (v *VM) WorkDir() string { return v.workDir }

// ConsoleLog is the path of the guest's serial console log.
func (v *VM) ConsoleLog() string { return v.console }

// ConsoleTail returns the last n lines of the console log.
func (v *VM) ConsoleTail(n int) string {
	data, err := os.ReadFile(v.console)
	if err != nil {
		return fmt.Sprintf("(no console log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop kills QEMU and removes the work directory (unless KeepWorkDir).
// It is idempotent.
func (v *VM) Stop() {
	v.stopOnce.Do(func() {
		if v.cmd != nil && v.cmd.Process != nil {
			if err := v.killQEMU(); err != nil {
				v.log.Error("stopping the VM", zap.Error(err))
			}
		}
		if !v.opts.KeepWorkDir {
			_ = os.RemoveAll(v.workDir)
		}
	})
}

// killQEMU SIGKILLs QEMU and waits (10 s at most) until it has exited.
func (v *VM) killQEMU() error {
	_ = v.cmd.Process.Kill()
	select {
	case <-v.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("qemu (pid %d) did not exit after SIGKILL", v.cmd.Process.Pid)
	}
}

// ExecAddr is the host address of the guest's vmexec (for tools that drive
// a booted VM from outside the test process).
func (v *VM) ExecAddr() string { return v.execAddr }
