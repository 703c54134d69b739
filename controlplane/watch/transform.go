package watch

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// slimForCache is the informers' transform: what the caches keep of each
// object. The control plane converts every object to its model on arrival
// (package model) and reads nothing else from the caches, so they need
// only what the conversions read. Dropped for every kind: managedFields
// (server-side apply bookkeeping, often the largest part of a slice or a
// Node). Dropped for Nodes: everything but metadata, taints, pod CIDRs and addresses
// (model.ConvertNode), notably status.images and conditions, several KB
// per node in a real cluster. The transform runs before an object is
// stored and before handlers see it, so old and new objects alike are
// slim.
func slimForCache(obj any) (any, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		o, err := slimForCache(d.Obj)
		return cache.DeletedFinalStateUnknown{Key: d.Key, Obj: o}, err
	}
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	if n, ok := obj.(*corev1.Node); ok {
		n.Spec = corev1.NodeSpec{Taints: n.Spec.Taints, PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs}
		n.Status = corev1.NodeStatus{Addresses: n.Status.Addresses}
	}
	return obj, nil
}
