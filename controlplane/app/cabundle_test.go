package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vsplane/vsplane/internal/testpki"
)

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The ConfigMap is created, left alone while the file is unchanged,
// updated (keeping other keys) when the CA rotates, and a file that is not
// certificates only is never published.
func TestCAPublisher(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ca, err := testpki.NewCA("one")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset()
	p, err := newCAPublisher(kube, "vsplane-system/vsplane-controlplane-ca", files.CA, 0, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	get := func() *corev1.ConfigMap {
		t.Helper()
		cm, err := kube.CoreV1().ConfigMaps("vsplane-system").Get(ctx, "vsplane-controlplane-ca", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	writes := func() int {
		n := 0
		for _, a := range kube.Actions() {
			if v := a.GetVerb(); v == "create" || v == "update" {
				n++
			}
		}
		return n
	}

	if err := p.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if cm := get(); cm.Data[CABundleKey] != string(first) || cm.Labels["app.kubernetes.io/part-of"] != "vsplane" {
		t.Fatalf("created ConfigMap %+v", cm)
	}
	if err := p.publish(ctx); err != nil || writes() != 1 {
		t.Fatalf("unchanged file: err %v, %d writes; want no second write", err, writes())
	}

	// An operator's extra key survives a rotation.
	cm := get()
	cm.Data["note"] = "kept"
	if _, err := kube.CoreV1().ConfigMaps("vsplane-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA("two")
	if err != nil {
		t.Fatal(err)
	}
	otherFiles, err := other.WriteServer(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	second, err := os.ReadFile(otherFiles.CA)
	if err != nil {
		t.Fatal(err)
	}
	bundle := append(append([]byte{}, first...), second...) // a rotation's overlap: both CAs
	writeFile(t, dir, filepath.Base(files.CA), bundle)
	if err := p.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if cm := get(); cm.Data[CABundleKey] != string(bundle) || cm.Data["note"] != "kept" {
		t.Errorf("after rotation: %v", cm.Data)
	}

	key, err := os.ReadFile(files.Key)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"a private key":          {append(append([]byte{}, first...), key...), `holds a "EC PRIVATE KEY" block`},
		"garbage after the cert": {append(append([]byte{}, first...), "junk\n"...), "not PEM after 1 certificate(s)"},
		"empty":                  {nil, "no certificate"},
		"a bad certificate":      {[]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), "certificate 1:"},
	} {
		t.Run(name, func(t *testing.T) {
			writeFile(t, dir, filepath.Base(files.CA), tc.data)
			err := p.publish(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if got := get().Data[CABundleKey]; got != string(bundle) {
				t.Errorf("a refused file changed the published bundle to %q", got)
			}
		})
	}
	if err := os.Remove(files.CA); err != nil {
		t.Fatal(err)
	}
	if err := p.publish(ctx); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}

	for _, ref := range []string{"name", "/name", "ns/", "a/b/c"} {
		if _, err := newCAPublisher(kube, ref, files.CA, 0, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "want namespace/name") {
			t.Errorf("ref %q: %v", ref, err)
		}
	}
	if _, err := newCAPublisher(kube, "a/b", "", 0, zap.NewNop()); err == nil {
		t.Error("no CA file: want an error")
	}
}
