package app

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vsplane/vsplane/controlplane/auth"
	"github.com/vsplane/vsplane/internal/bearer"
	"github.com/vsplane/vsplane/internal/tlsfiles"
)

// Security is what a replica needs to serve off loopback: its serving
// certificate, the ServiceAccounts its agents run as, and how it calls its
// peers. New builds from it the TLS configuration, the agents'
// authentication (TokenReview), the inspection callers' authorization
// (TokenReview, SubjectAccessReview) and the peers' credentials.
type Security struct {
	// CertFile and KeyFile are the serving certificate (PEM), reloaded when
	// they change.
	CertFile, KeyFile string
	// AgentServiceAccounts ("namespace/name") are the ServiceAccounts agents
	// run as.
	AgentServiceAccounts []string
	// CAFile and ServerName verify peer replicas; PeerTokenFile is the token
	// presented to them (it needs get inspection.vsplane.io). Used only with
	// peers (Config.Peers or PeerService).
	CAFile, ServerName string
	PeerTokenFile      string
	// CAConfigMap ("namespace/name", "" for none) is the ConfigMap the
	// replica keeps CAFile's bundle in (key ca.crt), for clients that may
	// not read the serving Secret (cabundle.go).
	CAConfigMap string
}

// protobuf is the typed client's encoding: about half the watch bytes of
// JSON (measured by e2e/apicost). The dynamic client keeps JSON (CRDs have
// no protobuf encoding).
const protobuf = "application/vnd.kubernetes.protobuf"

// buildClients fills in the parts of cfg that New builds: from cfg.REST
// the API clients not given (Kube, Dynamic for Rollouts), and from
// cfg.Security the TLS configuration, the reviews' client and the peers'
// credentials, where cfg does not give them already.
func buildClients(cfg *Config) error {
	var typed *rest.Config
	if cfg.REST != nil {
		base := rest.CopyConfig(cfg.REST)
		if cfg.KubeAPIQPS > 0 {
			base.QPS, base.Burst = float32(cfg.KubeAPIQPS), int(cfg.KubeAPIQPS*2)
		}
		typed = rest.CopyConfig(base)
		typed.ContentType = protobuf
		typed.AcceptContentTypes = protobuf + ",application/json"
		if cfg.Kube == nil {
			kube, err := kubernetes.NewForConfig(typed)
			if err != nil {
				return fmt.Errorf("controlplane: API client: %w", err)
			}
			cfg.Kube = kube
		}
		if cfg.Rollouts && cfg.Dynamic == nil {
			dyn, err := dynamic.NewForConfig(base)
			if err != nil {
				return fmt.Errorf("controlplane: dynamic API client: %w", err)
			}
			cfg.Dynamic = dyn
		}
	}
	sec := cfg.Security
	if sec == nil {
		return nil
	}
	if cfg.TLS == nil {
		srv, err := tlsfiles.NewServer(sec.CertFile, sec.KeyFile)
		if err != nil {
			return fmt.Errorf("%w (or --insecure-plaintext for local development)", err)
		}
		cfg.TLS = srv.Config()
	}
	if cfg.AgentAuth == nil || cfg.InspectAuth == nil {
		// Reviews go through a client of their own (config's AuthAPIQPS),
		// so they and the replica's own requests do not queue behind each
		// other.
		reviews := cfg.Kube
		if typed != nil {
			rc := rest.CopyConfig(typed)
			if cfg.AuthAPIQPS > 0 {
				rc.QPS, rc.Burst = float32(cfg.AuthAPIQPS), int(cfg.AuthAPIQPS*2)
			}
			kube, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return fmt.Errorf("controlplane: review API client: %w", err)
			}
			reviews = kube
		}
		if reviews == nil {
			return errors.New("controlplane: Security needs an API client (Kube or REST)")
		}
		if cfg.AgentAuth == nil {
			cfg.AgentAuth = auth.NewAgents(reviews, sec.AgentServiceAccounts...).Node
		}
		if cfg.InspectAuth == nil {
			cfg.InspectAuth = auth.NewInspectors(reviews).Authorize
		}
	}
	if (len(cfg.Peers) > 0 || cfg.PeerService != "") && len(cfg.PeerDialOptions) == 0 {
		cli, err := tlsfiles.NewClient(sec.CAFile, sec.ServerName)
		if err != nil {
			return fmt.Errorf("peers: %w", err)
		}
		cfg.PeerDialOptions = []grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(cli.Config())),
			grpc.WithPerRPCCredentials(bearer.File{Path: sec.PeerTokenFile}),
		}
	}
	return nil
}
