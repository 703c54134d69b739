package kubeenv

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
)

// ClientCertificate signs a client certificate (PEM cert and key) the
// apiserver accepts for user cn in groups orgs: a kubelet's
// (system:node:NAME, system:nodes), an operator's.
func (e *Env) ClientCertificate(cn string, orgs ...string) (cert, key []byte, err error) {
	return e.pki.issueClient(cn, orgs...)
}

// CACert is the PEM CA that signed the apiserver's serving certificate and
// every client certificate (--client-ca-file).
func (e *Env) CACert() []byte { return e.pki.caCert }

// KubeconfigFor renders a kubeconfig for user cn in groups orgs (a client
// certificate of its own) that reaches the apiserver at server (e.g. its
// address as seen from inside the VM test bed).
func (e *Env) KubeconfigFor(server, cn string, orgs ...string) ([]byte, error) {
	cert, key, err := e.ClientCertificate(cn, orgs...)
	if err != nil {
		return nil, err
	}
	return kubeconfig(server, e.pki.caCert, cn, cert, key), nil
}

// startControllers runs kube-controller-manager and kube-scheduler against
// the running apiserver and returns once the controller manager has
// published kube-root-ca.crt (its controllers run).
func (e *Env) startControllers(ctx context.Context, opts Options, files pkiFiles) error {
	write := func(name, cn string) (string, error) {
		kc, err := e.KubeconfigFor(e.Host, cn)
		if err != nil {
			return "", err
		}
		f := filepath.Join(e.Dir, name)
		return f, os.WriteFile(f, kc, 0o600)
	}
	kcmConfig, err := write("kube-controller-manager.kubeconfig", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	schedConfig, err := write("kube-scheduler.kubeconfig", "system:kube-scheduler")
	if err != nil {
		return err
	}
	kcmArgs := []string{
		"--kubeconfig=" + kcmConfig,
		"--authentication-kubeconfig=" + kcmConfig,
		"--authorization-kubeconfig=" + kcmConfig,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--root-ca-file=" + files.ca,
		"--service-account-private-key-file=" + files.saKey,
		"--use-service-account-credentials=true",
		"--service-cluster-ip-range=" + opts.ServiceCIDR,
	}
	if opts.ClusterCIDR != "" {
		mask := opts.NodeCIDRMaskSize
		if mask == 0 {
			mask = 24
		}
		kcmArgs = append(kcmArgs, "--allocate-node-cidrs=true", "--cluster-cidr="+opts.ClusterCIDR,
			"--node-cidr-mask-size="+strconv.Itoa(mask))
	}
	kcm, err := e.spawn(filepath.Join(e.BinDir, "kube-controller-manager"), "kube-controller-manager", kcmArgs...)
	if err != nil {
		return err
	}
	if _, err := e.spawn(filepath.Join(e.BinDir, "kube-scheduler"), "kube-scheduler",
		"--kubeconfig="+schedConfig,
		"--authentication-kubeconfig="+schedConfig,
		"--authorization-kubeconfig="+schedConfig,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
	); err != nil {
		return err
	}
	if err := awaitReady(ctx, kcm, e.Host+"/api/v1/namespaces/default/configmaps/kube-root-ca.crt", e.hc, func([]byte) bool { return true }); err != nil {
		return err
	}
	e.log.Debug("controllers ready")
	return nil
}

// writeKubeletClient writes the apiserver's kubelet client certificate and
// returns the flags that use it.
func writeKubeletClient(dir string, p *pki) ([]string, error) {
	cert, key, err := p.issueClient("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	cf, kf := filepath.Join(dir, "apiserver-kubelet-client.crt"), filepath.Join(dir, "apiserver-kubelet-client.key")
	if err := os.WriteFile(cf, cert, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(kf, key, 0o600); err != nil {
		return nil, err
	}
	return []string{"--kubelet-client-certificate=" + cf, "--kubelet-client-key=" + kf,
		"--kubelet-preferred-address-types=InternalIP"}, nil
}

// writeEgressConfig writes an EgressSelectorConfiguration sending the
// apiserver's "cluster" traffic (kubelets, Pods, Services) through the HTTP
// CONNECT proxy listening on the unix socket sock.
func writeEgressConfig(dir, sock string) (string, error) {
	if !filepath.IsAbs(sock) {
		return "", fmt.Errorf("kubeenv: EgressProxySocket %q is not an absolute path", sock)
	}
	f := filepath.Join(dir, "egress-selector.yaml")
	cfg := `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: ` + sock + `
`
	return f, os.WriteFile(f, []byte(cfg), 0o600)
}

// firstServiceIP is the ClusterIP of Service default/kubernetes: the first
// address of the Service range.
func firstServiceIP(cidr string) (net.IP, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, err
	}
	return net.IP(p.Masked().Addr().Next().AsSlice()), nil
}
