package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/e2e/nodes"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/tlsfiles"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// InspectorAccount is the ServiceAccount (namespace default) the real
// cluster's inspection calls run as, bound to the vsplane-inspector
// ClusterRole of deploy/base/rbac.yaml: an operator's identity.
const InspectorAccount = "vsplane-inspector"

// ControlPlanePort is the replicas' gRPC port (the base's listenAddress).
const ControlPlanePort = 18000

// InspectorTokenFile returns a file holding a token of InspectorAccount
// (created, with its ClusterRoleBinding, on first use).
func (c *RealCluster) InspectorTokenFile(ctx context.Context) (string, error) {
	c.inspectMu.Lock()
	defer c.inspectMu.Unlock()
	if c.inspectorToken != "" {
		return c.inspectorToken, nil
	}
	if _, err := c.Kube.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: InspectorAccount}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	if _, err := c.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: InspectorAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "vsplane-inspector"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: InspectorAccount, Namespace: "default"}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	exp := int64(tokenSeconds)
	tok, err := c.Kube.CoreV1().ServiceAccounts("default").CreateToken(ctx, InspectorAccount,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s: %w", InspectorAccount, err)
	}
	f := filepath.Join(c.workDir, "inspector.token")
	if err := os.WriteFile(f, []byte(tok.Status.Token), 0o600); err != nil {
		return "", err
	}
	c.inspectorToken = f
	return f, nil
}

// ProxyAddr is the host address of the VM's HTTP CONNECT proxy: what a
// host-side client (grpcurl with HTTPS_PROXY=http://ADDR) goes through to
// reach node and Pod addresses.
func (c *RealCluster) ProxyAddr() string { return c.VM.HostFwdAddr(nodes.ProxyPort) }

// Inspect returns an InspectService client of the replica on the node at
// ip (answers are fleet-wide unless a request scopes them), over TLS
// verified against the CA of the Secret vsplane-controlplane-tls, as
// InspectorAccount, through the VM's CONNECT proxy. Connections are kept
// per address and reconnect by themselves.
func (c *RealCluster) Inspect(ctx context.Context, ip string) (vsplanev1.InspectServiceClient, error) {
	tokenFile, err := c.InspectorTokenFile(ctx)
	if err != nil {
		return nil, err
	}
	c.inspectMu.Lock()
	defer c.inspectMu.Unlock()
	if conn := c.inspectConns[ip]; conn != nil {
		return vsplanev1.NewInspectServiceClient(conn), nil
	}
	cli, err := tlsfiles.NewClient(c.TLS.CA, wire.DefaultServerName)
	if err != nil {
		return nil, err
	}
	proxy := c.ProxyAddr()
	conn, err := grpc.NewClient("passthrough:///"+net.JoinHostPort(ip, fmt.Sprint(ControlPlanePort)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return nodes.DialThroughProxy(ctx, proxy, addr)
		}),
		grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())),
		grpc.WithPerRPCCredentials(bearer.File{Path: tokenFile}))
	if err != nil {
		return nil, err
	}
	if c.inspectConns == nil {
		c.inspectConns = map[string]*grpc.ClientConn{}
	}
	c.inspectConns[ip] = conn
	return vsplanev1.NewInspectServiceClient(conn), nil
}

// ListAgents waits (a minute at most) until the replica on the node at ip
// lists an agent for every node, and returns them.
func (c *RealCluster) ListAgents(ctx context.Context, ip string) ([]*vsplanev1.AgentInfo, error) {
	cli, err := c.Inspect(ctx, ip)
	if err != nil {
		return nil, err
	}
	var last error
	err = c.poll(ctx, time.Minute, func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		resp, err := cli.ListAgents(cctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
		if err != nil {
			last = err
			return false, nil
		}
		if len(resp.GetAgents()) != len(c.Nodes) {
			last = fmt.Errorf("%d agents listed", len(resp.GetAgents()))
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ListAgents through %s: %w (last: %v)", ip, err, last)
	}
	resp, err := cli.ListAgents(ctx, &vsplanev1.ListAgentsRequest{OmitVersions: true})
	return resp.GetAgents(), err
}

// AwaitProgrammed waits until every node's agent acknowledged a desired
// state of Service ns/name whose real servers (weight above 0) are exactly
// ips (ExplainService): what to check before sending traffic, since an
// EndpointSlice's change reaches the kernels a moment after the slice.
func (c *RealCluster) AwaitProgrammed(ctx context.Context, ns, name string, ips []string) error {
	cli, err := c.Inspect(ctx, c.Nodes[0].IP())
	if err != nil {
		return err
	}
	var last string
	err = c.poll(ctx, time.Minute, func() (bool, error) {
		for _, n := range c.Nodes {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			resp, err := cli.ExplainService(cctx, &vsplanev1.ExplainServiceRequest{NodeName: n.Name, Namespace: ns, Name: name})
			cancel()
			if err != nil {
				last = err.Error()
				return false, nil
			}
			if resp.GetAcknowledgement() != vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED || len(resp.GetService().GetVirtualServers()) == 0 {
				last = fmt.Sprintf("%s: %s, %d virtual servers", n.Name, resp.GetAcknowledgement(), len(resp.GetService().GetVirtualServers()))
				return false, nil
			}
			for _, vs := range resp.GetService().GetVirtualServers() {
				var got []string
				for _, r := range vs.GetRealServers() {
					if r.GetWeight() > 0 {
						got = append(got, r.GetAddress())
					}
				}
				slices.Sort(got)
				want := slices.Sorted(slices.Values(ips))
				if !slices.Equal(got, want) {
					last = fmt.Sprintf("%s: %s:%d has %v", n.Name, vs.GetAddress(), vs.GetPort(), got)
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("Service %s/%s with real servers %v on every node: %w (last: %s)", ns, name, ips, err, last)
	}
	return nil
}
