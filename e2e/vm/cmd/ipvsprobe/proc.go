package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vsplane/vsplane/e2e/measure"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// procStats reports every process whose comm equals m[0] and whose command
// line contains each of m[1:], for some m in match.
func procStats(match [][]string) ([]wire.ProcStat, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	var out []wire.ProcStat
	for _, d := range dirs {
		comm, err := os.ReadFile(d + "/comm")
		if err != nil {
			continue // gone
		}
		raw, err := os.ReadFile(d + "/cmdline")
		if err != nil {
			continue
		}
		cmdline := strings.TrimSpace(string(bytes.ReplaceAll(raw, []byte{0}, []byte{' '})))
		if !matches(strings.TrimSpace(string(comm)), cmdline, match) {
			continue
		}
		ps, err := procStat(d)
		if err != nil {
			continue
		}
		ps.Cmdline = cmdline
		out = append(out, ps)
	}
	return out, nil
}

func matches(comm, cmdline string, match [][]string) bool {
	for _, m := range match {
		if len(m) == 0 || m[0] != comm {
			continue
		}
		ok := true
		for _, s := range m[1:] {
			ok = ok && strings.Contains(cmdline, s)
		}
		if ok {
			return true
		}
	}
	return false
}

// procStat reads the process of /proc/PID dir.
func procStat(dir string) (wire.ProcStat, error) {
	ps := wire.ProcStat{ClockTicks: measure.ClockTicks}
	var err error
	if ps.PID, err = strconv.Atoi(filepath.Base(dir)); err != nil {
		return ps, err
	}
	mem, err := measure.ReadStatus(ps.PID)
	if err != nil {
		return ps, err
	}
	ps.VmHWMKB, ps.VmRSSKB, ps.Threads = mem.VmHWMKB, mem.VmRSSKB, mem.Threads
	ps.RssAnonKB, ps.RssFileKB, ps.RssShmemKB = mem.RssAnonKB, mem.RssFileKB, mem.RssShmemKB
	st, err := measure.ReadStat(ps.PID)
	if err != nil {
		return ps, err
	}
	ps.UTime, ps.STime, ps.CUTime, ps.CSTime = st.UTime, st.STime, st.CUTime, st.CSTime
	return ps, nil
}

// forks is /proc/stat's "processes": forks (threads included) since boot.
func forks() (uint64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "processes "); ok {
			return strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
		}
	}
	return 0, fmt.Errorf("no processes line in /proc/stat")
}

// fetchIn GETs rawURL (http, an IP address) over a socket opened inside
// network namespace ns and returns the body's lines starting with one of
// prefixes (all lines if there are none).
func fetchIn(ns, rawURL string, prefixes []string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" {
		return "", fmt.Errorf("bad metrics URL %q", rawURL)
	}
	conn, err := dialIn(ns, u.Host)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", u.RequestURI(), u.Host)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s in %s: %s", rawURL, ns, resp.Status)
	}
	var b strings.Builder
	for _, l := range strings.Split(string(body), "\n") {
		keep := len(prefixes) == 0
		for _, p := range prefixes {
			keep = keep || strings.HasPrefix(l, p)
		}
		if keep {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

// dialIn opens a TCP connection from inside network namespace ns: the
// socket is created while this (locked) thread is in ns and keeps it.
func dialIn(ns, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	target, err := netns.GetFromPath("/run/netns/" + ns)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return nil, err
	}
	conn, dialErr := net.DialTimeout("tcp", addr, 10*time.Second)
	if err := netns.Set(orig); err != nil {
		// This thread is in the wrong namespace now; nothing later may run on it.
		panic(fmt.Sprintf("back to the root namespace: %v", err))
	}
	return conn, dialErr
}
