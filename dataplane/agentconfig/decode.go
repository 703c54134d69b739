package agentconfig

import (
	"errors"
	"fmt"

	"github.com/vsplane/vsplane/internal/configfile"
)

// hints explain the files someone may point the agent at by mistake.
var hints = map[configfile.Type]string{
	{APIVersion: "config.vsplane.io/v1alpha1", Kind: "VsplaneConfiguration"}: "that is the control plane's file (vsplane-controlplane --config)",
	{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"}: "that is kube-proxy's file: its IPVS settings are " +
		"fleet settings, read by the control plane (vsplane-controlplane --config accepts it), not by the agent",
}

// Decode decodes a file (YAML or JSON) strictly onto the defaults: a field
// left out keeps its default; an unknown, misspelled or wrongly cased
// field, or a duplicate key, is an error naming it; a file of another kind
// (the control plane's VsplaneConfiguration, a KubeProxyConfiguration) is
// an error naming the kind wanted. Decode does not validate (Validate
// does).
func Decode(data []byte) (*VsplaneAgentConfiguration, error) {
	doc, err := configfile.Read(data, configfile.Type{APIVersion: APIVersion, Kind: Kind})
	if err != nil {
		var te *configfile.TypeError
		if errors.As(err, &te) && hints[te.Got] != "" {
			return nil, fmt.Errorf("%w (%s)", err, hints[te.Got])
		}
		return nil, err
	}
	c := Defaults()
	if err := configfile.DecodeStrict(doc.JSON, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", Kind, err)
	}
	return &c, nil
}
