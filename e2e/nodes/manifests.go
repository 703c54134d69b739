package nodes

import _ "embed"

// CoreDNSManifest is the cluster DNS of the real nodes: kubeadm's CoreDNS
// Deployment (two replicas) behind the kube-dns Service at ClusterDNS.
//
//go:embed manifests/coredns.yaml
var CoreDNSManifest []byte
