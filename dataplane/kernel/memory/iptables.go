package memory

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// knownTargets are the extension targets the simulated iptables accepts in
// -j/-g besides user chains.
var knownTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "QUEUE": true, "REJECT": true,
	"MASQUERADE": true, "SNAT": true, "DNAT": true, "REDIRECT": true, "NETMAP": true,
	"MARK": true, "CONNMARK": true, "LOG": true, "NFLOG": true, "NFQUEUE": true,
	"NOTRACK": true, "CT": true, "TPROXY": true, "TCPMSS": true, "CHECKSUM": true,
	"TRACE": true, "CLASSIFY": true, "DSCP": true, "TOS": true, "SET": true,
}

type table struct {
	name   kernel.Table
	chains map[string]*chain
}

type chain struct {
	builtin bool
	policy  string // "-" for user chains
	rules   []string
}

func newTable(name kernel.Table) *table {
	t := &table{name: name, chains: map[string]*chain{}}
	for _, c := range kernel.BuiltinChains(name) {
		t.chains[c] = &chain{builtin: true, policy: "ACCEPT"}
	}
	return t
}

func (t *table) clone() *table {
	c := &table{name: t.name, chains: make(map[string]*chain, len(t.chains))}
	for name, ch := range t.chains {
		cp := *ch
		cp.rules = slices.Clone(ch.rules)
		c.chains[name] = &cp
	}
	return c
}

// IPTables is the kernel.IPTables view of a memory Kernel.
type IPTables Kernel

var _ kernel.IPTables = (*IPTables)(nil)

func (m *IPTables) k() *Kernel { return (*Kernel)(m) }

// SetIPTablesInfo sets what Info reports.
func (k *Kernel) SetIPTablesInfo(info kernel.IPTablesInfo) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.iptInfo = info
}

func (m *IPTables) Info() kernel.IPTablesInfo {
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.iptInfo
}

// table returns the current state of a table, creating it on first use.
func (k *Kernel) table(f kernel.Family, name kernel.Table) *table {
	if k.iptables[f] == nil {
		k.iptables[f] = map[kernel.Table]*table{}
	}
	t := k.iptables[f][name]
	if t == nil {
		t = newTable(name)
		k.iptables[f][name] = t
	}
	return t
}

// Restore applies payload like `iptables-restore --noflush`: each table
// block is applied to a copy and committed at COMMIT, so a failing block
// leaves its table unchanged while earlier blocks stay applied.
func (m *IPTables) Restore(ctx context.Context, family kernel.Family, payload []byte) error {
	if err := kernel.ValidateIPTablesArgs(family, ""); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	k := m.k()
	if err := k.begin("iptables.Restore"); err != nil {
		return err
	}
	defer k.mu.Unlock()
	blocks, err := kernel.ParseRestore(payload)
	if err != nil {
		return err
	}
	for _, b := range blocks {
		t := k.table(family, b.Table).clone()
		for _, l := range b.Lines {
			if err := k.applyLine(family, t, l); err != nil {
				return fmt.Errorf("iptables-restore (memory) table %s line %d: %w", b.Table, l.LineNo, err)
			}
		}
		k.iptables[family][b.Table] = t
	}
	return nil
}

func (k *Kernel) applyLine(family kernel.Family, t *table, l kernel.RestoreLine) error {
	ch := t.chains[l.Chain]
	needChain := func() error {
		if ch == nil {
			return fmt.Errorf("chain %s: no chain/target/match by that name: %w", l.Chain, kernel.ErrNotFound)
		}
		return nil
	}
	switch l.Op {
	case kernel.OpDeclare:
		if ch != nil && ch.builtin {
			// --noflush does not flush built-in chains; it sets the policy.
			return setPolicy(ch, l.Chain, l.Policy, true)
		}
		if l.Policy != "-" {
			return fmt.Errorf("chain %s: cannot set policy %q on a user chain: %w", l.Chain, l.Policy, kernel.ErrInvalid)
		}
		if ch != nil {
			ch.rules = nil
		} else {
			t.chains[l.Chain] = &chain{policy: "-"}
		}
	case kernel.OpAppend, kernel.OpInsert:
		if err := needChain(); err != nil {
			return err
		}
		if err := k.checkRule(family, t, l.Rule); err != nil {
			return err
		}
		if l.Op == kernel.OpAppend {
			ch.rules = append(ch.rules, l.Rule)
			return nil
		}
		pos := max(l.Num, 1) - 1
		if pos > len(ch.rules) {
			return fmt.Errorf("chain %s: index of insertion %d too big: %w", l.Chain, l.Num, kernel.ErrInvalid)
		}
		ch.rules = slices.Insert(ch.rules, pos, l.Rule)
	case kernel.OpDelete:
		if err := needChain(); err != nil {
			return err
		}
		pos := l.Num - 1
		if l.Num == 0 {
			pos = slices.Index(ch.rules, l.Rule)
		}
		if pos < 0 || pos >= len(ch.rules) {
			return fmt.Errorf("chain %s: no rule %q/#%d to delete: %w", l.Chain, l.Rule, l.Num, kernel.ErrNotFound)
		}
		ch.rules = slices.Delete(ch.rules, pos, pos+1)
	case kernel.OpFlush:
		if l.Chain == "" {
			for _, c := range t.chains {
				c.rules = nil
			}
			return nil
		}
		if err := needChain(); err != nil {
			return err
		}
		ch.rules = nil
	case kernel.OpNewChain:
		if ch != nil {
			return fmt.Errorf("chain %s: chain already exists: %w", l.Chain, kernel.ErrExist)
		}
		t.chains[l.Chain] = &chain{policy: "-"}
	case kernel.OpDeleteChain:
		names := []string{l.Chain}
		if l.Chain == "" {
			names = nil
			for name, c := range t.chains {
				if !c.builtin {
					names = append(names, name)
				}
			}
		} else if err := needChain(); err != nil {
			return err
		}
		for _, name := range names {
			c := t.chains[name]
			switch {
			case c.builtin:
				return fmt.Errorf("chain %s: cannot delete a built-in chain: %w", name, kernel.ErrInvalid)
			case len(c.rules) > 0:
				return fmt.Errorf("chain %s: not empty: %w", name, kernel.ErrBusy)
			case t.referenced(name):
				return fmt.Errorf("chain %s: still referenced: %w", name, kernel.ErrBusy)
			}
		}
		for _, name := range names {
			delete(t.chains, name)
		}
	case kernel.OpPolicy:
		if err := needChain(); err != nil {
			return err
		}
		return setPolicy(ch, l.Chain, l.Policy, false)
	default:
		return fmt.Errorf("unsupported command: %w", kernel.ErrInvalid)
	}
	return nil
}

func setPolicy(ch *chain, name, policy string, allowDash bool) error {
	switch {
	case !ch.builtin:
		return fmt.Errorf("chain %s: bad built-in chain name: %w", name, kernel.ErrInvalid)
	case policy == "-" && allowDash:
	case policy == "ACCEPT" || policy == "DROP":
		ch.policy = policy
	default:
		return fmt.Errorf("chain %s: bad policy %q: %w", name, policy, kernel.ErrInvalid)
	}
	return nil
}

// checkRule verifies what iptables resolves when it loads a rule: jump
// targets and ipsets.
func (k *Kernel) checkRule(family kernel.Family, t *table, rule string) error {
	toks, err := kernel.RuleTokens(rule)
	if err != nil {
		return fmt.Errorf("%v: %w", err, kernel.ErrInvalid)
	}
	for i := 0; i+1 < len(toks); i++ {
		arg := toks[i+1]
		switch toks[i] {
		case "-j", "--jump", "-g", "--goto":
			if t.name == kernel.TableNAT && arg == "DROP" {
				return fmt.Errorf("the nat table is not intended for filtering, DROP is inhibited: %w", kernel.ErrInvalid)
			}
			if t.chains[arg] == nil && !knownTargets[arg] {
				return fmt.Errorf("target %s: no chain/target/match by that name: %w", arg, kernel.ErrNotFound)
			}
		case "--match-set":
			s, ok := k.sets[arg]
			if !ok {
				return fmt.Errorf("set %s doesn't exist: %w", arg, kernel.ErrNotFound)
			}
			if s.hdr.Family != kernel.FamilyUnspecified && s.hdr.Family != family {
				return fmt.Errorf("set %s is %v, not usable from %v rules: %w", arg, s.hdr.Family, family, kernel.ErrInvalid)
			}
		}
	}
	return nil
}

// referenced reports whether any rule of t jumps or goes to chain.
func (t *table) referenced(name string) bool {
	for _, c := range t.chains {
		for _, r := range c.rules {
			toks, _ := kernel.RuleTokens(r)
			for i := 0; i+1 < len(toks); i++ {
				switch toks[i] {
				case "-j", "--jump", "-g", "--goto":
					if toks[i+1] == name {
						return true
					}
				}
			}
		}
	}
	return false
}

// setReferenced reports whether any iptables rule matches on ipset name.
func (k *Kernel) setReferenced(name string) bool {
	for _, tables := range k.iptables {
		for _, t := range tables {
			for _, c := range t.chains {
				for _, r := range c.rules {
					toks, _ := kernel.RuleTokens(r)
					for i := 0; i+1 < len(toks); i++ {
						if toks[i] == "--match-set" && toks[i+1] == name {
							return true
						}
					}
				}
			}
		}
	}
	return false
}

// Save renders a table like iptables-save: built-in chains in kernel
// order, then user chains sorted by name, counters zero.
func (m *IPTables) Save(ctx context.Context, family kernel.Family, name kernel.Table) ([]byte, error) {
	if err := kernel.ValidateIPTablesArgs(family, name); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, fmt.Errorf("iptables save: table required: %w", kernel.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	k := m.k()
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.table(family, name)
	order := kernel.BuiltinChains(name)
	var user []string
	for c, ch := range t.chains {
		if !ch.builtin {
			user = append(user, c)
		}
	}
	sort.Strings(user)
	order = append(slices.Clone(order), user...)
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Generated by vsplane memory kernel\n*%s\n", name)
	for _, c := range order {
		fmt.Fprintf(&b, ":%s %s [0:0]\n", c, t.chains[c].policy)
	}
	for _, c := range order {
		for _, r := range t.chains[c].rules {
			fmt.Fprintf(&b, "-A %s %s\n", c, r)
		}
	}
	b.WriteString("COMMIT\n# Completed\n")
	return b.Bytes(), nil
}
