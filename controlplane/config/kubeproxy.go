package config

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vsplane/vsplane/internal/configfile"
)

// KubeProxyConfiguration is the part of kube-proxy's configuration file
// (kubeproxy.config.k8s.io/v1alpha1) that vsplane reads: its IPVS-mode
// settings. The rest of the file is accepted and, where set, named in a
// warning (see Decode). Written here rather than imported from
// k8s.io/kube-proxy to keep that module (and component-base) out.
type KubeProxyConfiguration struct {
	metav1.TypeMeta `json:",inline"`
	Mode            string                     `json:"mode"`
	IPVS            kubeProxyIPVSConfiguration `json:"ipvs"`
	IPTables        struct {
		MasqueradeAll bool   `json:"masqueradeAll"`
		MasqueradeBit *int32 `json:"masqueradeBit"`
	} `json:"iptables"`
	// MasqueradeAll is where newer kube-proxy versions also accept it
	// (top level and linux.masqueradeAll); any of the three turns it on.
	MasqueradeAll bool `json:"masqueradeAll"`
	Linux         struct {
		MasqueradeAll bool `json:"masqueradeAll"`
	} `json:"linux"`
	// ClusterCIDR is comma-separated (dual-stack: one per family).
	ClusterCIDR       string                   `json:"clusterCIDR"`
	NodePortAddresses []string                 `json:"nodePortAddresses"`
	DetectLocalMode   string                   `json:"detectLocalMode"`
	DetectLocal       DetectLocalConfiguration `json:"detectLocal"`
	Conntrack         kubeProxyConntrack       `json:"conntrack"`
}

// kubeProxyConntrack is kube-proxy's conntrack; nil fields take kube-proxy's
// defaults (SetDefaults_KubeProxyConfiguration).
type kubeProxyConntrack struct {
	MaxPerCore            *int32           `json:"maxPerCore"`
	Min                   *int32           `json:"min"`
	TCPEstablishedTimeout *metav1.Duration `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   *metav1.Duration `json:"tcpCloseWaitTimeout"`
	TCPBeLiberal          bool             `json:"tcpBeLiberal"`
	UDPTimeout            metav1.Duration  `json:"udpTimeout"`
	UDPStreamTimeout      metav1.Duration  `json:"udpStreamTimeout"`
}

// kube-proxy's conntrack defaults (v1.37).
const (
	kubeProxyConntrackMaxPerCore = 32 * 1024
	kubeProxyConntrackMin        = 128 * 1024
	kubeProxyTCPEstablished      = 24 * time.Hour
	kubeProxyTCPCloseWait        = time.Hour
)

// conntrack maps ct with kube-proxy's defaults for what it leaves out.
func (ct kubeProxyConntrack) conntrack() ConntrackConfiguration {
	out := ConntrackConfiguration{MaxPerCore: kubeProxyConntrackMaxPerCore, Min: kubeProxyConntrackMin,
		TCPEstablishedTimeout: metav1.Duration{Duration: kubeProxyTCPEstablished},
		TCPCloseWaitTimeout:   metav1.Duration{Duration: kubeProxyTCPCloseWait},
		TCPBeLiberal:          ct.TCPBeLiberal, UDPTimeout: ct.UDPTimeout, UDPStreamTimeout: ct.UDPStreamTimeout}
	if ct.MaxPerCore != nil {
		out.MaxPerCore = *ct.MaxPerCore
	}
	if ct.Min != nil {
		out.Min = *ct.Min
	}
	if ct.TCPEstablishedTimeout != nil {
		out.TCPEstablishedTimeout = *ct.TCPEstablishedTimeout
	}
	if ct.TCPCloseWaitTimeout != nil {
		out.TCPCloseWaitTimeout = *ct.TCPCloseWaitTimeout
	}
	return out
}

type kubeProxyIPVSConfiguration struct {
	Scheduler     string          `json:"scheduler"`
	ExcludeCIDRs  []string        `json:"excludeCIDRs"`
	StrictARP     bool            `json:"strictARP"`
	TCPTimeout    metav1.Duration `json:"tcpTimeout"`
	TCPFinTimeout metav1.Duration `json:"tcpFinTimeout"`
	UDPTimeout    metav1.Duration `json:"udpTimeout"`
}

// kubeProxySupported are the paths vsplane reads from a
// KubeProxyConfiguration; every other field set to a non-zero value is
// reported as not supported.
var kubeProxySupported = []string{
	"apiVersion", "kind", "mode",
	"ipvs.scheduler", "ipvs.excludeCIDRs", "ipvs.strictARP", "ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout",
	"iptables.masqueradeAll", "iptables.masqueradeBit", "masqueradeAll", "linux.masqueradeAll",
	"clusterCIDR", "nodePortAddresses", "detectLocalMode", "detectLocal.bridgeInterface", "detectLocal.interfaceNamePrefix",
	"conntrack.maxPerCore", "conntrack.min", "conntrack.tcpEstablishedTimeout", "conntrack.tcpCloseWaitTimeout",
	"conntrack.tcpBeLiberal", "conntrack.udpTimeout", "conntrack.udpStreamTimeout",
}

// toVsplane maps kp's IPVS-mode settings onto the defaults. The process
// settings (controlPlane) keep their defaults: kube-proxy's addresses and
// sync periods are a node proxy's, not a control plane's.
func (kp *KubeProxyConfiguration) toVsplane() (VsplaneConfiguration, error) {
	if kp.Mode != "" && kp.Mode != "ipvs" {
		return VsplaneConfiguration{}, fmt.Errorf("%s: mode %q: vsplane implements kube-proxy's IPVS mode; want \"ipvs\" (or empty)", KubeProxyKind, kp.Mode)
	}
	c := Defaults()
	if kp.IPVS.Scheduler != "" {
		c.IPVS.Scheduler = kp.IPVS.Scheduler
	}
	c.IPVS.TCPTimeout, c.IPVS.TCPFinTimeout, c.IPVS.UDPTimeout = kp.IPVS.TCPTimeout, kp.IPVS.TCPFinTimeout, kp.IPVS.UDPTimeout
	c.IPVS.StrictARP = kp.IPVS.StrictARP
	c.IPVS.ExcludeCIDRs = slices.Clone(kp.IPVS.ExcludeCIDRs)
	c.MasqueradeAll = kp.MasqueradeAll || kp.IPTables.MasqueradeAll || kp.Linux.MasqueradeAll
	if kp.IPTables.MasqueradeBit != nil {
		c.MasqueradeBit = *kp.IPTables.MasqueradeBit
	}
	for _, s := range strings.Split(kp.ClusterCIDR, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.ClusterCIDRs = append(c.ClusterCIDRs, s)
		}
	}
	c.NodePortAddresses = slices.Clone(kp.NodePortAddresses)
	c.DetectLocalMode, c.DetectLocal = kp.DetectLocalMode, kp.DetectLocal
	c.Conntrack = kp.Conntrack.conntrack()
	return c, nil
}

// kubeProxyUnsupported returns the paths of the fields of the JSON
// document j that are set (not null, false, 0, "", "0s", [] or {}) and
// that vsplane does not read, sorted.
func kubeProxyUnsupported(j []byte) []string {
	var doc any
	if err := json.Unmarshal(j, &doc); err != nil {
		return nil
	}
	var out []string
	var walk func(v any, path string)
	walk = func(v any, path string) {
		if slices.Contains(kubeProxySupported, path) {
			return
		}
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(e, configfile.JoinPath(path, k))
			}
			return
		case []any:
			if len(v) == 0 {
				return
			}
		case nil:
			return
		case bool:
			if !v {
				return
			}
		case float64:
			if v == 0 {
				return
			}
		case string:
			if d, err := time.ParseDuration(v); v == "" || v == "0" || (err == nil && d == 0) {
				return
			}
		}
		out = append(out, path)
	}
	walk(doc, "")
	slices.Sort(out)
	return out
}
