package app

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CABundleKey is the key of the published CA bundle in its ConfigMap, the
// name kube-root-ca.crt and cert-manager's Secrets use.
const CABundleKey = "ca.crt"

// DefaultCAPublishInterval is how often a replica compares the published
// bundle with its CA file: a rotated CA reaches clients within it.
const DefaultCAPublishInterval = time.Minute

// caPublisher keeps a ConfigMap's ca.crt equal to the CA bundle the
// replicas' serving certificates chain to, so clients (kubectl vsplane,
// grpcurl) can verify the control plane without read access to the Secret
// that also holds the serving key — as kube-controller-manager publishes
// kube-root-ca.crt. Every replica runs one; they write only when the
// content differs, so they agree without electing anyone.
type caPublisher struct {
	kube            kubernetes.Interface
	namespace, name string
	file            string
	interval        time.Duration
	log             *zap.Logger
	lastErr         string
}

func newCAPublisher(kube kubernetes.Interface, ref, file string, interval time.Duration, log *zap.Logger) (*caPublisher, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("controlplane: CA ConfigMap %q: want namespace/name", ref)
	}
	if file == "" {
		return nil, errors.New("controlplane: publishing the CA needs the CA file (--tls-ca-file)")
	}
	if interval <= 0 {
		interval = DefaultCAPublishInterval
	}
	return &caPublisher{kube: kube, namespace: ns, name: name, file: file, interval: interval, log: log}, nil
}

// run publishes now and then every interval until ctx ends. A failure
// (missing RBAC, an unreadable file) is logged once per distinct error and
// retried: it must not stop the replica, whose agents do not need it.
func (p *caPublisher) run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		if err := p.publish(ctx); err != nil && ctx.Err() == nil {
			if msg := err.Error(); msg != p.lastErr {
				p.log.Warn("cannot publish the CA bundle; clients must be given it (--certificate-authority)", zap.Error(err))
				p.lastErr = msg
			}
		} else if err == nil && p.lastErr != "" {
			p.log.Info("CA bundle published again", zap.String("configmap", p.namespace+"/"+p.name))
			p.lastErr = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publish makes the ConfigMap hold the CA file's bundle, creating it if
// missing and writing only when it differs.
func (p *caPublisher) publish(ctx context.Context) error {
	bundle, err := readCABundle(p.file)
	if err != nil {
		return err
	}
	cms := p.kube.CoreV1().ConfigMaps(p.namespace)
	cm, err := cms.Get(ctx, p.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: p.namespace,
				Labels: map[string]string{"app.kubernetes.io/part-of": "vsplane", "app.kubernetes.io/component": "controlplane"}},
			Data: map[string]string{CABundleKey: bundle},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // a peer replica was first; compare on the next round
			return nil
		}
		return wrapPublish(p, err)
	case err != nil:
		return wrapPublish(p, err)
	case cm.Data[CABundleKey] == bundle:
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[CABundleKey] = bundle
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) { // a peer replica wrote it meanwhile
		return nil
	}
	return wrapPublish(p, err)
}

func wrapPublish(p *caPublisher, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("ConfigMap %s/%s: %w", p.namespace, p.name, err)
}

// readCABundle reads a PEM file that must hold certificates and nothing
// else: whatever it holds is published for anyone to read, so a file with a
// private key in it (a mounted tls.key by mistake) is refused, not shared.
func readCABundle(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("CA bundle: %w", err)
	}
	rest, n := bytes.TrimSpace(data), 0
	for len(rest) > 0 {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return "", fmt.Errorf("CA bundle %s: not PEM after %d certificate(s)", file, n)
		}
		if block.Type != "CERTIFICATE" {
			return "", fmt.Errorf("CA bundle %s: holds a %q block; only certificates are published", file, block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return "", fmt.Errorf("CA bundle %s: certificate %d: %w", file, n+1, err)
		}
		n++
		rest = bytes.TrimSpace(rest)
	}
	if n == 0 {
		return "", fmt.Errorf("CA bundle %s: no certificate", file)
	}
	return string(data), nil
}
