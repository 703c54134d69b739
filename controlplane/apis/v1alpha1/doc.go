// Package v1alpha1 is the vsplane.io/v1alpha1 API: SchedulerRollout, a
// fleet-wide, staged change of the IPVS scheduler of selected Services,
// gated on what the agents report and rolled back on failure.
//
// Generated: zz_generated.deepcopy.go and deploy/crds/ (make generate,
// controller-gen); CI checks both are current.
//
// +kubebuilder:object:generate=true
// +groupName=vsplane.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of this package.
var GroupVersion = schema.GroupVersion{Group: "vsplane.io", Version: "v1alpha1"}

// Resource is the plural resource name of SchedulerRollout.
var Resource = GroupVersion.WithResource("schedulerrollouts")

// AddToScheme registers the types with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &SchedulerRollout{}, &SchedulerRolloutList{})
	metaAddToGroupVersion(s)
	return nil
}

func metaAddToGroupVersion(s *runtime.Scheme) { metav1.AddToGroupVersion(s, GroupVersion) }
