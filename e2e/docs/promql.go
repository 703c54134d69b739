package docs

import (
	"fmt"
	"strings"
)

// Selector is one vector selector of a PromQL expression: a metric name and
// the labels its matchers name, with their values.
type Selector struct {
	Metric   string
	Matchers map[string]string
}

// Query is what a PromQL expression reads, as far as the dashboard check
// needs: its selectors, the functions and aggregations it calls, and the
// labels it groups by (by, without, on, ignoring, group_left/right).
type Query struct {
	Selectors []Selector
	Functions []string
	Grouping  []string
}

// promqlFunctions are PromQL's functions and aggregation operators.
var promqlFunctions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`
		abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min count_over_time
		day_of_month day_of_week day_of_year days_in_month delta deriv exp floor histogram_avg
		histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum
		holt_winters hour idelta increase irate label_join label_replace last_over_time ln log10 log2
		max_over_time min_over_time minute month predict_linear present_over_time quantile_over_time rate
		resets round scalar sgn sort sort_by_label sort_by_label_desc sort_desc sqrt stddev_over_time
		stdvar_over_time sum_over_time time timestamp vector year
		sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio`) {
		promqlFunctions[f] = true
	}
}

// groupingKeywords take a parenthesised list of label names.
var groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// operatorKeywords are binary operators and modifiers spelled as words.
var operatorKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true}

// ParseQuery reads expr's selectors, functions and grouping labels. It is a
// lexer with just enough grammar for dashboards and alert rules, not a full
// PromQL parser: it rejects unbalanced brackets, unterminated strings,
// malformed matchers and characters PromQL does not have. Grafana variables
// ($name, ${name}) are accepted where PromQL takes a duration or a string.
func ParseQuery(expr string) (Query, error) {
	toks, err := lex(expr)
	if err != nil {
		return Query{}, err
	}
	var q Query
	var depth []string // open brackets
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		next := func(k int) token {
			if i+k < len(toks) {
				return toks[i+k]
			}
			return token{}
		}
		switch {
		case tk.kind == tokPunct && (tk.text == "(" || tk.text == "["):
			depth = append(depth, tk.text)
		case tk.kind == tokPunct && (tk.text == ")" || tk.text == "]"):
			open := map[string]string{")": "(", "]": "["}[tk.text]
			if len(depth) == 0 || depth[len(depth)-1] != open {
				return Query{}, fmt.Errorf("unbalanced %q at offset %d", tk.text, tk.pos)
			}
			depth = depth[:len(depth)-1]
		case tk.kind == tokPunct && tk.text == "{":
			// A selector without a metric name ({__name__=...}) is not used here.
			return Query{}, fmt.Errorf("matchers without a metric name at offset %d", tk.pos)
		case tk.kind == tokIdent && len(depth) > 0 && depth[len(depth)-1] == "[":
			// a duration's unit or a subquery step: nothing to read
		case tk.kind == tokIdent && groupingKeywords[tk.text]:
			if next(1).text != "(" {
				if tk.text == "group_left" || tk.text == "group_right" {
					continue // without a label list
				}
				return Query{}, fmt.Errorf("%s without a label list at offset %d", tk.text, tk.pos)
			}
			j := i + 2
			for ; j < len(toks) && toks[j].text != ")"; j++ {
				switch {
				case toks[j].kind == tokIdent:
					q.Grouping = append(q.Grouping, toks[j].text)
				case toks[j].text != ",":
					return Query{}, fmt.Errorf("%s list: unexpected %q at offset %d", tk.text, toks[j].text, toks[j].pos)
				}
			}
			if j == len(toks) {
				return Query{}, fmt.Errorf("%s list not closed", tk.text)
			}
			i = j
		case tk.kind == tokIdent && operatorKeywords[tk.text]:
		case tk.kind == tokIdent && (next(1).text == "(" || next(1).text == "by" || next(1).text == "without"):
			// a call, or an aggregation with its grouping first: sum by (le) (…)
			if !promqlFunctions[tk.text] {
				return Query{}, fmt.Errorf("%s is not a PromQL function", tk.text)
			}
			q.Functions = append(q.Functions, tk.text)
		case tk.kind == tokIdent:
			sel := Selector{Metric: tk.text, Matchers: map[string]string{}}
			if next(1).text == "{" {
				j := i + 2
				for ; j < len(toks) && toks[j].text != "}"; j++ {
					if toks[j].text == "," {
						continue
					}
					name, op, val := toks[j], next(j-i+1), next(j-i+2)
					if name.kind != tokIdent || op.kind != tokMatchOp || val.kind != tokString {
						return Query{}, fmt.Errorf("%s: malformed matcher at offset %d", tk.text, name.pos)
					}
					sel.Matchers[name.text] = val.text
					j += 2
				}
				if j == len(toks) {
					return Query{}, fmt.Errorf("%s: matchers not closed", tk.text)
				}
				i = j
			}
			q.Selectors = append(q.Selectors, sel)
		}
	}
	if len(depth) > 0 {
		return Query{}, fmt.Errorf("%d brackets not closed", len(depth))
	}
	return q, nil
}

type tokenKind int

const (
	tokIdent tokenKind = iota + 1
	tokNumber
	tokString
	tokMatchOp
	tokPunct
	tokVariable
)

type token struct {
	kind tokenKind
	text string
	pos  int
}

func lex(s string) ([]token, error) {
	var out []token
	isIdentStart := func(r byte) bool { return r == '_' || r == ':' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }
	isIdent := func(r byte) bool { return isIdentStart(r) || (r >= '0' && r <= '9') }
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			i++
		case c == '"' || c == '\'':
			j := i + 1
			var b strings.Builder
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j == len(s) {
				return nil, fmt.Errorf("string at offset %d not terminated", i)
			}
			out = append(out, token{tokString, b.String(), i})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < len(s) && s[j] == '{' {
				k := strings.IndexByte(s[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("variable at offset %d not closed", i)
				}
				j += k + 1
			} else {
				for j < len(s) && isIdent(s[j]) {
					j++
				}
			}
			out = append(out, token{tokVariable, s[i:j], i})
			i = j
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			out = append(out, token{tokIdent, s[i:j], i})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			j := i
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' || s[j] == 'e') {
				j++
			}
			out = append(out, token{tokNumber, s[i:j], i})
			i = j
		case strings.HasPrefix(s[i:], "=~") || strings.HasPrefix(s[i:], "!~") || strings.HasPrefix(s[i:], "!="):
			out = append(out, token{tokMatchOp, s[i : i+2], i})
			i += 2
		case strings.HasPrefix(s[i:], "==") || strings.HasPrefix(s[i:], ">=") || strings.HasPrefix(s[i:], "<="):
			out = append(out, token{tokPunct, s[i : i+2], i})
			i += 2
		case c == '=':
			out = append(out, token{tokMatchOp, "=", i})
			i++
		case strings.IndexByte("(){}[],+-*/%^<>@", c) >= 0:
			out = append(out, token{tokPunct, string(c), i})
			i++
		default:
			return nil, fmt.Errorf("unexpected %q at offset %d", c, i)
		}
	}
	return out, nil
}
