package reconcile

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// HealthCheck is one Service's health-check node port (an
// externalTrafficPolicy: Local Service with healthCheckNodePort).
type HealthCheck struct {
	// Resource is the resource name ("service/<ns>/<name>").
	Resource        string
	Namespace, Name string
	Port            uint16
	// LocalEndpoints4 and LocalEndpoints6 count this node's ready endpoints
	// of the Service per family; IPv4 and IPv6 say which families the
	// Service has (on this agent): one health server per family.
	LocalEndpoints4, LocalEndpoints6 int
	IPv4, IPv6                       bool
}

// HealthChecks returns the health-check node ports of the desired
// Services, sorted by resource name. Services that failed to apply are
// included: the answer only depends on their local endpoint count.
func (r *Reconciler) HealthChecks() []HealthCheck {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []HealthCheck
	for name := range r.desired.checks {
		out = append(out, *r.desired.res[name].health)
	}
	slices.SortFunc(out, func(a, b HealthCheck) int { return strings.Compare(a.Resource, b.Resource) })
	return out
}

// NodePortAddresses returns the addresses NodePort markers are expanded
// over (all families, sorted) and whether the settings restrict them with
// node_port_addresses CIDRs (false: every node address, as kube-proxy's
// empty --nodeport-addresses). The addresses are read only while some
// resource has a NodePort marker; otherwise the list is the last one read.
func (r *Reconciler) NodePortAddresses() (addrs []netip.Addr, restricted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range slices.Sorted(maps.Keys(r.nodePort)) {
		addrs = append(addrs, r.nodePort[f]...)
	}
	return addrs, len(r.desired.settings().nodePortCIDRs) > 0
}

// NodeEligible reports whether the node may receive traffic from load
// balancers, as kube-proxy's /healthz decides: the node settings (what the
// agent knows of its Node) have arrived, and they do not say the Node is
// being deleted (node_deleting).
func (r *Reconciler) NodeEligible() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, seen := r.desired.res[SettingsResource]
	return seen && !r.desired.settings().nodeDeleting
}
