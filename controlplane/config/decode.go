package config

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/vsplane/vsplane/internal/configfile"
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
// one warning. Decode does not validate (Validate does). The plane-neutral
// part (YAML, type check, strictness) is internal/configfile.
func Decode(data []byte) (*Loaded, error) {
	doc, err := configfile.Read(data, configfile.Type{APIVersion: APIVersion, Kind: Kind},
		configfile.Type{APIVersion: KubeProxyAPIVersion, Kind: KubeProxyKind})
	if err != nil {
		return nil, err
	}
	j := doc.JSON
	switch doc.Type.Kind {
	case KubeProxyKind:
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
	default:
		c := Defaults()
		if err := configfile.DecodeStrict(j, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", Kind, err)
		}
		return &Loaded{Config: c, Kind: Kind}, nil
	}
}
