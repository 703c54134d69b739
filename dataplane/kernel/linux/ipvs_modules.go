package linux

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ipvsSchedulers are the schedulers Linux ships, each in module ip_vs_<name>.
var ipvsSchedulers = []string{"dh", "fo", "lblc", "lblcr", "lc", "mh", "nq", "ovf", "rr", "sed", "sh", "twos", "wlc", "wrr"}

// AvailableSchedulers lists (sorted) the IPVS schedulers whose module is
// loaded (procModules, default /proc/modules), built in
// (<modulesDir>/<release>/modules.builtin) or installed
// (<modulesDir>/<release>/**/ip_vs_<name>.ko*), modulesDir defaulting to
// /lib/modules. It fails only when none of these sources is readable.
func AvailableSchedulers(modulesDir, procModules string) ([]string, error) {
	if modulesDir == "" {
		modulesDir = "/lib/modules"
	}
	if procModules == "" {
		procModules = "/proc/modules"
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, fmt.Errorf("ipvs schedulers: uname: %w", err)
	}
	release := unix.ByteSliceToString(uts.Release[:])
	dir := filepath.Join(modulesDir, release)

	found := map[string]bool{}
	var readable int
	var errs []error
	add := func(module string) {
		module = strings.ReplaceAll(module, "-", "_")
		if name, ok := strings.CutPrefix(module, "ip_vs_"); ok && slices.Contains(ipvsSchedulers, name) {
			found[name] = true
		}
	}
	// Loaded: first field of each /proc/modules line.
	if b, err := os.ReadFile(procModules); err == nil {
		readable++
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 0 {
				add(f[0])
			}
		}
	} else {
		errs = append(errs, err)
	}
	// Built in and installed: module paths like kernel/net/netfilter/ipvs/ip_vs_rr.ko.xz.
	moduleName := func(p string) string {
		base := filepath.Base(p)
		if i := strings.Index(base, ".ko"); i >= 0 {
			return base[:i]
		}
		return ""
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		readable++
		for _, l := range strings.Split(string(b), "\n") {
			add(moduleName(strings.TrimSpace(l)))
		}
	} else {
		errs = append(errs, err)
	}
	walkErr := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasPrefix(d.Name(), "ip_vs_") {
			add(moduleName(p))
		}
		return nil
	})
	if walkErr == nil {
		readable++
	} else {
		errs = append(errs, walkErr)
	}
	if readable == 0 {
		return nil, fmt.Errorf("ipvs schedulers: no module information readable for kernel %s: %w", release, errors.Join(errs...))
	}
	out := make([]string, 0, len(found))
	for name := range found {
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}
