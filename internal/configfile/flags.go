package configfile

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// Overlay applies over a configuration the flags given explicitly on set
// (flag.Visit: only those the command line set, never a flag's default),
// so that a flag given on the command line beats the file. bind registers,
// on the FlagSet it is passed, one flag per setting bound to its field of
// the configuration to change (a plane's Bind with that configuration);
// each given flag of set that bind also registers is set there to the
// given value (f.Value.String(), which must round-trip through Set). Flags
// of set that bind does not register are ignored. The error names the
// flag: "--name: ...".
func Overlay(set *flag.FlagSet, bind func(*flag.FlagSet)) error {
	bound := flag.NewFlagSet("config", flag.ContinueOnError)
	bind(bound)
	var err error
	set.Visit(func(f *flag.Flag) {
		if bound.Lookup(f.Name) == nil || err != nil {
			return
		}
		if e := bound.Set(f.Name, f.Value.String()); e != nil {
			err = fmt.Errorf("--%s: %w", f.Name, e)
		}
	})
	return err
}

// Explicit returns the names of the flags of set that the command line set
// and that bind registers (the settings a file can also hold), in
// lexicographical order, for the log ("overridden by flags").
func Explicit(set *flag.FlagSet, bind func(*flag.FlagSet)) []string {
	bound := flag.NewFlagSet("config", flag.ContinueOnError)
	bind(bound)
	var out []string
	set.Visit(func(f *flag.Flag) {
		if bound.Lookup(f.Name) != nil {
			out = append(out, f.Name)
		}
	})
	return out
}

// ListValue is a comma-separated list flag bound to a []string (convert:
// (*ListValue)(&c.List)); empty elements are dropped, and "" is the empty
// list. String round-trips through Set.
type ListValue []string

func (l *ListValue) String() string { return strings.Join(*l, ",") }

func (l *ListValue) Set(s string) error {
	*l = nil
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			*l = append(*l, f)
		}
	}
	return nil
}

// Int32Value is an int32 flag ((*Int32Value)(&c.Field)).
type Int32Value int32

func (v *Int32Value) String() string { return strconv.Itoa(int(*v)) }

func (v *Int32Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return err
	}
	*v = Int32Value(n)
	return nil
}
