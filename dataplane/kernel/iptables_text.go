package kernel

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// RestoreOp is the kind of one iptables-restore line.
type RestoreOp int

const (
	OpDeclare     RestoreOp = iota // ":CHAIN POLICY [pkts:bytes]"
	OpAppend                       // "-A CHAIN spec"
	OpInsert                       // "-I CHAIN [num] spec"
	OpDelete                       // "-D CHAIN spec" or "-D CHAIN num"
	OpFlush                        // "-F [CHAIN]"
	OpNewChain                     // "-N CHAIN"
	OpDeleteChain                  // "-X [CHAIN]"
	OpPolicy                       // "-P CHAIN POLICY"
)

// RestoreLine is one parsed command line of a table block.
type RestoreLine struct {
	Op     RestoreOp
	Chain  string // empty for "-F"/"-X" without a chain
	Policy string // OpDeclare ("-" for user chains), OpPolicy
	Num    int    // OpInsert/OpDelete rule number (1-based), 0 if none
	Rule   string // the rule spec with single spaces, as written
	LineNo int
}

// RestoreTable is one "*table ... COMMIT" block.
type RestoreTable struct {
	Table Table
	Lines []RestoreLine
}

// ParseRestore splits an iptables-restore payload into table blocks. It
// checks structure (tables, COMMIT, known commands), not rule semantics.
func ParseRestore(payload []byte) ([]RestoreTable, error) {
	var out []RestoreTable
	var cur *RestoreTable
	sc := bufio.NewScanner(bytes.NewReader(payload))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("iptables payload line %d %q: %s: %w", n, line, why, ErrInvalid)
		}
		switch {
		case strings.HasPrefix(line, "*"):
			if cur != nil {
				return nil, bad("table not committed before next table")
			}
			t := Table(strings.TrimPrefix(line, "*"))
			if BuiltinChains(t) == nil {
				return nil, bad("unknown table")
			}
			cur = &RestoreTable{Table: t}
		case line == "COMMIT":
			if cur == nil {
				return nil, bad("COMMIT outside a table")
			}
			out = append(out, *cur)
			cur = nil
		case cur == nil:
			return nil, bad("command outside a table")
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) < 2 || !validChainName(f[0]) {
				return nil, bad("want ':CHAIN POLICY [pkts:bytes]'")
			}
			cur.Lines = append(cur.Lines, RestoreLine{Op: OpDeclare, Chain: f[0], Policy: f[1], LineNo: n})
		default:
			l, err := parseCommand(line)
			if err != nil {
				return nil, bad(err.Error())
			}
			l.LineNo = n
			cur.Lines = append(cur.Lines, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("iptables payload: %w", err)
	}
	if cur != nil {
		return nil, fmt.Errorf("iptables payload: table %s has no COMMIT: %w", cur.Table, ErrInvalid)
	}
	return out, nil
}

func parseCommand(line string) (RestoreLine, error) {
	raw, _, serr := splitRule(line)
	if serr != nil {
		return RestoreLine{}, serr
	}
	cmd, args := raw[0], raw[1:]
	var l RestoreLine
	chainArg := func(optional bool) error {
		if len(args) == 0 {
			if optional {
				return nil
			}
			return fmt.Errorf("%s needs a chain", cmd)
		}
		if !validChainName(args[0]) {
			return fmt.Errorf("bad chain name %q", args[0])
		}
		l.Chain, args = args[0], args[1:]
		return nil
	}
	var err error
	switch cmd {
	case "-A", "--append":
		l.Op = OpAppend
		if err = chainArg(false); err == nil && len(args) == 0 {
			err = fmt.Errorf("empty rule")
		}
	case "-I", "--insert":
		l.Op = OpInsert
		if err = chainArg(false); err == nil && len(args) > 0 {
			if num, e := strconv.Atoi(args[0]); e == nil {
				if num < 1 {
					err = fmt.Errorf("rule number must be >= 1")
				}
				l.Num, args = num, args[1:]
			}
		}
		if err == nil && len(args) == 0 {
			err = fmt.Errorf("empty rule")
		}
	case "-D", "--delete":
		l.Op = OpDelete
		if err = chainArg(false); err == nil && len(args) == 1 {
			if num, e := strconv.Atoi(args[0]); e == nil {
				if num < 1 {
					err = fmt.Errorf("rule number must be >= 1")
				}
				l.Num, args = num, nil
			}
		}
		if err == nil && l.Num == 0 && len(args) == 0 {
			err = fmt.Errorf("-D needs a rule or a number")
		}
	case "-F", "--flush":
		l.Op = OpFlush
		err = chainArg(true)
	case "-N", "--new-chain":
		l.Op = OpNewChain
		err = chainArg(false)
	case "-X", "--delete-chain":
		l.Op = OpDeleteChain
		err = chainArg(true)
	case "-P", "--policy":
		l.Op = OpPolicy
		if err = chainArg(false); err == nil {
			if len(args) != 1 {
				err = fmt.Errorf("-P needs one policy")
			} else {
				l.Policy, args = args[0], nil
			}
		}
	default:
		return l, fmt.Errorf("unsupported command %q", cmd)
	}
	if err != nil {
		return l, err
	}
	if (l.Op == OpFlush || l.Op == OpNewChain || l.Op == OpDeleteChain) && len(args) > 0 {
		return l, fmt.Errorf("unexpected arguments %q", strings.Join(args, " "))
	}
	l.Rule = strings.Join(args, " ")
	return l, nil
}

// RuleTokens splits a rule spec like iptables-restore does: on blanks, with
// double quotes grouping (quotes removed, \" and \\ unescaped).
func RuleTokens(rule string) ([]string, error) {
	_, vals, err := splitRule(rule)
	return vals, err
}

// splitRule returns each token both raw (quotes kept, for re-joining) and
// unquoted.
func splitRule(s string) (raw, vals []string, err error) {
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			return raw, vals, nil
		}
		start := i
		var val strings.Builder
		quoted := false
		for i < len(s) && (quoted || (s[i] != ' ' && s[i] != '\t')) {
			c := s[i]
			switch {
			case c == '"':
				quoted = !quoted
			case c == '\\' && quoted && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\'):
				i++
				val.WriteByte(s[i])
			default:
				val.WriteByte(c)
			}
			i++
		}
		if quoted {
			return nil, nil, fmt.Errorf("unterminated quote in %q", s)
		}
		raw = append(raw, s[start:i])
		vals = append(vals, val.String())
	}
}

// validChainName follows iptables: 1..28 bytes, no leading '-' or '!', no
// whitespace.
func validChainName(s string) bool {
	if s == "" || len(s) > 28 || s[0] == '-' || s[0] == '!' {
		return false
	}
	return !strings.ContainsAny(s, " \t")
}

// ChainDump is one chain as iptables-save shows it.
type ChainDump struct {
	Name   string
	Policy string // "ACCEPT"/"DROP" for built-in chains, "-" for user chains
	Rules  []string
}

// TableDump is one table of an iptables-save output.
type TableDump struct {
	Table  Table
	Chains []ChainDump
}

// Chain returns the named chain and whether it exists.
func (t TableDump) Chain(name string) (ChainDump, bool) {
	for _, c := range t.Chains {
		if c.Name == name {
			return c, true
		}
	}
	return ChainDump{}, false
}

// ParseSave parses iptables-save output (counters and comments ignored).
func ParseSave(save []byte) ([]TableDump, error) {
	tables, err := ParseRestore(save)
	if err != nil {
		return nil, err
	}
	out := make([]TableDump, 0, len(tables))
	for _, t := range tables {
		d := TableDump{Table: t.Table}
		idx := map[string]int{}
		for _, l := range t.Lines {
			switch l.Op {
			case OpDeclare:
				idx[l.Chain] = len(d.Chains)
				d.Chains = append(d.Chains, ChainDump{Name: l.Chain, Policy: l.Policy})
			case OpAppend:
				i, ok := idx[l.Chain]
				if !ok {
					return nil, fmt.Errorf("iptables-save line %d: rule for undeclared chain %s: %w", l.LineNo, l.Chain, ErrInvalid)
				}
				d.Chains[i].Rules = append(d.Chains[i].Rules, l.Rule)
			default:
				return nil, fmt.Errorf("iptables-save line %d: unexpected command: %w", l.LineNo, ErrInvalid)
			}
		}
		out = append(out, d)
	}
	return out, nil
}
