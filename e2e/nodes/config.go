package nodes

import (
	"bytes"
	"fmt"
	"net/netip"
	"text/template"
)

// Paths inside a node's own mount namespace: every node has the standard
// ones, each a tmpfs of its own (see nodeSetup).
const (
	containerdConfig = "/etc/containerd/config.toml"
	containerdSocket = "/run/containerd/containerd.sock"
	kubeletConfig    = "/etc/kubernetes/kubelet.yaml"
	kubeletKubecfg   = "/etc/kubernetes/kubelet.kubeconfig"
	kubeProxyKubecfg = "/etc/kubernetes/kube-proxy.kubeconfig"
	clusterCAFile    = "/etc/kubernetes/ca.crt"
	nodeResolvConf   = "/etc/kubernetes/resolv.conf"
	cniConfig        = "/etc/cni/net.d/10-vsplane-testbed.conflist"
)

// Cluster-wide settings every node's kubelet gets.
const (
	ClusterDomain = "cluster.local"
	// ClusterDNS is the kube-dns Service's ClusterIP (the 10th address of
	// the Service range, as kubeadm picks).
	ClusterDNS = "198.18.0.10"
	// PauseImage is the sandbox image (the kubelet's default for v1.37.2).
	PauseImage = "registry.k8s.io/pause:3.10.2"
)

// containerd 2.x (config version 3): the CRI plugin with runc through the
// v2 shim and the cgroupfs driver (no systemd in the VM), the pinned sandbox
// image (nothing can be pulled: there is no registry), CNI from the disk.
var containerdTmpl = template.Must(template.New("containerd").Parse(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "{{.Socket}}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{{.Runtime}}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{{.Pause}}"
`))

// The kubelet as kind runs it on a tmpfs root without systemd: cgroupfs,
// swap tolerated, image GC and disk eviction off (the "disk" is memory);
// its pods under the node's own cgroup root, so two kubelets share one
// kernel. Webhook authentication and authorization against the apiserver,
// which reaches it with its kubelet client certificate. The crash-loop
// back-off stops at 20 s (KubeletCrashLoopBackOffMax, beta and on since
// v1.35) instead of 5 minutes: the tests kill vsplane's processes again and
// again, and a long soak's schedule would fall minutes behind.
var kubeletTmpl = template.Must(template.New("kubelet").Parse(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: {{.CA}}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /{{.CgroupRoot}}
clusterDNS: [{{.DNS}}]
clusterDomain: {{.Domain}}
containerRuntimeEndpoint: unix://{{.Socket}}
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
resolvConf: {{.ResolvConf}}
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
nodeStatusReportFrequency: 10s
podPidsLimit: 4096
crashLoopBackOff: {maxContainerRestartPeriod: 20s}
`))

// CNI: point-to-point veths (every Pod's traffic crosses its node's IP
// stack, as with Calico, so IPVS sees replies) from the node's Pod range,
// hostPort through portmap.
var cniTmpl = template.Must(template.New("cni").Parse(`{
  "cniVersion": "1.0.0",
  "name": "vsplane-testbed",
  "plugins": [
    {"type": "ptp", "mtu": 1500,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/var/lib/cni/networks"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`))

func render(t *template.Template, data any) ([]byte, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return nil, fmt.Errorf("render %s: %w", t.Name(), err)
	}
	return b.Bytes(), nil
}

func containerdConfigFor() ([]byte, error) {
	return render(containerdTmpl, map[string]string{"Socket": containerdSocket, "Runtime": ociRuntime, "Pause": PauseImage})
}

func kubeletConfigFor(cgroupRoot string) ([]byte, error) {
	return render(kubeletTmpl, map[string]string{"CA": clusterCAFile, "CgroupRoot": cgroupRoot, "DNS": ClusterDNS,
		"Domain": ClusterDomain, "Socket": containerdSocket, "ResolvConf": nodeResolvConf})
}

func cniConfigFor(podCIDR string) ([]byte, error) {
	p, err := netip.ParsePrefix(podCIDR)
	if err != nil || !p.Addr().Is4() {
		return nil, fmt.Errorf("pod CIDR %q: want an IPv4 prefix", podCIDR)
	}
	return render(cniTmpl, map[string]string{"PodCIDR": p.Masked().String()})
}
