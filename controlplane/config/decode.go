package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Loaded is a decoded, defaulted file.
type Loaded struct {
	// Config is the configuration (a KubeProxyConfiguration mapped to it).
	Config VsplaneConfiguration
	// Kind is the file's kind (Kind or KubeProxyKind).
	Kind string
	// Warnings: fields of a KubeProxyConfiguration that vsplane does not
	// support (one entry naming them all), for the caller to log.
	Warnings []string
	// Sum is the sha256 of the file's bytes (zero without a file).
	Sum [32]byte
}

// Decode decodes a file (YAML or JSON) of either kind and fills defaults.
// A VsplaneConfiguration is decoded strictly: an unknown, misspelled or
// wrongly cased field, or a duplicate key, is an error naming it. A
// KubeProxyConfiguration is decoded leniently (a real kube-proxy ConfigMap
// loads); the fields it sets that vsplane does not support are listed in
// one warning. Decode does not validate (Validate does).
func Decode(data []byte) (*Loaded, error) {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not a YAML or JSON document: %w", err)
	}
	if s := strings.TrimSpace(string(j)); s == "null" || s == "" {
		return nil, fmt.Errorf("empty file: want apiVersion %s, kind %s", APIVersion, Kind)
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return nil, fmt.Errorf("not a configuration object: %w", err)
	}
	switch {
	case tm.APIVersion == APIVersion && tm.Kind == Kind:
		if unknown := unknownFields(j, reflect.TypeFor[VsplaneConfiguration]()); len(unknown) > 0 {
			return nil, fmt.Errorf("%s: unknown field %s", Kind, quoteAll(unknown))
		}
		c := Defaults()
		if err := json.Unmarshal(j, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", Kind, err)
		}
		return &Loaded{Config: c, Kind: Kind}, nil
	case tm.APIVersion == KubeProxyAPIVersion && tm.Kind == KubeProxyKind:
		var kp KubeProxyConfiguration
		if err := json.Unmarshal(j, &kp); err != nil {
			return nil, fmt.Errorf("%s: %w", KubeProxyKind, err)
		}
		c, err := kp.toVsplane()
		if err != nil {
			return nil, err
		}
		l := &Loaded{Config: c, Kind: KubeProxyKind}
		if unsupported := kubeProxyUnsupported(j); len(unsupported) > 0 {
			l.Warnings = append(l.Warnings, fmt.Sprintf("%s: fields not supported by vsplane, ignored: %s",
				KubeProxyKind, strings.Join(unsupported, ", ")))
		}
		return l, nil
	case tm.APIVersion == "" && tm.Kind == "":
		return nil, fmt.Errorf("apiVersion and kind missing: want apiVersion %s, kind %s (or %s, %s)", APIVersion, Kind, KubeProxyAPIVersion, KubeProxyKind)
	default:
		return nil, fmt.Errorf("apiVersion %q, kind %q: not supported; want apiVersion %s, kind %s (or %s, %s)",
			tm.APIVersion, tm.Kind, APIVersion, Kind, KubeProxyAPIVersion, KubeProxyKind)
	}
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// unknownFields returns the paths ("ipvs.schedulr") of the keys in the
// JSON document j that name no field of t, matched exactly (encoding/json
// alone would accept "Scheduler" for "scheduler"), sorted.
func unknownFields(j []byte, t reflect.Type) []string {
	var doc any
	if err := json.Unmarshal(j, &doc); err != nil {
		return nil // the typed decode reports it
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
		return // a leaf with its own encoding (metav1.Duration)
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
				*out = append(*out, join(path, k))
				continue
			}
			walkUnknown(val, ft, join(path, k), out)
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

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// errorList joins validation errors, one per line.
type errorList []error

func (l errorList) err() error {
	if len(l) == 0 {
		return nil
	}
	return errors.Join(l...)
}
