package watch

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/vsplane/vsplane/controlplane/model"
)

// The caches keep what the conversions read: a slimmed object converts to
// the same model as the full one.
func TestSlimForCacheKeepsWhatTheModelReads(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}}}
	now := metav1.Now()
	node := func() *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{model.LabelZone: "z1"},
				Annotations: map[string]string{"a": "b"}, DeletionTimestamp: &now, ManagedFields: mf},
			Spec: corev1.NodeSpec{PodCIDR: "198.19.0.0/24", PodCIDRs: []string{"198.19.0.0/24", "2001:2:0:100::/64"},
				ProviderID: "cloud://n1", Taints: []corev1.Taint{{Key: model.TaintToBeDeletedByClusterAutoscaler}}},
			Status: corev1.NodeStatus{
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.0.1"}, {Type: corev1.NodeExternalIP, Address: "198.18.1.1"}},
				Images:     []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			},
		}
	}
	full := node()
	slim, err := slimForCache(node())
	if err != nil {
		t.Fatal(err)
	}
	sn := slim.(*corev1.Node)
	if sn.ManagedFields != nil || sn.Status.Images != nil || sn.Status.Conditions != nil || sn.Spec.ProviderID != "" {
		t.Fatalf("not slimmed: %+v", sn)
	}
	want, _ := model.ConvertNode(full)
	got, _ := model.ConvertNode(sn)
	if d := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); d != "" {
		t.Fatalf("model of the slim Node differs (-full +slim):\n%s", d)
	}
	if len(got.PodCIDRs) != 2 {
		t.Fatalf("pod CIDRs %v, want both of spec.podCIDRs", got.PodCIDRs)
	}
	if sn.Annotations["a"] != "b" {
		t.Fatal("annotations dropped")
	}

	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", ManagedFields: mf},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"198.19.0.5"}}}}
	out, _ := slimForCache(cache.DeletedFinalStateUnknown{Key: "ns/s", Obj: slice})
	d := out.(cache.DeletedFinalStateUnknown)
	if s := d.Obj.(*discoveryv1.EndpointSlice); s.ManagedFields != nil || len(s.Endpoints) != 1 || d.Key != "ns/s" {
		t.Fatalf("tombstone: %+v", d)
	}
}
