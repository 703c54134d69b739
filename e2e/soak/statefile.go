package soak

import (
	"fmt"
	"strings"
)

// The agent's state-file faults, as shell scripts both beds run where the
// agent's state directory is (the VM bed's guest; a real node's mount
// namespace, where it is the DaemonSet's hostPath). The agent must not be
// running, or be stopped, while they run: it would write the file again.

// StateFileName is the agent's state file in its --state-dir
// (dataplane/agent/state.go).
const StateFileName = "applied-state.pb"

// Log lines of the agent (dataplane/agent/state.go) that show a state
// fault reached it.
const (
	LogUnreadableState = "ignoring unreadable state file"
	LogStateSavedAgain = "applied state saved again"
)

// stateDiskSize is the tmpfs DiskFullScript puts under a state dir: room
// for a soak's state file (a few KiB to tens of KiB), then filled up.
const stateDiskSize = "1m"

// TearScript tears dir's state file as a crash in mid-write would: its
// first half, then garbage. It fails if there is no state file.
func TearScript(dir string) string {
	return fmt.Sprintf(`f=%s/%s; test -s $f; s=$(wc -c < $f); head -c $((s/2)) $f > $f.tmp && printf 'soak\377\377\377garbage' >> $f.tmp && mv $f.tmp $f`,
		dir, StateFileName)
}

// DiskFullScript leaves dir on a full filesystem with its files in place:
// the first time, a small tmpfs (named soak-state-TAG) is mounted on dir
// with the dir's files copied in, and stays for the rest of the soak; then
// a filler file takes every free block. It fails if a write still fits.
// FreeScript undoes the filling (not the mount).
func DiskFullScript(dir, tag string) string {
	return fmt.Sprintf(`set -e; d=%[1]s
if ! mountpoint -q $d; then
  t=$(mktemp -d); cp -a $d/. $t/; mount -t tmpfs -o size=%[2]s soak-state-%[3]s $d; cp -a $t/. $d/; rm -rf $t
fi
dd if=/dev/zero of=$d/filler bs=4k >/dev/null 2>&1 || true
if (echo probe > $d/probe) 2>/dev/null; then echo "$d is not full"; df -k $d; exit 1; fi
rm -f $d/probe`, dir, stateDiskSize, tag)
}

// FreeScript frees the space DiskFullScript took in dir.
func FreeScript(dir string) string { return "rm -f " + dir + "/filler" }

// SaveFailureMetric is the agent's counter of failed state-file saves.
const SaveFailureMetric = "vsplane_agent_state_save_failures_total"

// ParseSaveFailures reads SaveFailureMetric from a Prometheus text
// exposition (the agent's /metrics).
func ParseSaveFailures(text string) (int, error) {
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == SaveFailureMetric {
			var n float64
			if _, err := fmt.Sscanf(f[1], "%g", &n); err != nil {
				return 0, fmt.Errorf("%s %q: %w", SaveFailureMetric, f[1], err)
			}
			return int(n), nil
		}
	}
	return 0, fmt.Errorf("no %s in the agent's metrics", SaveFailureMetric)
}
