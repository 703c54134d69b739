package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Output formats of -o.
const (
	OutputTable = "table"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

func checkOutput(o string) error {
	switch o {
	case OutputTable, OutputJSON, OutputYAML:
		return nil
	}
	return usagef("unknown output format %q: want table, json or yaml", o)
}

// printData writes v as JSON or YAML (its json tags name the fields).
func printData(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if format == OutputYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// protoJSON is a message in protobuf's canonical JSON, embedded as is.
func protoJSON(m proto.Message) json.RawMessage {
	b, err := protojson.MarshalOptions{UseProtoNames: false}.Marshal(m)
	if err != nil {
		// Only invalid UTF-8 fails; report it in place of the message.
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return b
}

func table(w io.Writer, header string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// age renders how long ago t was, like kubectl's AGE column ("-" if never).
func age(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil || !t.IsValid() || t.AsTime().IsZero() {
		return "-"
	}
	return shortDuration(now.Sub(t.AsTime()))
}

func shortDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func timePtr(t *timestamppb.Timestamp) *time.Time {
	if t == nil || !t.IsValid() {
		return nil
	}
	v := t.AsTime()
	return &v
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ---- status ----

// NodeStatus is one agent in `status` (-o json|yaml: {"nodes": [...]}).
type NodeStatus struct {
	Node             string            `json:"node"`
	Replica          string            `json:"replica"`
	AgentVersion     string            `json:"agentVersion,omitempty"`
	InSync           bool              `json:"inSync"`
	PendingResources uint32            `json:"pendingResources"`
	LagSeconds       float64           `json:"lagSeconds"`
	LastAck          *time.Time        `json:"lastAck,omitempty"`
	Nacks            uint64            `json:"nacks"`
	Nacked           map[string]string `json:"nacked,omitempty"`
	HeldRemoval      *HeldRemoval      `json:"heldRemoval,omitempty"`
	Draining         []Draining        `json:"draining,omitempty"`
	KernelErrors     []string          `json:"kernelErrors,omitempty"`
	Capabilities     Capabilities      `json:"capabilities"`
}

// HeldRemoval is a mass removal the agent holds (AgentStatus.held_removal).
type HeldRemoval struct {
	Removals     uint32     `json:"removals"`
	HeldServices uint32     `json:"heldServices"`
	Since        *time.Time `json:"since,omitempty"`
	Target       string     `json:"target,omitempty"`
}

// Draining is a real server at weight 0 kept while it has connections.
type Draining struct {
	VirtualServer string     `json:"virtualServer"`
	RealServer    string     `json:"realServer"`
	Since         *time.Time `json:"since,omitempty"`
	Active        uint32     `json:"activeConnections"`
	Inactive      uint32     `json:"inactiveConnections"`
}

// Capabilities is what the agent's kernel offers.
type Capabilities struct {
	Schedulers      []string `json:"schedulers,omitempty"`
	IPv6            bool     `json:"ipv6"`
	SCTP            bool     `json:"sctp"`
	Kernel          string   `json:"kernel,omitempty"`
	IPTablesBackend string   `json:"iptablesBackend,omitempty"`
}

// StatusReport is the answer of `status`.
type StatusReport struct {
	Nodes               []NodeStatus `json:"nodes"`
	UnreachableReplicas []string     `json:"unreachableReplicas,omitempty"`
}

// InSync says whether every agent is in sync and every replica answered.
func (r StatusReport) InSync() bool {
	if len(r.UnreachableReplicas) > 0 {
		return false
	}
	for _, n := range r.Nodes {
		if !n.InSync {
			return false
		}
	}
	return true
}

func newNodeStatus(a *vsplanev1.AgentInfo, st *vsplanev1.AgentStatus) NodeStatus {
	c := a.GetCapabilities()
	n := NodeStatus{
		Node: a.GetNodeName(), Replica: a.GetReplica(), AgentVersion: a.GetAgentVersion(),
		PendingResources: a.GetPendingResources(), LagSeconds: a.GetLag().AsDuration().Seconds(),
		LastAck: timePtr(a.GetLastAck()), Nacks: a.GetNacks(), Nacked: a.GetNacked(),
		KernelErrors: st.GetKernelErrors(),
		Capabilities: Capabilities{Schedulers: c.GetIpvsSchedulers(), IPv6: c.GetIpv6(), SCTP: c.GetSctp(),
			Kernel: c.GetKernelVersion(), IPTablesBackend: c.GetIptablesBackend()},
	}
	if h := st.GetHeldRemoval(); h != nil {
		n.HeldRemoval = &HeldRemoval{Removals: h.GetRemovals(), HeldServices: h.GetHeldServices(), Since: timePtr(h.GetSince()), Target: h.GetTarget()}
	}
	n.Draining = drains(st.GetDraining(), func(*vsplanev1.DrainingRealServer) bool { return true })
	n.InSync = n.PendingResources == 0 && len(n.Nacked) == 0 && n.HeldRemoval == nil
	return n
}

func drains(in []*vsplanev1.DrainingRealServer, keep func(*vsplanev1.DrainingRealServer) bool) []Draining {
	var out []Draining
	for _, d := range in {
		if keep(d) {
			out = append(out, Draining{VirtualServer: d.GetVirtualServer(), RealServer: hostPort(d.GetAddress(), d.GetPort()),
				Since: timePtr(d.GetSince()), Active: d.GetActiveConnections(), Inactive: d.GetInactiveConnections()})
		}
	}
	return out
}

func hostPort(addr string, port uint32) string {
	if strings.Contains(addr, ":") {
		return fmt.Sprintf("[%s]:%d", addr, port)
	}
	return fmt.Sprintf("%s:%d", addr, port)
}

func (n NodeStatus) sync() string {
	switch {
	case len(n.Nacked) > 0:
		return fmt.Sprintf("NACKED %d", len(n.Nacked))
	case n.HeldRemoval != nil:
		return "HOLDING REMOVAL"
	case n.PendingResources > 0:
		return fmt.Sprintf("BEHIND %d (%s)", n.PendingResources, shortDuration(time.Duration(n.LagSeconds*float64(time.Second))))
	}
	return "IN SYNC"
}

func (c Capabilities) String() string {
	parts := []string{orDash(strings.Join(c.Schedulers, ","))}
	if c.IPv6 {
		parts = append(parts, "ipv6")
	}
	if c.SCTP {
		parts = append(parts, "sctp")
	}
	if c.IPTablesBackend != "" {
		parts = append(parts, "iptables-"+c.IPTablesBackend)
	}
	if c.Kernel != "" {
		parts = append(parts, "kernel "+c.Kernel)
	}
	return strings.Join(parts, " ")
}

func renderStatus(w io.Writer, format string, r StatusReport, now time.Time) error {
	if format != OutputTable {
		return printData(w, format, r)
	}
	var rows [][]string
	for _, n := range r.Nodes {
		held := "-"
		if h := n.HeldRemoval; h != nil {
			held = fmt.Sprintf("%d/%d", h.Removals, h.HeldServices)
		}
		lastAck := "-"
		if n.LastAck != nil {
			lastAck = shortDuration(now.Sub(*n.LastAck))
		}
		rows = append(rows, []string{n.Node, orDash(n.Replica), n.sync(), lastAck, fmt.Sprint(n.Nacks), held,
			fmt.Sprint(len(n.Draining)), n.Capabilities.String()})
	}
	if err := table(w, "NODE\tREPLICA\tSYNC\tLAST ACK\tNACKS\tHELD\tDRAINING\tCAPABILITIES", rows); err != nil {
		return err
	}
	for _, rep := range r.UnreachableReplicas {
		fmt.Fprintf(w, "replica %s did not answer: its agents are missing above\n", rep)
	}
	return nil
}

// ---- explain ----

// Explanation is `explain` for one node.
type Explanation struct {
	Node                string          `json:"node"`
	Service             string          `json:"service"`
	Version             string          `json:"version"`
	Acknowledgement     string          `json:"acknowledgement"`
	AcknowledgedVersion string          `json:"acknowledgedVersion,omitempty"`
	NackError           string          `json:"nackError,omitempty"`
	Replica             string          `json:"replica,omitempty"`
	Problems            []string        `json:"problems,omitempty"`
	Draining            []Draining      `json:"draining,omitempty"`
	KernelErrors        []string        `json:"kernelErrors,omitempty"`
	Desired             json.RawMessage `json:"desired"`

	state *vsplanev1.ServiceState
}

// Acknowledged says whether the node's agent holds the desired version.
func (e Explanation) Acknowledged() bool {
	return e.Acknowledgement == ackName(vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED)
}

func ackName(s vsplanev1.AcknowledgementState) string {
	return strings.TrimPrefix(s.String(), "ACKNOWLEDGEMENT_STATE_")
}

func newExplanation(r *vsplanev1.ExplainServiceResponse, st *vsplanev1.AgentStatus) Explanation {
	keys := map[string]bool{}
	ports := map[uint32]bool{}
	for _, vs := range r.GetService().GetVirtualServers() {
		if vs.GetNodePortAddresses() {
			ports[vs.GetPort()] = true
		} else {
			keys[vsKey(vs)] = true
		}
	}
	return Explanation{
		Node: r.GetNodeName(), Service: r.GetNamespace() + "/" + r.GetName(), Version: r.GetVersion(),
		Acknowledgement: ackName(r.GetAcknowledgement()), AcknowledgedVersion: r.GetAcknowledgedVersion(),
		NackError: r.GetNackError(), Replica: r.GetReplica(), Problems: r.GetProblems(),
		Draining: drains(st.GetDraining(), func(d *vsplanev1.DrainingRealServer) bool {
			if keys[d.GetVirtualServer()] {
				return true
			}
			_, port, ok := cutLast(d.GetVirtualServer(), ":")
			return ok && ports[parsePort(port)]
		}),
		KernelErrors: st.GetKernelErrors(),
		Desired:      protoJSON(r.GetService()),
		state:        r.GetService(),
	}
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

func parsePort(s string) uint32 {
	var p uint32
	_, _ = fmt.Sscan(s, &p)
	return p
}

// vsKey is the agent's name of a virtual server ("tcp/10.96.0.10:53").
func vsKey(vs *vsplanev1.VirtualServer) string {
	return strings.ToLower(strings.TrimPrefix(vs.GetProtocol().String(), "PROTOCOL_")) + "/" + hostPort(vs.GetAddress(), vs.GetPort())
}

func shortVersion(v string) string {
	if len(v) > 12 {
		return v[:12]
	}
	return orDash(v)
}

// renderExplanations writes one node's explanation in full, several as a
// table (one line per node).
func renderExplanations(w io.Writer, format string, es []Explanation) error {
	if format != OutputTable {
		if len(es) == 1 {
			return printData(w, format, es[0])
		}
		return printData(w, format, map[string][]Explanation{"nodes": es})
	}
	if len(es) == 1 {
		return explainOne(w, es[0])
	}
	var rows [][]string
	for _, e := range es {
		vss, rss, local := 0, 0, 0
		for _, vs := range e.state.GetVirtualServers() {
			vss++
			for _, rs := range vs.GetRealServers() {
				rss++
				if rs.GetLocal() {
					local++
				}
			}
		}
		rows = append(rows, []string{e.Node, e.Acknowledgement, shortVersion(e.Version), shortVersion(e.AcknowledgedVersion),
			fmt.Sprint(vss), fmt.Sprintf("%d (%d local)", rss, local), fmt.Sprint(len(e.Draining)), orDash(e.NackError)})
	}
	return table(w, "NODE\tAGENT\tDESIRED\tACKNOWLEDGED\tVIRTUAL SERVERS\tREAL SERVERS\tDRAINING\tNACK", rows)
}

func explainOne(w io.Writer, e Explanation) error {
	fmt.Fprintf(w, "Service %s on node %s\n", e.Service, e.Node)
	fmt.Fprintf(w, "Desired version:  %s\n", orDash(e.Version))
	fmt.Fprintf(w, "Agent:            %s (acknowledged %s, replica %s)\n", e.Acknowledgement, orDash(e.AcknowledgedVersion), orDash(e.Replica))
	if e.NackError != "" {
		fmt.Fprintf(w, "NACK:             %s\n", e.NackError)
	}
	s := e.state
	if src := s.GetSchedulerSource(); src != "" {
		fmt.Fprintf(w, "Scheduler from:   %s\n", src)
	}
	if s.GetHealthCheckNodePort() != 0 {
		fmt.Fprintf(w, "Health check:     node port %d, %d local IPv4 and %d IPv6 endpoints\n",
			s.GetHealthCheckNodePort(), s.GetLocalEndpoints(), s.GetLocalEndpointsIpv6())
	}
	if s.GetNoLocalEndpointsInternal() || s.GetNoLocalEndpointsExternal() {
		fmt.Fprintf(w, "No local endpoint: internal=%t external=%t\n", s.GetNoLocalEndpointsInternal(), s.GetNoLocalEndpointsExternal())
	}
	fmt.Fprintln(w, "\nVirtual servers (desired; the agent's kernel holds them when acknowledged):")
	var rows [][]string
	for _, vs := range s.GetVirtualServers() {
		addr := vsKey(vs)
		if vs.GetNodePortAddresses() {
			addr = fmt.Sprintf("%s/<node addresses>:%d", strings.ToLower(strings.TrimPrefix(vs.GetProtocol().String(), "PROTOCOL_")), vs.GetPort())
		}
		extra := []string{}
		if vs.GetReject() {
			extra = append(extra, "reject (no local endpoint)")
		}
		if t := vs.GetPersistenceTimeoutSeconds(); t > 0 {
			extra = append(extra, fmt.Sprintf("persistent %ds", t))
		}
		if len(vs.GetSourceRanges()) > 0 {
			extra = append(extra, "from "+strings.Join(vs.GetSourceRanges(), ","))
		}
		rows = append(rows, []string{addr, strings.TrimPrefix(vs.GetKind().String(), "VIRTUAL_SERVER_KIND_"), orDash(vs.GetPortName()),
			orDash(vs.GetScheduler()), strings.TrimPrefix(vs.GetTrafficPolicy().String(), "TRAFFIC_POLICY_"), orDash(strings.Join(extra, "; "))})
		for _, rs := range vs.GetRealServers() {
			rows = append(rows, []string{"  -> " + hostPort(rs.GetAddress(), rs.GetPort()), fmt.Sprintf("weight %d", rs.GetWeight()),
				locality(rs.GetLocal()), endpointState(rs), orDash(rs.GetReason()), ""})
		}
		for _, rs := range vs.GetInClusterRealServers() {
			rows = append(rows, []string{"  -> " + hostPort(rs.GetAddress(), rs.GetPort()), fmt.Sprintf("weight %d", rs.GetWeight()),
				locality(rs.GetLocal()), endpointState(rs), orDash(rs.GetReason()), "in-cluster clients"})
		}
	}
	if err := table(w, "VIRTUAL SERVER\tKIND\tPORT\tSCHEDULER\tPOLICY\tNOTES", rows); err != nil {
		return err
	}
	if len(e.Draining) > 0 {
		fmt.Fprintln(w, "\nDraining in the kernel (reported by the agent):")
		var rows [][]string
		for _, d := range e.Draining {
			rows = append(rows, []string{d.VirtualServer, d.RealServer, fmt.Sprint(d.Active), fmt.Sprint(d.Inactive)})
		}
		if err := table(w, "VIRTUAL SERVER\tREAL SERVER\tACTIVE\tINACTIVE", rows); err != nil {
			return err
		}
	}
	for _, ke := range e.KernelErrors {
		fmt.Fprintf(w, "Kernel error on the node: %s\n", ke)
	}
	for _, p := range e.Problems {
		fmt.Fprintf(w, "Problem: %s\n", p)
	}
	return nil
}

func locality(local bool) string {
	if local {
		return "local"
	}
	return "remote"
}

func endpointState(rs *vsplanev1.RealServer) string {
	var s []string
	if rs.GetReady() {
		s = append(s, "ready")
	}
	if rs.GetServing() && !rs.GetReady() {
		s = append(s, "serving")
	}
	if rs.GetTerminating() {
		s = append(s, "terminating")
	}
	return orDash(strings.Join(s, ","))
}

// ---- rollout ----

// terminalPhases end `rollout status --watch`.
var terminalPhases = []string{"Succeeded", "Failed", "RolledBack", "Aborted"}

// RolloutDone says whether the rollout succeeded and every node it selects
// acknowledged the change.
func rolloutDone(r *vsplanev1.GetRolloutResponse) bool {
	if r.GetPhase() != "Succeeded" {
		return false
	}
	for _, n := range r.GetNodes() {
		if n.GetState() != vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_UPDATED {
			return false
		}
	}
	return true
}

func renderRollout(w io.Writer, format string, r *vsplanev1.GetRolloutResponse) error {
	if format != OutputTable {
		return printData(w, format, protoJSON(r))
	}
	counts := map[vsplanev1.RolloutNodeState]int{}
	for _, n := range r.GetNodes() {
		counts[n.GetState()]++
	}
	fmt.Fprintf(w, "SchedulerRollout %s: scheduler %s, phase %s\n", r.GetName(), r.GetScheduler(), orDash(r.GetPhase()))
	fmt.Fprintf(w, "Services: %s\n", orDash(strings.Join(r.GetServices(), ", ")))
	steps := make([]string, 0, len(r.GetStepNodes()))
	for i, n := range r.GetStepNodes() {
		mark := ""
		if int32(i) == r.GetCurrentStep() {
			mark = "*"
		}
		steps = append(steps, fmt.Sprintf("%d%s:%d nodes", i+1, mark, n))
	}
	fmt.Fprintf(w, "Step %d of %d begun (%s); nodes: %d updated, %d pending, %d failed, %d not reached\n\n",
		r.GetCurrentStep()+1, len(r.GetStepNodes()), orDash(strings.Join(steps, ", ")),
		counts[vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_UPDATED], counts[vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_PENDING],
		counts[vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_FAILED], counts[vsplanev1.RolloutNodeState_ROLLOUT_NODE_STATE_NOT_REACHED])
	var rows [][]string
	for _, n := range r.GetNodes() {
		capable := "no"
		if n.GetCapable() {
			capable = "yes"
		}
		rows = append(rows, []string{n.GetNodeName(), strings.TrimPrefix(n.GetState().String(), "ROLLOUT_NODE_STATE_"), capable, orDash(n.GetReason())})
	}
	return table(w, "NODE\tSTATE\tCAPABLE\tREASON", rows)
}

// ---- snapshot ----

func renderSnapshot(w io.Writer, format string, r *vsplanev1.GetNodeSnapshotResponse) error {
	if format != OutputTable {
		return printData(w, format, protoJSON(r))
	}
	fmt.Fprintf(w, "Node %s, system version %s, %d resources\n\n", r.GetNodeName(), r.GetSystemVersion(), len(r.GetResources()))
	var rows [][]string
	for _, res := range r.GetResources() {
		kind, vss, rss := "node settings", 0, 0
		if s := res.GetService(); s != nil {
			kind = "service"
			for _, vs := range s.GetVirtualServers() {
				vss++
				rss += len(vs.GetRealServers())
			}
		}
		rows = append(rows, []string{res.GetName(), shortVersion(res.GetVersion()), kind, fmt.Sprint(vss), fmt.Sprint(rss),
			fmt.Sprint(len(res.GetService().GetProblems()))})
	}
	return table(w, "NAME\tVERSION\tKIND\tVIRTUAL SERVERS\tREAL SERVERS\tPROBLEMS", rows)
}
