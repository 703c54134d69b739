package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/testpki"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	"github.com/vsplane/vsplane/internal/wire"
)

// The ServiceAccounts of a cluster, as deploy/ names them.
const (
	SystemNamespace     = "vsplane-system"
	AgentServiceAccount = "vsplane-agent"
	ControlPlaneAccount = "vsplane-controlplane"
	tokenSeconds        = 24 * 3600 // tests and demos end long before
	guestCAFile         = "/run/vsplane/ca.crt"
)

// Security is the cluster's TLS and tokens, like a real deployment's: a CA
// and the control plane's certificate (a Secret's files), the control
// plane's own ServiceAccount token (for peers and for inspection here), and
// one projected token per agent, bound to a Pod on its node.
type Security struct {
	Dir        string
	Files      testpki.Files
	ServerName string
	// TokenFile holds the control plane's ServiceAccount token (default
	// audience); the tests use it for inspection as well.
	TokenFile string
}

// setupSecurity writes the PKI and the control plane's token into a fresh
// directory and creates the ServiceAccounts.
func (c *Cluster) setupSecurity(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "vsplane-tls-")
	if err != nil {
		return err
	}
	ca, err := testpki.NewCA("vsplane test CA")
	if err != nil {
		return err
	}
	files, err := ca.WriteServer(dir)
	if err != nil {
		return err
	}
	c.Sec = &Security{Dir: dir, Files: files, ServerName: wire.DefaultServerName, TokenFile: filepath.Join(dir, "controlplane.token")}
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: SystemNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", SystemNamespace, err)
	}
	for _, sa := range []string{AgentServiceAccount, ControlPlaneAccount} {
		if _, err := c.Kube.CoreV1().ServiceAccounts(SystemNamespace).Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ServiceAccount %s: %w", sa, err)
		}
	}
	tok, err := c.token(ctx, ControlPlaneAccount, nil, nil)
	if err != nil {
		return err
	}
	return os.WriteFile(c.Sec.TokenFile, []byte(tok), 0o600)
}

// token requests a token of ServiceAccount sa, for audiences (nil: the API
// server's), bound to pod if set.
func (c *Cluster) token(ctx context.Context, sa string, audiences []string, pod *corev1.Pod) (string, error) {
	exp := int64(tokenSeconds)
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &exp}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	resp, err := c.Kube.CoreV1().ServiceAccounts(SystemNamespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s: %w", sa, err)
	}
	return resp.Status.Token, nil
}

// agentPod is the Pod the agent of node "runs in" (no kubelet here: the
// object only anchors the agent's bound token to the node).
func agentPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: "vsplane-agent-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: AgentServiceAccount,
			Containers: []corev1.Container{{Name: "agent", Image: "vsplane/vsplane-agent"}}},
	}
}

// provisionAgent gives node's agent its credentials inside the VM: the CA
// bundle and a projected token (audience "vsplane") bound to its Pod.
func (c *Cluster) provisionAgent(ctx context.Context, node string) error {
	pod, err := c.Kube.CoreV1().Pods(SystemNamespace).Get(ctx, agentPod(node).Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = c.Kube.CoreV1().Pods(SystemNamespace).Create(ctx, agentPod(node), metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("agent Pod of %s: %w", node, err)
	}
	tok, err := c.token(ctx, AgentServiceAccount, []string{auth.AgentAudience}, pod)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(c.Sec.Files.CA)
	if err != nil {
		return err
	}
	script := fmt.Sprintf("mkdir -p /run/vsplane/%[1]s && printf '%%s' '%[2]s' > %[3]s && printf '%%s' '%[4]s' > /run/vsplane/%[1]s/token",
		node, string(ca), guestCAFile, tok)
	if strings.Contains(string(ca)+tok, "'") {
		return fmt.Errorf("unexpected quote in CA or token")
	}
	_, err = c.VM.RunOK(ctx, script)
	return err
}

// agentSecurityArgs are the agent's TLS and token flags.
func agentSecurityArgs(node string) string {
	return fmt.Sprintf("--tls-ca-file %s --token-file /run/vsplane/%s/token", guestCAFile, node)
}

// DialControlPlane connects to a control-plane address the way an
// inspection client does: TLS verified against the cluster's CA and the
// control plane's token as bearer credentials.
func (c *Cluster) DialControlPlane(addr string) (*grpc.ClientConn, error) {
	cli, err := tlsfiles.NewClient(c.Sec.Files.CA, c.Sec.ServerName)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())),
		grpc.WithPerRPCCredentials(bearer.File{Path: c.Sec.TokenFile}))
}

// GRPCurlArgs are the grpcurl flags that reach the control plane: its CA,
// the name in its certificate, and a bearer token.
func (c *Cluster) GRPCurlArgs() ([]string, error) {
	tok, err := os.ReadFile(c.Sec.TokenFile)
	if err != nil {
		return nil, err
	}
	return []string{"-cacert", c.Sec.Files.CA, "-servername", c.Sec.ServerName, "-H", "authorization: Bearer " + strings.TrimSpace(string(tok))}, nil
}
