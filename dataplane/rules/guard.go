package rules

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// fixedJumps are the only rules a payload may put into built-in chains.
var fixedJumps = func() []Jump {
	b := &builder{}
	b.jumpRules()
	return b.jumps
}()

// standardTargets are the targets our rules may use besides our chains.
var standardTargets = []string{"ACCEPT", "DROP", "RETURN", "REJECT", "MASQUERADE", "MARK"}

// CheckPayload is the last check before iptables-restore: it proves that a
// payload touches only vsplane's (kube-proxy's) own chains. Every line must
// be one of
//
//	*filter | *nat | COMMIT
//	:CHAIN - [0:0]      CHAIN one of the chains this package renders in that table
//	-A CHAIN rule       the same chains; the rule's -j target is one of them or
//	                    ACCEPT, DROP, RETURN, REJECT, MASQUERADE, MARK (no -g)
//	-I BUILTIN 1 rule   exactly one of the fixed jumps (Ruleset.Jumps)
//	-X CHAIN            an optional chain of ours (optionalChains)
//
// and the payload holds no control characters other than newlines. Anything
// else (another table or chain, a flush, delete, policy or rule number, an
// extra line smuggled in by a string) is ErrInvalid. Payload output always
// passes; the check guards against a renderer bug letting wire data through.
func CheckPayload(payload []byte) error {
	for i, c := range payload {
		if (c < 0x20 && c != '\n') || c == 0x7f {
			return fmt.Errorf("rules: payload byte %d is control character %#x: %w", i, c, kernel.ErrInvalid)
		}
	}
	tables, err := kernel.ParseRestore(payload)
	if err != nil {
		return err
	}
	for _, t := range tables {
		ours := ourChains(t.Table)
		if ours == nil {
			return fmt.Errorf("rules: payload writes table %s: %w", t.Table, kernel.ErrInvalid)
		}
		for _, l := range t.Lines {
			bad := func(why string) error {
				return fmt.Errorf("rules: payload line %d (table %s, chain %s): %s: %w", l.LineNo, t.Table, l.Chain, why, kernel.ErrInvalid)
			}
			switch l.Op {
			case kernel.OpDeclare:
				if !slices.Contains(ours, l.Chain) || l.Policy != "-" {
					return bad("declares a chain that is not ours")
				}
			case kernel.OpAppend:
				if !slices.Contains(ours, l.Chain) {
					return bad("appends to a chain that is not ours")
				}
				if err := checkTarget(l.Rule, ours); err != nil {
					return bad(err.Error())
				}
			case kernel.OpDeleteChain:
				if !slices.Contains(optionalChains, l.Chain) || !slices.Contains(ours, l.Chain) {
					return bad("deletes a chain other than an optional one of ours")
				}
			case kernel.OpInsert:
				if l.Num != 1 || !slices.Contains(fixedJumps, Jump{Table: t.Table, From: l.Chain, Rule: l.Rule}) {
					return bad(fmt.Sprintf("inserts %q, not one of the fixed jumps", l.Rule))
				}
			default:
				return bad("command other than declare, append or a fixed jump")
			}
		}
	}
	return nil
}

func ourChains(t kernel.Table) []string {
	for _, tc := range tableChains {
		if tc.table == t {
			return tc.chains
		}
	}
	return nil
}

// checkTarget requires exactly one -j with an allowed target and no -g.
func checkTarget(rule string, ours []string) error {
	toks, err := kernel.RuleTokens(rule)
	if err != nil {
		return err
	}
	n := 0
	for i, tok := range toks {
		switch tok {
		case "-g", "--goto":
			return fmt.Errorf("goto in %q", rule)
		case "-j", "--jump":
			if i+1 == len(toks) {
				return fmt.Errorf("jump without target in %q", rule)
			}
			to := toks[i+1]
			if !slices.Contains(ours, to) && !slices.Contains(standardTargets, to) {
				return fmt.Errorf("target %q is not ours", to)
			}
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("%d jumps in %q (want 1)", n, strings.TrimSpace(rule))
	}
	return nil
}
