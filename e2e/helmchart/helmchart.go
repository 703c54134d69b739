// Package helmchart renders vsplane's Helm chart (deploy/helm/vsplane) with
// Helm's Go SDK, as `helm install --dry-run` (client only: no cluster)
// would: for the chart's tests (e2e/integration) and for the real-node test
// bed, which installs vsplane from it (e2e/cluster, RealOptions.FromChart).
package helmchart

import (
	"fmt"
	"path/filepath"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
)

const (
	// Dir is the chart's directory in the repository.
	Dir = "deploy/helm/vsplane"
	// Namespace is the release namespace the tests install into: the
	// base's, where the chart's fixed object names expect it.
	Namespace = "vsplane-system"
	// KubeVersion is the cluster version rendered for (the pinned
	// Kubernetes modules').
	KubeVersion = "v1.37.2"
)

// ReadValues reads a values file (YAML).
func ReadValues(file string) (map[string]any, error) {
	return common.ReadValuesFile(file)
}

// Render renders the chart at repo's Dir with vals into Namespace as
// release "vsplane", CRDs included, vals checked against
// values.schema.json (an error names a bad value). It returns the objects
// as one YAML stream.
func Render(repo string, vals map[string]any) ([]byte, error) {
	ch, err := loader.Load(filepath.Join(repo, Dir))
	if err != nil {
		return nil, err
	}
	inst := action.NewInstall(action.NewConfiguration())
	inst.DryRunStrategy = action.DryRunClient
	inst.ReleaseName = "vsplane"
	inst.Namespace = Namespace
	inst.IncludeCRDs = true
	if inst.KubeVersion, err = common.ParseKubeVersion(KubeVersion); err != nil {
		return nil, err
	}
	out, err := inst.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	rel, ok := out.(*release.Release)
	if !ok {
		return nil, fmt.Errorf("helmchart: the SDK returned a %T, not a release", out)
	}
	return []byte(rel.Manifest), nil
}
