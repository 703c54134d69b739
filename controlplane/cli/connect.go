package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

const (
	// DefaultNamespace is where deploy/ installs the control plane.
	DefaultNamespace = "vsplane-system"
	// ServiceName is the control plane's (headless) Service, PortName its
	// gRPC port.
	ServiceName = "vsplane-controlplane"
	PortName    = "grpc"
	// CAConfigMap holds, under CAKey, the CA that signs the control plane's
	// serving certificate; the control plane publishes it, and every
	// authenticated user may read it.
	CAConfigMap = "vsplane-controlplane-ca"
	CAKey       = "ca.crt"
)

// Target says how to reach the control plane; zero fields take the
// defaults.
type Target struct {
	Namespace string
	// Address (host:port) is dialled directly; empty: port-forward through
	// the API server to a Ready Pod of the Service.
	Address string
	// Token overrides the kubeconfig's credentials for the control plane.
	Token string
	// CAFile overrides the CA read from the CAConfigMap ConfigMap.
	CAFile string
	// ServerName is verified in the certificate; default
	// vsplane-controlplane.<Namespace>.svc.
	ServerName string
}

func (t Target) namespace() string {
	if t.Namespace == "" {
		return DefaultNamespace
	}
	return t.Namespace
}

func (t Target) serverName() string {
	if t.ServerName == "" {
		return ServiceName + "." + t.namespace() + ".svc"
	}
	return t.ServerName
}

// Conn is an open connection to the control plane.
type Conn struct {
	Inspect vsplanev1.InspectServiceClient
	conn    *grpc.ClientConn
	stop    func()
}

// Close closes the connection and any port-forward.
func (c *Conn) Close() {
	_ = c.conn.Close()
	if c.stop != nil {
		c.stop()
	}
}

// Connect reaches the control plane described by t with the credentials of
// the user's kubeconfig (restConfig, read only if needed): the token
// (t.Token, else the kubeconfig's bearer token, token file, exec or
// auth-provider plugin), the CA (t.CAFile, else the ConfigMap), and the
// address (t.Address, else a port-forward). With all three given, no
// kubeconfig is needed.
func Connect(ctx context.Context, restConfig func() (*rest.Config, error), t Target, stderr io.Writer) (*Conn, error) {
	var cfg *rest.Config
	var kube kubernetes.Interface
	kubeconfig := func() error {
		if cfg != nil {
			return nil
		}
		c, err := restConfig()
		if err != nil {
			return fmt.Errorf("kubeconfig: %w", err)
		}
		if kube, err = kubernetes.NewForConfig(c); err != nil {
			return err
		}
		cfg = c
		return nil
	}
	token := t.Token
	if token == "" {
		if err := kubeconfig(); err != nil {
			return nil, err
		}
		var err error
		if token, err = BearerToken(cfg); err != nil {
			return nil, err
		}
	}
	var caPEM []byte
	var err error
	if t.CAFile != "" {
		caPEM, err = os.ReadFile(t.CAFile)
	} else if err = kubeconfig(); err == nil {
		caPEM, err = caFromConfigMap(ctx, kube, t.namespace())
	}
	if err != nil {
		return nil, err
	}
	tlsCfg, err := clientTLS(caPEM, t.serverName())
	if err != nil {
		return nil, err
	}
	addr, stop := t.Address, func() {}
	if addr == "" {
		if err := kubeconfig(); err != nil {
			return nil, err
		}
		if addr, stop, err = portForward(ctx, cfg, kube, t.namespace(), stderr); err != nil {
			return nil, err
		}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithPerRPCCredentials(bearer(token)))
	if err != nil {
		stop()
		return nil, err
	}
	return &Conn{Inspect: vsplanev1.NewInspectServiceClient(conn), conn: conn, stop: stop}, nil
}

// errNoToken explains what to do when the kubeconfig has no token.
var errNoToken = errors.New("the kubeconfig's user has no bearer token to send to the control plane " +
	"(client certificates cannot be forwarded): pass --token, e.g. --token=$(kubectl create token SERVICEACCOUNT -n NAMESPACE) " +
	"for a ServiceAccount bound to the vsplane-inspector ClusterRole")

// BearerToken returns the token the kubeconfig's credentials send to the
// API server: a static token, a token file, or what an exec or auth-provider
// plugin returns. It asks client-go's own transport wrappers, so every kind
// of credential is handled as kubectl handles it.
func BearerToken(cfg *rest.Config) (string, error) {
	var got string
	rt, err := rest.HTTPWrappersForConfig(cfg, roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r.Header.Get("Authorization")
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	}))
	if err != nil {
		return "", fmt.Errorf("kubeconfig credentials: %w", err)
	}
	req, err := http.NewRequest(http.MethodGet, "https://kubeconfig.invalid/", nil)
	if err != nil {
		return "", err
	}
	if _, err := rt.RoundTrip(req); err != nil {
		return "", fmt.Errorf("kubeconfig credentials: %w", err)
	}
	scheme, tok, ok := strings.Cut(got, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", errNoToken
	}
	return tok, nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// caFromConfigMap reads the CA the control plane publishes.
func caFromConfigMap(ctx context.Context, kube kubernetes.Interface, ns string) ([]byte, error) {
	cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, CAConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("no ConfigMap %s/%s with the control plane's CA (an older control plane, or another namespace: -n): pass --certificate-authority FILE", ns, CAConfigMap)
	case err != nil:
		return nil, fmt.Errorf("reading the control plane's CA from ConfigMap %s/%s: %w (or pass --certificate-authority FILE)", ns, CAConfigMap, err)
	}
	ca := cm.Data[CAKey]
	if ca == "" {
		return nil, fmt.Errorf("ConfigMap %s/%s has no %q", ns, CAConfigMap, CAKey)
	}
	return []byte(ca), nil
}

// clientTLS verifies the server's chain against caPEM and serverName
// (never skipped).
func clientTLS(caPEM []byte, serverName string) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the control plane's CA holds no PEM certificate")
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: serverName}, nil
}

// bearer sends a token as "authorization: Bearer ...", over TLS only.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }
