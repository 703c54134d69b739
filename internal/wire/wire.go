// Package wire holds the conventions both planes must agree on beyond the
// proto messages themselves (proto/vsplane/v1 points here): resource names,
// the defaults an agent applies when node/settings leaves a field empty, and
// the kernel operation kinds agents report in Ack.kernel_operations. The
// control plane and the agent import it; neither imports the other.
package wire

import (
	"strings"
	"time"
)

// NodeSettingsResource is the name of the node-wide settings resource.
const NodeSettingsResource = "node/settings"

// ServiceResourcePrefix starts the name of every Service resource:
// "service/<namespace>/<name>".
const ServiceResourcePrefix = "service/"

// ServiceResource returns the resource name of a Service.
func ServiceResource(namespace, name string) string {
	return ServiceResourcePrefix + namespace + "/" + name
}

// IsServiceResource reports whether name names a Service resource.
func IsServiceResource(name string) bool { return strings.HasPrefix(name, ServiceResourcePrefix) }

// DefaultScheduler is the IPVS scheduler of virtual servers that name none
// and of node/settings without default_scheduler (kube-proxy's default).
const DefaultScheduler = "rr"

// DefaultMasqueradeBit is the packet-mark bit requesting SNAT (kube-proxy's
// --iptables-masquerade-bit default).
const DefaultMasqueradeBit = 14

// DefaultReconcilePeriod is the agent's full-reconcile period when neither
// its flag nor node/settings sets one.
const DefaultReconcilePeriod = 30 * time.Second

// DefaultDriftProbeInterval is how often the agent's drift probe runs
// between full reconciles (reconcile.Config.ProbeInterval).
const DefaultDriftProbeInterval = 5 * time.Second

// Kernel operation kinds agents report in Ack.kernel_operations. The control
// plane counts only these (anything else is "other"), so a peer cannot
// create metric series at will.
const (
	OpAddService        = "ipvs_add_service"
	OpUpdateService     = "ipvs_update_service"
	OpDeleteService     = "ipvs_delete_service"
	OpAddDestination    = "ipvs_add_destination"
	OpUpdateDestination = "ipvs_update_destination"
	OpDeleteDestination = "ipvs_delete_destination"
	OpSetTimeouts       = "ipvs_set_timeouts"
	OpCreateDummy       = "dummy_create"
	OpBind              = "addr_bind"
	OpUnbind            = "addr_unbind"
	OpCreateSet         = "ipset_create"
	OpAddEntry          = "ipset_add"
	OpDelEntry          = "ipset_del"
	OpRestore           = "iptables_restore"
	OpSysctl            = "sysctl_set"
)

// OpOther is the metric label of a reported kind that is not one of the above.
const OpOther = "other"

var opKinds = map[string]bool{
	OpAddService: true, OpUpdateService: true, OpDeleteService: true,
	OpAddDestination: true, OpUpdateDestination: true, OpDeleteDestination: true,
	OpSetTimeouts: true, OpCreateDummy: true, OpBind: true, OpUnbind: true,
	OpCreateSet: true, OpAddEntry: true, OpDelEntry: true, OpRestore: true, OpSysctl: true,
}

// KnownOp returns kind if it is a kernel operation kind of this package,
// else OpOther.
func KnownOp(kind string) string {
	if opKinds[kind] {
		return kind
	}
	return OpOther
}

// DefaultServerName is the name in the control plane's TLS certificate that
// agents (and peer replicas) verify, whatever address they dial: the DNS
// name of the control plane's Service in deploy/.
const DefaultServerName = "vsplane-controlplane.vsplane-system.svc"
