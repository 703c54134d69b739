package reconcile

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/rules"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// SettingsResource is the name of the node-wide settings resource.
const SettingsResource = wire.NodeSettingsResource

// setRef is one kernel ipset: a kube-proxy set of one family.
type setRef struct {
	set    rules.Set
	family kernel.Family
}

func (s setRef) name() string       { return s.set.Name(s.family) }
func (s setRef) spec() kernel.IPSet { return s.set.Spec(s.family) }
func (s setRef) String() string     { return s.name() }

// entryKey is one ipset member; comparable, used as a map key.
type entryKey struct {
	set   setRef
	entry kernel.Entry
}

func (e entryKey) String() string { return e.set.name() + " " + e.entry.Format(e.set.set.Type()) }

// desiredVS is one virtual server a resource asks for.
type desiredVS struct {
	vs      kernel.VirtualServer // Scheduler "" means the node default
	dests   []desiredDest        // sorted by key, unique
	binding vsplanev1.AddressBinding
	// nodePort: expanded from a node_port_addresses marker (nodeport.go);
	// an explicit virtual server with the same key wins over it.
	nodePort bool
	// reject: a Local traffic policy without local endpoints; programmed
	// with no destinations so IPVS itself refuses the traffic.
	reject bool
	// inCluster are the real servers of in-cluster clients of an external
	// server under the Local policy (sorted, unique; incluster.go), and
	// inClusterMark the mark of the fwmark server that serves them (0:
	// none, or not assigned yet).
	inCluster     []desiredDest
	inClusterMark uint32
}

// desiredDest is a wanted real server: the kernel.Destination written for
// it, in 32 bytes instead of 56 (no connection counters, the weight checked
// to fit 0..maxWeight): 200k of them at 10k Services of 2 ports × 10
// endpoints.
type desiredDest struct {
	addr    netip.Addr
	port    uint16
	weight  uint16
	forward kernel.ForwardMethod
}

// The weight fits desiredDest.weight (a compile error otherwise).
const _ = uint16(maxWeight)

func newDesiredDest(d kernel.Destination) desiredDest {
	return desiredDest{addr: d.Address, port: d.Port, weight: uint16(d.Weight), forward: d.Forward}
}

// kernel is the destination to write.
func (d desiredDest) kernel() kernel.Destination {
	return kernel.Destination{Address: d.addr, Port: d.port, Weight: int(d.weight), Forward: d.forward}
}

// Key is kernel().Key().
func (d desiredDest) Key() kernel.DestinationKey {
	return kernel.DestinationKey{Address: d.addr.Unmap(), Port: d.port}
}

// vsList is a resource's virtual servers, sorted by key, keys unique. A
// map per resource cost about 1.3 KB for the usual one or two servers (a
// map's smallest table has 8 slots): 13 MB at 10,000 Services.
type vsList []desiredVS

func compareVSKey(d desiredVS, key kernel.VirtualServerKey) int { return d.vs.Key.Compare(key) }

// get returns the virtual server of key.
func (l vsList) get(key kernel.VirtualServerKey) (desiredVS, bool) {
	if i, ok := slices.BinarySearchFunc(l, key, compareVSKey); ok {
		return l[i], true
	}
	return desiredVS{}, false
}

// has reports whether l has a virtual server of key.
func (l vsList) has(key kernel.VirtualServerKey) bool {
	_, ok := slices.BinarySearchFunc(l, key, compareVSKey)
	return ok
}

// sort orders l by key (the keys must be unique).
func (l vsList) sort() {
	slices.SortFunc(l, func(a, b desiredVS) int { return a.vs.Key.Compare(b.vs.Key) })
}

// kernelVS is the server to program, with the default scheduler filled.
// With the mh scheduler the mh-port flag is added, as kube-proxy does
// (hash on source port too), so a default-scheduler change needs no resend.
func (d desiredVS) kernelVS(defaultScheduler string) kernel.VirtualServer {
	vs := d.vs
	if vs.Scheduler == "" {
		vs.Scheduler = defaultScheduler
	}
	if vs.Scheduler == "mh" {
		vs.Flags |= kernel.FlagMHPort
	}
	return vs.Normalize()
}

// conntrackSettings are the compiled conntrack settings (0: leave).
type conntrackSettings struct {
	maxPerCore, min              int
	tcpEstablished, tcpCloseWait int // seconds
	tcpBeLiberal                 bool
	udp, udpStream               int // seconds
}

// settings is the compiled node/settings resource.
type settings struct {
	defaultScheduler string
	timeouts         kernel.Timeouts
	strictARP        bool
	masqueradeAll    bool
	masqueradeBit    uint8
	clusterCIDRs     []netip.Prefix
	// localDetect is how Pod traffic is told (node_settings'
	// local_detect_mode; UNSPECIFIED reads as CLUSTER_CIDR), with the
	// interface of the interface modes; nodePodCIDRs are the node's own
	// (NODE_CIDR detection, and this node's Pods among in-cluster clients).
	localDetect    vsplanev1.LocalDetectMode
	nodePodCIDRs   []netip.Prefix
	localInterface string
	conntrack      conntrackSettings
	excludeCIDRs   []netip.Prefix
	// nodePortCIDRs select the NodePort addresses (empty: all).
	nodePortCIDRs   []netip.Prefix
	reconcilePeriod uint32 // seconds, 0 = agent default
	nodeDeleting    bool
}

func secs(s uint32) time.Duration { return time.Duration(s) * time.Second }

// defaultSettings apply until a node/settings resource arrives.
func defaultSettings() settings {
	return settings{defaultScheduler: wire.DefaultScheduler, masqueradeBit: rules.DefaultMasqueradeBit}
}

// resourceState is one compiled resource.
type resourceState struct {
	name, version string
	vss           vsList
	entries       []entryKey
	settings      *settings
	// problems are content errors found while compiling; the rest of the
	// resource is applied, but it is NACKed and not retried.
	problems []string
	// tmpl holds the node_port_addresses markers and the explicit content;
	// nil when the resource has no marker. vss, entries and problems are
	// then the expansion over the current NodePort addresses (expand).
	tmpl *templates
	// health is the Service's health-check node port (nil: none).
	health *HealthCheck
	// noLocalInternal/External: a Local policy without a local endpoint
	// while the cluster has some (kube-proxy's no_local_endpoints metric).
	noLocalInternal, noLocalExternal bool
}

// maxProblems bounds the messages kept per resource, so a resource with
// very many bad parts cannot blow up its NACK.
const maxProblems = 16

// problemsOmitted ends a list cut at maxProblems.
const problemsOmitted = "further problems omitted"

func (rs *resourceState) problem(format string, args ...any) {
	switch {
	case len(rs.problems) < maxProblems:
		rs.problems = append(rs.problems, fmt.Sprintf(format, args...))
	case len(rs.problems) == maxProblems:
		rs.problems = append(rs.problems, problemsOmitted)
	}
}

// capMessages cuts a resource's messages at maxProblems.
func capMessages(msgs []string) []string {
	if len(msgs) <= maxProblems+1 {
		return msgs
	}
	return append(msgs[:maxProblems:maxProblems], problemsOmitted)
}
