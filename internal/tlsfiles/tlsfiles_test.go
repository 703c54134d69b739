package tlsfiles_test

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/internal/testpki"
	"github.com/vsplane/vsplane/internal/tlsfiles"
)

// handshake connects a client to a server over a real socket and returns
// the serial of the certificate the client saw, or the client's error.
func handshake(t *testing.T, srv *tls.Config, cli *tls.Config) (string, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cli)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func TestServerCertificateAndCAReloadWithoutRestart(t *testing.T) {
	tlsfiles.SetCheckInterval(0) // production checks at most once a second
	t.Cleanup(func() { tlsfiles.SetCheckInterval(time.Second) })
	dir := t.TempDir()
	ca1, err := testpki.NewCA("ca-1")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca1.WriteServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := tlsfiles.NewServer(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tlsfiles.NewClient(f.CA, testpki.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	first, err := handshake(t, srv.Config(), cli.Config())
	if err != nil {
		t.Fatalf("first handshake: %v", err)
	}

	// A wrong name is refused even though the address is right.
	wrong, err := tlsfiles.NewClient(f.CA, "someone-else.example")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, srv.Config(), wrong.Config()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("handshake verifying another name: %v, want a certificate error", err)
	}

	// Rotate to a new CA and certificate (a Secret update): new handshakes
	// use them without new Server/Client values.
	ca2, err := testpki.NewCA("ca-2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca2.WriteServer(dir); err != nil {
		t.Fatal(err)
	}
	second, err := handshake(t, srv.Config(), cli.Config())
	if err != nil {
		t.Fatalf("handshake after rotation: %v", err)
	}
	if second == first {
		t.Fatal("the server still serves the old certificate after the files changed")
	}
	// A client that trusts only the old CA now fails.
	old := filepath.Join(t.TempDir(), "old-ca.crt")
	if err := os.WriteFile(old, ca1.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	oldCli, err := tlsfiles.NewClient(old, testpki.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, srv.Config(), oldCli.Config()); err == nil {
		t.Fatal("a client trusting only the old CA accepted the new certificate")
	}

	// A broken update keeps the last good certificate.
	if err := os.WriteFile(f.Key, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := handshake(t, srv.Config(), cli.Config()); err != nil || got != second {
		t.Fatalf("after a broken update: serial %s err %v, want the last good %s", got, err, second)
	}
}

func TestNewFailsClearly(t *testing.T) {
	if _, err := tlsfiles.NewServer("/nonexistent/tls.crt", "/nonexistent/tls.key"); err == nil {
		t.Fatal("missing files accepted")
	}
	empty := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(empty, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsfiles.NewClient(empty, "x"); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("CA file without certificates: %v", err)
	}
	if _, err := tlsfiles.NewClient(empty, ""); err == nil {
		t.Fatal("empty server name accepted")
	}
}
