package stream

import (
	"maps"
	"sort"
	"sync"
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"
)

// Registry holds the agents connected to this replica, one per node. It is
// safe for concurrent use.
type Registry struct {
	src Source
	clk clock.PassiveClock // for the lag of reports

	mu     sync.Mutex
	byNode map[string]*agentState
}

// agentState is the inspectable part of one stream. Written by the stream's
// goroutine, read by ListAgents; guarded by mu.
type agentState struct {
	// closed when a newer stream for the same node replaces this one.
	replaced chan struct{}

	mu             sync.Mutex
	node           string
	agentVersion   string
	peer           string
	connectedSince time.Time
	capabilities   *vsplanev1.Capabilities
	// sent and ackDiff: what the agent holds once its Deltas apply, and
	// where its acknowledged state differs (acked.go).
	sent    *versionSet
	ackDiff map[string]ackedVersion
	// nacked: name -> the version the agent NACKed and has not applied
	// since, with its error; not resent until the desired version changes.
	// Written by the stream's goroutine under mu; that goroutine reads it
	// without the lock (it is the only writer).
	nacked        map[string]nackedVersion
	nacks         uint64
	lastNackError string
	lastAck       time.Time
	lastApply     time.Duration
	lastOps       map[string]uint32
	lastStatus    *vsplanev1.AgentStatus
	// inSyncAt, if set, is a system version of the node whose desired
	// state acked equals (session.noteInSync): while the node is still at
	// that version nothing is pending. Written by the stream's goroutine
	// under mu, which reads it without the lock.
	inSyncAt string
}

// nackedVersion is a version an agent NACKed and the error it gave.
type nackedVersion struct{ version, message string }

// String is how inspection shows it (AgentInfo.nacked).
func (n nackedVersion) String() string { return n.version + ": " + n.message }

func newRegistry(src Source, clk clock.PassiveClock) *Registry {
	return &Registry{src: src, clk: clk, byNode: map[string]*agentState{}}
}

// register installs st for its node and closes the replaced channel of any
// previous stream of that node. Reports whether one was replaced.
func (r *Registry) register(st *agentState) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	old, ok := r.byNode[st.node]
	if ok {
		close(old.replaced)
	}
	r.byNode[st.node] = st
	return ok
}

// unregister removes st unless a newer stream already took its place.
func (r *Registry) unregister(st *agentState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byNode[st.node] == st {
		delete(r.byNode, st.node)
	}
}

// Len is the number of connected agents.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byNode)
}

// ListAgents returns a copy of every connected agent's info, sorted by node
// name. pending_resources is computed against the Source's current state.
// Without versions, acknowledged_versions and nacked are left out and
// nothing of size O(node size) is copied: at 1,000 agents x 1k Services the
// copies were ~70 MB of garbage per call (e2e/fanout, which polls it).
func (r *Registry) ListAgents(withVersions bool) []*vsplanev1.AgentInfo {
	states := r.sortedStates()
	out := make([]*vsplanev1.AgentInfo, 0, len(states))
	for _, st := range states {
		out = append(out, r.info(st, withVersions))
	}
	return out
}

// ListAgentsPending is ListAgents for a metrics scrape: every connected
// agent's NodeName, and PendingResources and Lag for an agent with pending
// resources. An agent known to be in sync costs O(1) instead of O(node
// size), and no agent's versions are copied.
func (r *Registry) ListAgentsPending() []*vsplanev1.AgentInfo {
	states := r.sortedStates()
	out := make([]*vsplanev1.AgentInfo, 0, len(states))
	for _, st := range states {
		info := &vsplanev1.AgentInfo{NodeName: st.node}
		if res, listed := r.listUnlessInSync(st); listed {
			st.mu.Lock()
			info.PendingResources, info.Lag = r.pendingLocked(st, res)
			st.mu.Unlock()
		}
		out = append(out, info)
	}
	return out
}

// listUnlessInSync returns the node's desired resources (listed), unless
// the agent is recorded in sync with them (nothing pending, no lag) or the
// node is unknown. It takes st.mu only to read that record: the Source has
// locks of its own.
func (r *Registry) listUnlessInSync(st *agentState) (res []Entry, listed bool) {
	st.mu.Lock()
	at := st.inSyncAt
	st.mu.Unlock()
	if r.inSync(st.node, at) {
		return nil, false
	}
	res, _, listed = r.src.List(st.node)
	return res, listed
}

// pendingLocked counts the resources of res (the node's desired state)
// whose acknowledged version differs, plus the acknowledged names res no
// longer has (their removal is not acknowledged yet), and the lag of the
// oldest change among them. st.mu is held.
func (r *Registry) pendingLocked(st *agentState, res []Entry) (uint32, *durationpb.Duration) {
	seen := 0
	var pending uint32
	var oldest time.Time
	for _, e := range res {
		v, ok := st.ackedOf(e.Resource.GetName())
		if ok {
			seen++
		}
		if !ok || v != e.Resource.GetVersion() {
			pending++
			if t := e.Trigger; !t.IsZero() && (oldest.IsZero() || t.Before(oldest)) {
				oldest = t
			}
		}
	}
	pending += uint32(st.ackedLen() - seen)
	if oldest.IsZero() {
		return pending, nil
	}
	return pending, durationpb.New(max(r.clk.Since(oldest), 0))
}

// inSync reports whether the node's desired state is still at version at,
// recorded when the agent's acknowledged state equalled it ("": none): then
// nothing is pending. O(1): a Lookup of no names reads only the version.
func (r *Registry) inSync(node, at string) bool {
	if at == "" {
		return false
	}
	_, sys, ok := r.src.Lookup(node, nil)
	return ok && sys == at
}

// ListAgentsOf is ListAgents for the resources names only: each AgentInfo's
// acknowledged_versions and nacked hold just those names, and pending and
// lag are not computed (O(names) per agent, not O(node size)).
func (r *Registry) ListAgentsOf(names []string) []*vsplanev1.AgentInfo {
	states := r.sortedStates()
	out := make([]*vsplanev1.AgentInfo, 0, len(states))
	for _, st := range states {
		out = append(out, st.baseInfo(names))
	}
	return out
}

// sortedStates snapshots the connected agents, sorted by node name; the
// registry lock is not held while their infos are built.
func (r *Registry) sortedStates() []*agentState {
	r.mu.Lock()
	states := make([]*agentState, 0, len(r.byNode))
	for _, st := range r.byNode {
		states = append(states, st)
	}
	r.mu.Unlock()
	sort.Slice(states, func(i, j int) bool { return states[i].node < states[j].node })
	return states
}

// Agent returns one node's info.
func (r *Registry) Agent(node string) (*vsplanev1.AgentInfo, bool) {
	r.mu.Lock()
	st, ok := r.byNode[node]
	r.mu.Unlock()
	if !ok {
		return nil, false
	}
	return r.info(st, true), true
}

// LastStatus returns the last AgentStatus the node's agent sent (nil if none).
func (r *Registry) LastStatus(node string) *vsplanev1.AgentStatus {
	r.mu.Lock()
	st, ok := r.byNode[node]
	r.mu.Unlock()
	if !ok {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.lastStatus == nil {
		return nil
	}
	return proto.Clone(st.lastStatus).(*vsplanev1.AgentStatus)
}

// baseInfo copies st into an AgentInfo; names, if non-nil, restricts the
// acknowledged and nacked maps to those resources.
func (st *agentState) baseInfo(names []string) *vsplanev1.AgentInfo {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.baseInfoLocked(names)
}

// baseInfoLocked is baseInfo with st.mu held.
func (st *agentState) baseInfoLocked(names []string) *vsplanev1.AgentInfo {
	info := &vsplanev1.AgentInfo{
		NodeName:       st.node,
		AgentVersion:   st.agentVersion,
		Peer:           st.peer,
		ConnectedSince: timestamppb.New(st.connectedSince),
		Nacks:          st.nacks,
		LastNackError:  st.lastNackError,
	}
	if names == nil {
		info.AcknowledgedVersions = st.ackedAll()
		for n, e := range st.nacked {
			if info.Nacked == nil {
				info.Nacked = make(map[string]string, len(st.nacked))
			}
			info.Nacked[n] = e.String()
		}
	} else {
		info.AcknowledgedVersions = map[string]string{}
		for _, n := range names {
			if v, ok := st.ackedOf(n); ok {
				info.AcknowledgedVersions[n] = v
			}
			if e, ok := st.nacked[n]; ok {
				if info.Nacked == nil {
					info.Nacked = map[string]string{}
				}
				info.Nacked[n] = e.String()
			}
		}
	}
	if st.capabilities != nil {
		info.Capabilities = proto.Clone(st.capabilities).(*vsplanev1.Capabilities)
	}
	if !st.lastAck.IsZero() {
		info.LastAck = timestamppb.New(st.lastAck)
		info.LastApplyDuration = durationpb.New(st.lastApply)
		info.LastKernelOperations = maps.Clone(st.lastOps)
	}
	return info
}

// info is st's AgentInfo with pending_resources and lag against the
// Source's current state, computed from the acknowledged versions in place
// (under st.mu, together with the copy withVersions makes).
func (r *Registry) info(st *agentState, withVersions bool) *vsplanev1.AgentInfo {
	res, listed := r.listUnlessInSync(st)
	st.mu.Lock()
	defer st.mu.Unlock()
	names := []string{} // none
	if withVersions {
		names = nil // all
	}
	info := st.baseInfoLocked(names)
	if !withVersions {
		info.AcknowledgedVersions, info.Nacked = nil, nil
	} else if info.AcknowledgedVersions == nil {
		info.AcknowledgedVersions = map[string]string{}
	}
	if listed {
		info.PendingResources, info.Lag = r.pendingLocked(st, res)
	}
	return info
}
