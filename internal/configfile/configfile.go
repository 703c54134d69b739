// Package configfile is the plane-neutral machinery of vsplane's versioned
// configuration files (config.vsplane.io): the control plane's
// VsplaneConfiguration (controlplane/config) and the agent's
// VsplaneAgentConfiguration (dataplane/agentconfig). It knows neither
// plane's settings; each plane's package owns its types, defaults,
// validation rules and flags and uses these pieces:
//
//   - Read turns a file (YAML or JSON) into JSON, strictly (a duplicate key
//     is an error), and checks its apiVersion and kind against the types
//     the caller accepts. Its errors name what was found and what is
//     wanted (TypeError for a wrong or missing type).
//   - DecodeStrict decodes that JSON into a struct that already holds the
//     defaults, so a field left out keeps its default. Every key that names
//     no field, at any depth (unknown, misspelled, wrongly cased: the JSON
//     names must match exactly, which encoding/json alone does not check),
//     is an error naming its path ("ipvs.schedulr"), all of them at once
//     (UnknownFieldError). Types with their own JSON decoding
//     (json.Unmarshaler, e.g. Duration) are leaves.
//   - Problems collects validation errors worded `path value: reason`
//     (`ipvs.scheduler "foo": not a known IPVS scheduler`) and returns them
//     all at once, one per line.
//   - Overlay and Explicit apply the flags given on the command line over a
//     decoded file, for the precedence "a flag given on the command line >
//     the file > the defaults"; ListValue and Int32Value are flag values
//     whose String round-trips through Set, as Overlay needs.
package configfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Type is a file's apiVersion and kind.
type Type struct {
	APIVersion, Kind string
}

// String is "apiVersion A, kind K".
func (t Type) String() string { return fmt.Sprintf("apiVersion %s, kind %s", t.APIVersion, t.Kind) }

// want words the accepted types: the first in full, the others as
// alternatives: "apiVersion A, kind K (or A2, K2)".
func want(accept []Type) string {
	if len(accept) == 0 {
		return "a configuration object"
	}
	s := accept[0].String()
	for _, t := range accept[1:] {
		s += fmt.Sprintf(" (or %s, %s)", t.APIVersion, t.Kind)
	}
	return s
}

// TypeError is a file whose apiVersion and kind are missing (Got is zero)
// or not among the accepted ones (Want, the preferred first).
type TypeError struct {
	Got  Type
	Want []Type
}

func (e *TypeError) Error() string {
	if e.Got == (Type{}) {
		return "apiVersion and kind missing: want " + want(e.Want)
	}
	return fmt.Sprintf("apiVersion %q, kind %q: not supported; want %s", e.Got.APIVersion, e.Got.Kind, want(e.Want))
}

// Document is a configuration file converted to JSON, with its type.
type Document struct {
	JSON []byte
	Type Type
}

// Read converts data (YAML or JSON) to JSON and checks that its type is one
// of accept (at least one; the first is the preferred, named alone in the
// error for an empty file). Errors: "not a YAML or JSON document: ..."
// (including a duplicate key), "empty file: want ...", "not a
// configuration object: ...", or a *TypeError.
func Read(data []byte, accept ...Type) (*Document, error) {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not a YAML or JSON document: %w", err)
	}
	if s := strings.TrimSpace(string(j)); s == "null" || s == "" {
		return nil, fmt.Errorf("empty file: want %s", want(accept[:min(1, len(accept))]))
	}
	var tm TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return nil, fmt.Errorf("not a configuration object: %w", err)
	}
	t := Type{APIVersion: tm.APIVersion, Kind: tm.Kind}
	if !slices.Contains(accept, t) {
		return nil, &TypeError{Got: t, Want: slices.Clone(accept)}
	}
	return &Document{JSON: j, Type: t}, nil
}

// UnknownFieldError lists the paths of the keys that name no field, sorted.
type UnknownFieldError struct {
	Paths []string
}

func (e *UnknownFieldError) Error() string { return "unknown field " + QuoteAll(e.Paths) }

// DecodeStrict decodes the JSON document j into into, a pointer to a
// struct holding the defaults: first every key of j that names no field of
// the struct (see UnknownFields) is reported as one *UnknownFieldError;
// then encoding/json decodes (its errors, e.g. a wrong type or a bad
// duration, are returned as they are).
func DecodeStrict(j []byte, into any) error {
	t := reflect.TypeOf(into)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("configfile: DecodeStrict needs a pointer to a struct, got %T", into)
	}
	if unknown := UnknownFields(j, t.Elem()); len(unknown) > 0 {
		return &UnknownFieldError{Paths: unknown}
	}
	return json.Unmarshal(j, into)
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// UnknownFields returns the paths ("ipvs.schedulr", "list[2].nmae") of the
// keys in the JSON document j that name no field of t, matched exactly
// (encoding/json alone would accept "Scheduler" for "scheduler"), sorted.
// A j that is not JSON gives none (the typed decode reports it).
func UnknownFields(j []byte, t reflect.Type) []string {
	var doc any
	if err := json.Unmarshal(j, &doc); err != nil {
		return nil
	}
	var out []string
	walkUnknown(doc, t, "", &out)
	slices.Sort(out)
	return out
}

func walkUnknown(v any, t reflect.Type, path string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		return // a leaf with its own encoding (Duration, metav1.Duration)
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		fields := jsonFields(t)
		for k, val := range m {
			ft, ok := fields[k]
			if !ok {
				*out = append(*out, JoinPath(path, k))
				continue
			}
			walkUnknown(val, ft, JoinPath(path, k), out)
		}
	case reflect.Slice, reflect.Array:
		if a, ok := v.([]any); ok {
			for i, e := range a {
				walkUnknown(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
			}
		}
	}
}

// jsonFields maps the JSON names of t's fields (inlined structs included)
// to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" && (opts == "inline" || f.Type.Kind() == reflect.Struct) {
			for k, ft := range jsonFields(f.Type) {
				out[k] = ft
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// JoinPath appends the key k to a field path: "" and "ipvs" give "ipvs",
// "ipvs" and "scheduler" give "ipvs.scheduler".
func JoinPath(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// QuoteAll quotes each of ss and joins them with ", ".
func QuoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// QuoteValue renders a value the way a file spells it: strings and
// durations quoted, lists of strings as ["a", "b"], numbers and booleans
// bare.
func QuoteValue(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case time.Duration:
		return fmt.Sprintf("%q", v.String())
	case []string:
		return "[" + QuoteAll(v) + "]"
	default:
		return fmt.Sprint(v)
	}
}

// Problems collects validation errors; the zero value is empty.
type Problems []error

// Add records that the field at path has the bad value value, as
// `path value: reason` (value rendered by QuoteValue, reason by
// fmt.Sprintf(format, args...)).
func (p *Problems) Add(path string, value any, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s %s: %s", path, QuoteValue(value), fmt.Sprintf(format, args...)))
}

// Err returns nil without problems, else all of them joined (errors.Join:
// one per line).
func (p Problems) Err() error {
	if len(p) == 0 {
		return nil
	}
	return errors.Join(p...)
}

// TypeMeta is a configuration file's apiVersion and kind, embedded in a
// configuration type: the JSON of Kubernetes' metav1.TypeMeta, without
// linking apimachinery into the binaries that need nothing else of it (the
// agent: its whole binary is resident, so its size is memory).
type TypeMeta struct {
	Kind       string `json:"kind,omitempty"` // metav1's order
	APIVersion string `json:"apiVersion,omitempty"`
}

// Duration is a Go duration written as a string ("30s"): the JSON of
// Kubernetes' metav1.Duration (see TypeMeta for why not that).
type Duration struct {
	time.Duration
}

// UnmarshalJSON reads a string time.ParseDuration accepts.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration's String.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.Duration.String()) }
