package config

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/vsplane/vsplane/internal/wire"
)

// CommandLine is vsplane-controlplane's parsed command line: the
// configuration the file and the flags over it give, and the settings that
// are flags only.
//
// The flags-only settings are the replica's deployment wiring: where the
// Secret and the token are mounted, the ServiceAccounts and the Lease the
// manifests create, how the replicas find each other, and the switches of
// local development. They stay out of the file, which holds what an
// operator tunes (deploy/'s args name them, and a flag given overrides the
// file: see e2e/integration TestDeployConfigFiles).
type CommandLine struct {
	// Loaded is the defaults, the file over them and the flags given over
	// the file; valid.
	Loaded *Loaded
	// Source is where Loaded came from, for the Reloader.
	Source Source
	// ConfigFile is --config ("": none); ConfigCheckInterval is
	// --config-check-interval (<= 0: DefaultCheckInterval).
	ConfigFile          string
	ConfigCheckInterval time.Duration
	// Overridden names the flags given that the file can also set (they
	// won over it), for the log.
	Overridden []string

	// Kubeconfig is --kubeconfig ("": the in-cluster configuration).
	Kubeconfig string
	// TLS is the serving certificate and how peers are verified.
	TLS TLSFiles
	// PeerTokenFile is --peer-token-file: the token presented to peers.
	PeerTokenFile string
	// CAConfigMap is --ca-configmap (namespace/name, checked when set;
	// "": none): where the replica publishes TLS.CAFile for clients.
	CAConfigMap string
	// AgentServiceAccounts are --agent-service-account's namespace/name
	// pairs (checked unless InsecurePlaintext).
	AgentServiceAccounts []string
	// InsecurePlaintext is --insecure-plaintext: no TLS, no agent
	// authentication, no inspection authorization (loopback only).
	InsecurePlaintext bool
	// Rollouts is --rollouts; RolloutLease is --rollout-lease
	// (namespace/name, checked when Rollouts).
	Rollouts     bool
	RolloutLease string
	// AdvertiseAddress is --advertise-address ("": PodIP and the gRPC
	// listener's port, when PodIP is set); PodIP is $POD_IP.
	AdvertiseAddress string
	PodIP            string
	// Peers are --peers' addresses; PeerService is --peer-service
	// (namespace/name, checked when set).
	Peers       []string
	PeerService string
	// Debug is --debug.
	Debug bool
}

// TLSFiles are the files of the replica's TLS (internal/tlsfiles).
type TLSFiles struct {
	// CertFile and KeyFile are the serving certificate, reloaded when
	// they change (--tls-cert-file, --tls-key-file).
	CertFile, KeyFile string
	// CAFile and ServerName verify peer replicas (--tls-ca-file,
	// --tls-server-name).
	CAFile, ServerName string
}

// ParseCommandLine registers vsplane-controlplane's flags on fs, parses
// args (without the program name), reads --config with the flags given
// over it and validates: what vsplane-controlplane's main does before it
// starts anything. getenv supplies $POD_IP. With a flag.ExitOnError fs
// (the binary's flag.CommandLine) a bad flag or -h exits as the flag
// package does; every other problem is an error naming the flag or the
// file's field. Arguments after the flags are ignored.
func ParseCommandLine(fs *flag.FlagSet, args []string, getenv func(string) string) (*CommandLine, error) {
	cl := CommandLine{PodIP: getenv("POD_IP")}
	var serviceAccounts, peers string
	fs.StringVar(&cl.ConfigFile, "config", "", "configuration file: a VsplaneConfiguration (config.vsplane.io/v1alpha1) or a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1), YAML or JSON. Precedence: a flag given on the command line > the file > the defaults. The file is checked every --config-check-interval: a valid new version's fleet settings (ipvs, masquerade*, clusterCIDRs, nodePortAddresses, agentReconcilePeriod) are pushed to every node without a restart; an invalid one is logged and not applied; changed controlPlane settings need a restart")
	fs.DurationVar(&cl.ConfigCheckInterval, "config-check-interval", DefaultCheckInterval, "how often --config is read for changes")
	fs.StringVar(&cl.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&cl.TLS.CertFile, "tls-cert-file", "/etc/vsplane/tls/tls.crt", "serving certificate (PEM) of the gRPC listener; reloaded when it changes")
	fs.StringVar(&cl.TLS.KeyFile, "tls-key-file", "/etc/vsplane/tls/tls.key", "its private key (PEM)")
	fs.StringVar(&cl.TLS.CAFile, "tls-ca-file", "/etc/vsplane/tls/ca.crt", "CA bundle (PEM) to verify peer replicas with")
	fs.StringVar(&cl.TLS.ServerName, "tls-server-name", wire.DefaultServerName, "name in the replicas' certificate, verified when calling peers")
	fs.StringVar(&cl.CAConfigMap, "ca-configmap", "vsplane-system/vsplane-controlplane-ca", "namespace/name of the ConfigMap the replicas keep --tls-ca-file's bundle in (key ca.crt) for clients such as kubectl vsplane; \"\" to publish nothing")
	fs.StringVar(&cl.PeerTokenFile, "peer-token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token", "token this replica presents to its peers (needs get inspection.vsplane.io)")
	fs.StringVar(&serviceAccounts, "agent-service-account", "vsplane-system/vsplane-agent", "comma-separated namespace/name of the ServiceAccounts agents run as")
	fs.BoolVar(&cl.InsecurePlaintext, "insecure-plaintext", false, "local development only: no TLS, no agent authentication, no inspection authorization; --listen must be a loopback address")
	fs.BoolVar(&cl.Rollouts, "rollouts", true, "watch SchedulerRollouts (vsplane.io/v1alpha1; the CRD must be installed) and take part in electing their leader")
	fs.StringVar(&cl.RolloutLease, "rollout-lease", "vsplane-system/vsplane-rollout-leader", "namespace/name of the Lease the replicas elect the rollout leader with")
	fs.StringVar(&cl.AdvertiseAddress, "advertise-address", "", "this replica's gRPC address as the other replicas reach it (default: $POD_IP and the --listen port)")
	fs.StringVar(&peers, "peers", "", "comma-separated gRPC addresses of the other replicas (static; see --peer-service)")
	fs.StringVar(&cl.PeerService, "peer-service", "", "namespace/name of a Service whose EndpointSlices (port \"grpc\") list the replicas, for the fleet-wide inspection view")
	fs.BoolVar(&cl.Debug, "debug", false, "debug logging")
	// The settings a --config file can also hold; Source.Load applies the
	// ones given on the command line over the file.
	flagCfg := Defaults()
	Bind(fs, &flagCfg)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}

	cl.Peers = splitList(peers)
	if !cl.InsecurePlaintext {
		for _, sa := range splitList(serviceAccounts) {
			if strings.Count(sa, "/") != 1 {
				return nil, fmt.Errorf("--agent-service-account %q: want namespace/name", sa)
			}
			cl.AgentServiceAccounts = append(cl.AgentServiceAccounts, sa)
		}
	}
	if ns, name, ok := strings.Cut(cl.RolloutLease, "/"); cl.Rollouts && (!ok || ns == "" || name == "") {
		return nil, fmt.Errorf("--rollout-lease %q: want namespace/name", cl.RolloutLease)
	}
	if ns, name, ok := strings.Cut(cl.CAConfigMap, "/"); cl.CAConfigMap != "" && (!ok || ns == "" || name == "" || strings.Contains(name, "/")) {
		return nil, fmt.Errorf("--ca-configmap %q: want namespace/name", cl.CAConfigMap)
	}
	if cl.PeerService != "" && strings.Count(cl.PeerService, "/") != 1 {
		return nil, fmt.Errorf("--peer-service %q: want namespace/name", cl.PeerService)
	}

	cl.Source = Source{Path: cl.ConfigFile, Flags: fs}
	loaded, err := cl.Source.Load()
	if err != nil {
		return nil, err
	}
	cl.Loaded, cl.Overridden = loaded, Explicit(fs)
	return &cl, nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
