// Package tlsfiles builds TLS configurations from PEM files (a Kubernetes
// Secret mounted as a volume) and picks up new contents without a restart:
// a certificate rotated by cert-manager or by hand is used for the next
// handshake. Both planes use it: the control plane's server certificate, the
// agent's trust in the control plane's CA.
package tlsfiles

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// checkInterval bounds how often the files are read (at most once per
// handshake, and not more often than this).
var checkInterval = time.Second

// watched is a set of files reloaded together when any of them changes.
// Changes are detected by content (the files are small; they are read at
// most once per checkInterval): modification times can repeat within a
// clock tick and a rotated certificate often has the same size.
type watched struct {
	paths []string
	// load builds the configuration from the files' contents (in paths
	// order): exactly the bytes whose sums are recorded.
	load func(contents [][]byte) error

	mu        sync.Mutex
	lastCheck time.Time
	sums      [][32]byte // of the contents last loaded; nil before the first load
}

func (w *watched) refresh() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sums != nil && time.Since(w.lastCheck) < checkInterval {
		return nil
	}
	w.lastCheck = time.Now()
	sums := make([][32]byte, len(w.paths))
	contents := make([][]byte, len(w.paths))
	changed := w.sums == nil
	for i, p := range w.paths {
		b, err := os.ReadFile(p)
		if err != nil {
			if w.sums != nil {
				return nil // keep serving what was loaded (a Secret update swaps a symlink)
			}
			return fmt.Errorf("tls: %w", err)
		}
		contents[i] = b
		sums[i] = sha256.Sum256(b)
		if w.sums != nil && sums[i] != w.sums[i] {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := w.load(contents); err != nil {
		if w.sums != nil {
			return nil // a half-written update: keep the old one, retry on the next check
		}
		return err
	}
	w.sums = sums
	return nil
}

// Server serves the certificate in certFile/keyFile, reloaded on change.
type Server struct {
	w    *watched
	mu   sync.RWMutex
	cert *tls.Certificate
}

// NewServer loads certFile and keyFile (PEM); it fails if they cannot be
// read or do not form a key pair.
func NewServer(certFile, keyFile string) (*Server, error) {
	s := &Server{}
	s.w = &watched{paths: []string{certFile, keyFile}, load: func(pem [][]byte) error {
		c, err := tls.X509KeyPair(pem[0], pem[1])
		if err != nil {
			return fmt.Errorf("tls: loading %s and %s: %w", certFile, keyFile, err)
		}
		s.mu.Lock()
		s.cert = &c
		s.mu.Unlock()
		return nil
	}}
	if err := s.w.refresh(); err != nil {
		return nil, err
	}
	return s, nil
}

// Config returns a server TLS configuration (TLS 1.2+, h2) whose
// certificate follows the files.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			_ = s.w.refresh()
			s.mu.RLock()
			defer s.mu.RUnlock()
			return s.cert, nil
		},
	}
}

// Certificate returns the certificate served now (after checking the files).
func (s *Server) Certificate() *tls.Certificate {
	_ = s.w.refresh()
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cert
}

// Client verifies servers against the CA bundle in caFile (reloaded on
// change) and the name serverName, whatever address was dialled: agents
// dial replicas by IP, the certificate names the control plane's Service.
type Client struct {
	serverName string
	w          *watched
	mu         sync.RWMutex
	pool       *x509.CertPool
}

// NewClient loads caFile (PEM, one or more certificates).
func NewClient(caFile, serverName string) (*Client, error) {
	if serverName == "" {
		return nil, errors.New("tls: a server name to verify is required")
	}
	c := &Client{serverName: serverName}
	c.w = &watched{paths: []string{caFile}, load: func(pem [][]byte) error {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem[0]) {
			return fmt.Errorf("tls: %s holds no PEM certificate", caFile)
		}
		c.mu.Lock()
		c.pool = pool
		c.mu.Unlock()
		return nil
	}}
	if err := c.w.refresh(); err != nil {
		return nil, err
	}
	return c, nil
}

// Config returns a client TLS configuration that verifies the server's
// chain against the current CA bundle and serverName. (Go's own
// verification cannot take a pool that changes, so it is done here in
// VerifyConnection, with the same checks.)
func (c *Client) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2"},
		ServerName:         c.serverName,
		InsecureSkipVerify: true, // verified below, against the reloaded pool
		VerifyConnection: func(cs tls.ConnectionState) error {
			_ = c.w.refresh()
			c.mu.RLock()
			pool := c.pool
			c.mu.RUnlock()
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: pool, Intermediates: inter, DNSName: c.serverName,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				return fmt.Errorf("tls: control-plane certificate: %w", err)
			}
			return nil
		},
	}
}
