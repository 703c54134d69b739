package measure

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ClockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go supports.
const ClockTicks = 100

// Stat is what the e2e code reads of /proc/PID/stat: the command name, the
// parent, and the CPU times in clock ticks (ClockTicks a second). C* are the
// process's waited-for children's (iptables, ipset... it ran).
type Stat struct {
	Comm   string
	PPID   int
	UTime  uint64
	STime  uint64
	CUTime uint64
	CSTime uint64
}

// CPUSeconds is utime+stime in seconds.
func (s Stat) CPUSeconds() float64 { return float64(s.UTime+s.STime) / ClockTicks }

// ParseStat reads the contents of /proc/PID/stat. The command name may hold
// spaces and parentheses, so the fields are counted from the last ')'.
func ParseStat(b []byte) (Stat, error) {
	var st Stat
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return st, errors.New("bad /proc stat")
	}
	st.Comm = s[open+1 : closing]
	// f[0] is field 3 (state), ppid field 4, utime 14, stime 15, cutime 16,
	// cstime 17.
	f := strings.Fields(s[closing+1:])
	if len(f) < 15 {
		return st, errors.New("short /proc stat")
	}
	num := func(field int) uint64 { v, _ := strconv.ParseUint(f[field-3], 10, 64); return v }
	st.PPID, _ = strconv.Atoi(f[1])
	st.UTime, st.STime, st.CUTime, st.CSTime = num(14), num(15), num(16), num(17)
	return st, nil
}

// ReadStat reads and parses /proc/PID/stat; the zero Stat with the error
// if it cannot.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	st, err := ParseStat(b)
	if err != nil {
		return Stat{}, err
	}
	return st, nil
}

// Status is what the e2e code reads of /proc/PID/status: resident memory
// now (VmRSS) and at its peak (VmHWM), in KiB as the kernel writes them
// ("kB"), now's split into anonymous (heap, stacks), file-backed (the
// executable's and libraries' pages it touched) and shared-memory pages
// (the same, for an executable on tmpfs or an initramfs, as in the VM test
// bed), and the thread count.
type Status struct {
	VmRSSKB    int64
	VmHWMKB    int64
	RssAnonKB  int64
	RssFileKB  int64
	RssShmemKB int64
	Threads    int
}

// RSSBytes is VmRSS in bytes.
func (s Status) RSSBytes() int64 { return s.VmRSSKB << 10 }

// HWMBytes is VmHWM (peak RSS) in bytes.
func (s Status) HWMBytes() int64 { return s.VmHWMKB << 10 }

// ParseStatus reads the contents of /proc/PID/status; a field it lacks (a
// kernel thread has no VmRSS) stays zero.
func ParseStatus(b []byte) Status {
	var st Status
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			st.VmRSSKB = n
		case "VmHWM":
			st.VmHWMKB = n
		case "RssAnon":
			st.RssAnonKB = n
		case "RssFile":
			st.RssFileKB = n
		case "RssShmem":
			st.RssShmemKB = n
		case "Threads":
			st.Threads = int(n)
		}
	}
	return st
}

// ReadStatus reads and parses /proc/PID/status; the zero Status with the
// error if it cannot.
func ReadStatus(pid int) (Status, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Status{}, err
	}
	return ParseStatus(b), nil
}

// PIDs lists the processes in /proc, in its (lexical) order.
func PIDs() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// LoadAvg is /proc/loadavg's first three fields ("0.52 0.48 0.40"), or ""
// if it cannot be read.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return parseLoadAvg(b)
}

// LoadAvgLine is all of /proc/loadavg ("0.52 0.48 0.40 2/345 6789": the
// runnable and total tasks and the last PID too), or "unknown: " and the
// error. The VM benchmarks (e2e/vmbench) record this line; the others
// LoadAvg's three fields.
func LoadAvgLine() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown: " + err.Error()
	}
	return strings.TrimSpace(string(b))
}

func parseLoadAvg(b []byte) string {
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// SelfCPU is the user+system CPU time this process has used (getrusage: finer
// than /proc's clock ticks).
func SelfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
