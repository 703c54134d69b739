package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// IPTablesOptions configures NewIPTables.
type IPTablesOptions struct {
	// Backend forces legacy or nft; empty picks what the host uses (see
	// NewIPTables).
	Backend kernel.Backend
	// WaitSeconds is how long iptables-restore waits for the xtables lock
	// (legacy); 0 means 5.
	WaitSeconds int
	Logger      *zap.Logger
}

type iptCommands struct{ restore, save string }

// IPTables runs iptables-restore/-save of one backend.
type IPTables struct {
	info kernel.IPTablesInfo
	cmds map[kernel.Family]iptCommands
	wait int
	log  *zap.Logger
	// mu serializes restores from this process; the xtables lock only
	// guards legacy and a restore is one transaction anyway.
	mu sync.Mutex
}

var _ kernel.IPTables = (*IPTables)(nil)

// toolTimeout bounds detection commands.
const toolTimeout = 20 * time.Second

var versionRE = regexp.MustCompile(`v(\d+)\.(\d+)\.(\d+)`)

// NewIPTables finds the iptables tools and the backend to use. Without a
// forced backend it prefers the one already holding rules (the host's
// kubelet or CNI rules live there), and otherwise the backend `iptables`
// itself reports ("(nf_tables)" or "(legacy)").
func NewIPTables(ctx context.Context, opts IPTablesOptions) (*IPTables, error) {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	wait := opts.WaitSeconds
	if wait <= 0 {
		wait = 5
	}
	backend := opts.Backend
	var version string
	switch backend {
	case "":
		// The probes run at once: each is a process start, slow on a
		// small or emulated node (iptables-nft-save ~140 ms in the VM
		// test bed), and the agent waits for them before it connects.
		both := hasVariant(kernel.BackendNFT) && hasVariant(kernel.BackendLegacy)
		rules := map[kernel.Backend]<-chan ruleCount{}
		if both {
			for _, b := range []kernel.Backend{kernel.BackendNFT, kernel.BackendLegacy} {
				rules[b] = async(func() ruleCount {
					n, err := countRules(ctx, variant("iptables", b)+"-save")
					return ruleCount{n, err}
				})
			}
		}
		def, ver, err := toolVersion(ctx, "iptables")
		if both {
			nft, legacy := <-rules[kernel.BackendNFT], <-rules[kernel.BackendLegacy]
			if err == nil {
				nDef, nAlt := legacy, nft
				if def == kernel.BackendNFT {
					nDef, nAlt = nft, legacy
				}
				if alt := otherBackend(def); nDef.err == nil && nAlt.err == nil && nAlt.n > nDef.n {
					log.Info("iptables: using the backend that holds the host's rules",
						zap.String("backend", string(alt)), zap.Int("rules", nAlt.n), zap.String("default", string(def)), zap.Int("default_rules", nDef.n))
					def = alt
				}
			}
		}
		if err != nil {
			return nil, err
		}
		backend, version = def, ver
	case kernel.BackendLegacy, kernel.BackendNFT:
	default:
		return nil, fmt.Errorf("iptables: unknown backend %q: %w", backend, kernel.ErrInvalid)
	}
	families := []kernel.Family{kernel.FamilyIPv4, kernel.FamilyIPv6}
	names := map[kernel.Family]string{kernel.FamilyIPv4: "iptables", kernel.FamilyIPv6: "ip6tables"}
	checks := map[kernel.Family]<-chan toolCheck{}
	for _, fam := range families {
		name := names[fam]
		if hasVariant(backend) {
			name = variant(name, backend)
		}
		names[fam] = name
		checks[fam] = async(func() toolCheck {
			got, ver, err := toolVersion(ctx, name)
			return toolCheck{got, ver, err}
		})
	}
	cmds := map[kernel.Family]iptCommands{}
	var firstErr error
	for _, fam := range families {
		name, c := names[fam], <-checks[fam]
		switch {
		case firstErr != nil:
			continue // drain the other check
		case c.err != nil:
			firstErr = c.err
			continue
		case c.backend != backend:
			firstErr = fmt.Errorf("iptables: %s is %s, wanted %s: %w", name, c.backend, backend, kernel.ErrUnsupported)
			continue
		}
		if fam == kernel.FamilyIPv4 {
			version = c.version
		}
		cmds[fam] = iptCommands{restore: name + "-restore", save: name + "-save"}
		for _, tool := range []string{cmds[fam].restore, cmds[fam].save} {
			if _, err := exec.LookPath(tool); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("iptables: %s not found: %w", tool, kernel.ErrUnsupported)
			}
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	info := kernel.IPTablesInfo{Backend: backend, Version: version, RandomFully: versionAtLeast(version, 1, 6, 2)}
	log.Info("iptables ready", zap.String("backend", string(info.Backend)), zap.String("version", info.Version), zap.Bool("random_fully", info.RandomFully))
	return &IPTables{info: info, cmds: cmds, wait: wait, log: log}, nil
}

// ruleCount and toolCheck are the outcomes of detection probes run at once.
type ruleCount struct {
	n   int
	err error
}

type toolCheck struct {
	backend kernel.Backend
	version string
	err     error
}

// async runs f on its own goroutine; its result arrives on the channel
// (buffered: the goroutine never waits for a reader).
func async[T any](f func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return ch
}

func otherBackend(b kernel.Backend) kernel.Backend {
	if b == kernel.BackendNFT {
		return kernel.BackendLegacy
	}
	return kernel.BackendNFT
}

// variant names the backend-specific tool, e.g. iptables-nft.
func variant(base string, b kernel.Backend) string { return base + "-" + string(b) }

func hasVariant(b kernel.Backend) bool {
	_, err := exec.LookPath(variant("iptables", b))
	return err == nil
}

// toolVersion runs `name --version`: "iptables v1.8.9 (nf_tables)".
func toolVersion(ctx context.Context, name string) (kernel.Backend, string, error) {
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, "--version").CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("iptables: %s --version: %v: %s: %w", name, err, bytes.TrimSpace(out), kernel.ErrUnsupported)
	}
	s := string(out)
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return "", "", fmt.Errorf("iptables: cannot parse version from %q", s)
	}
	backend := kernel.BackendLegacy // before 1.8 there was only legacy and no suffix
	if strings.Contains(s, "nf_tables") {
		backend = kernel.BackendNFT
	}
	return backend, m[0][1:], nil
}

func versionAtLeast(v string, major, minor, patch int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) != 3 {
		return false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		n[i] = x
	}
	want := [3]int{major, minor, patch}
	for i := range n {
		if n[i] != want[i] {
			return n[i] > want[i]
		}
	}
	return true
}

// countRules counts the rules a save tool prints (all tables).
func countRules(ctx context.Context, save string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, save).Output()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range bytes.Split(out, []byte("\n")) {
		if bytes.HasPrefix(l, []byte("-A ")) {
			n++
		}
	}
	return n, nil
}

func (p *IPTables) Info() kernel.IPTablesInfo { return p.info }

func (p *IPTables) Restore(ctx context.Context, family kernel.Family, payload []byte) error {
	if err := kernel.ValidateIPTablesArgs(family, ""); err != nil {
		return err
	}
	// Structural problems get the same ErrInvalid as the memory kernel,
	// without running the tool.
	if _, err := kernel.ParseRestore(payload); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.CommandContext(ctx, p.cmds[family].restore, "--noflush", "-w", strconv.Itoa(p.wait))
	cmd.Stdin = bytes.NewReader(payload)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	p.log.Debug("iptables-restore", zap.String("cmd", cmd.Path), zap.Int("bytes", len(payload)),
		zap.Duration("took", time.Since(start)), zap.Error(err))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", p.cmds[family].restore, ctx.Err())
		}
		return fmt.Errorf("%s --noflush: %v: %s", p.cmds[family].restore, err, firstLines(out.String(), 4))
	}
	return nil
}

func (p *IPTables) Save(ctx context.Context, family kernel.Family, table kernel.Table) ([]byte, error) {
	if err := kernel.ValidateIPTablesArgs(family, table); err != nil {
		return nil, err
	}
	if table == "" {
		return nil, fmt.Errorf("iptables save: table required: %w", kernel.ErrInvalid)
	}
	cmd := exec.CommandContext(ctx, p.cmds[family].save, "-t", string(table))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ctx.Err() == nil {
			return nil, fmt.Errorf("%s -t %s: %v: %s", p.cmds[family].save, table, err, firstLines(stderr.String(), 4))
		}
		return nil, fmt.Errorf("%s -t %s: %w", p.cmds[family].save, table, err)
	}
	return out, nil
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, " | ")
}
