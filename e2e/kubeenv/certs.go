package kubeenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the PEM material of a throw-away cluster: one CA signs both the
// apiserver serving cert and the admin client cert, so one CA file serves as
// --client-ca-file for the server and as the trust root for clients.
type pki struct {
	caCert, serverCert, serverKey, clientCert, clientKey, saKey []byte

	// The CA itself signs further client certificates (kubelets,
	// controllers: issueClient). Its key is never written to disk.
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// files lists where writePKI put each file.
type pkiFiles struct {
	ca, serverCert, serverKey, saKey string
}

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}

func certPEM(tmpl, parent *x509.Certificate, pub, signer any) (*x509.Certificate, []byte, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// newPKI generates a CA, a serving cert for 127.0.0.1/localhost (and
// serverIPs: the advertised address, the kubernetes Service's ClusterIP), an
// admin client cert (system:masters) and a service-account signing key. ECDSA
// P-256 keeps generation in the millisecond range.
func newPKI(serverIPs ...net.IP) (*pki, error) {
	now := time.Now().Add(-time.Hour) // tolerate small clock skew
	notAfter := now.Add(10 * 24 * time.Hour)
	var p pki

	// The CA key is never written to disk; it dies with the process.
	caKey, _, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "vsplane-kubeenv-ca"},
		NotBefore:             now,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	ca, caPEM, err := certPEM(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	p.caCert, p.ca, p.caKey = caPEM, ca, caKey

	srvKey, srvKeyPEM, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("server key: %w", err)
	}
	if sn, err = serial(); err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, serverIPs...),
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	if _, p.serverCert, err = certPEM(srvTmpl, ca, &srvKey.PublicKey, caKey); err != nil {
		return nil, fmt.Errorf("server cert: %w", err)
	}
	p.serverKey = srvKeyPEM

	if p.clientCert, p.clientKey, err = p.issueClient("vsplane-admin", "system:masters"); err != nil {
		return nil, fmt.Errorf("client cert: %w", err)
	}

	if _, p.saKey, err = newKey(); err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	return &p, nil
}

// issueClient signs a client certificate for user cn in groups orgs.
func (p *pki) issueClient(cn string, orgs ...string) (crt, keyPEM []byte, err error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now,
		NotAfter:     now.Add(10 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	_, crt, err = certPEM(tmpl, p.ca, &key.PublicKey, p.caKey)
	return crt, keyPEM, err
}

// write stores the files the apiserver needs (the client key stays in memory
// and in the kubeconfig only).
func (p *pki) write(dir string) (pkiFiles, error) {
	f := pkiFiles{
		ca:         filepath.Join(dir, "ca.crt"),
		serverCert: filepath.Join(dir, "apiserver.crt"),
		serverKey:  filepath.Join(dir, "apiserver.key"),
		saKey:      filepath.Join(dir, "sa.key"),
	}
	for path, data := range map[string][]byte{
		f.ca: p.caCert, f.serverCert: p.serverCert, f.serverKey: p.serverKey, f.saKey: p.saKey,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return f, err
		}
	}
	return f, nil
}
