package inspect

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Peers reaches the other replicas of the control plane; *peers.Peers
// satisfies it.
type Peers interface {
	// Self is this replica's advertised address (AgentInfo.replica).
	Self() string
	// Clients returns an InspectService client per other replica.
	Clients() map[string]vsplanev1.InspectServiceClient
}

// peerTimeout bounds the wait for one peer's answer: a replica that does
// not answer in time is reported unreachable instead of holding the caller.
const peerTimeout = 3 * time.Second

// fanOut calls call on every peer in parallel (each bounded by peerTimeout)
// and returns the answers by peer address, and the peers that failed.
func fanOut[T any](ctx context.Context, p Peers, call func(context.Context, vsplanev1.InspectServiceClient) (T, error)) (map[string]T, []string) {
	clients := p.Clients()
	var mu sync.Mutex
	out := map[string]T{}
	var failed []string
	var wg sync.WaitGroup
	for addr, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, peerTimeout)
			defer cancel()
			v, err := call(cctx, c)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if status.Code(err) != codes.NotFound {
					failed = append(failed, addr)
				}
				return
			}
			out[addr] = v
		}()
	}
	wg.Wait()
	slices.Sort(failed)
	return out, failed
}

// fleetWide reports whether a request asks for the whole fleet and there
// are peers to ask.
func (s *Server) fleetWide(scope vsplanev1.Scope) bool {
	return s.peers != nil && scope != vsplanev1.Scope_SCOPE_REPLICA
}

// localAgents is this replica's agents, tagged with its address.
func (s *Server) localAgents(omitVersions bool, versionsOf []string) []*vsplanev1.AgentInfo {
	var infos []*vsplanev1.AgentInfo
	if len(versionsOf) > 0 {
		infos = s.agents.ListAgentsOf(versionsOf)
	} else {
		infos = s.agents.ListAgents(!omitVersions)
	}
	for _, in := range infos {
		in.Replica = s.self()
		if omitVersions { // of versionsOf's (ListAgents left them out)
			in.AcknowledgedVersions, in.Nacked = nil, nil
		}
	}
	return infos
}

func (s *Server) self() string {
	if s.peers == nil {
		return ""
	}
	return s.peers.Self()
}

// mergeAgents keeps one AgentInfo per node: the most recent connection (a
// node moving between replicas can briefly be on two).
func mergeAgents(lists ...[]*vsplanev1.AgentInfo) []*vsplanev1.AgentInfo {
	byNode := map[string]*vsplanev1.AgentInfo{}
	for _, l := range lists {
		for _, in := range l {
			old, ok := byNode[in.GetNodeName()]
			if !ok || in.GetConnectedSince().AsTime().After(old.GetConnectedSince().AsTime()) {
				byNode[in.GetNodeName()] = in
			}
		}
	}
	out := make([]*vsplanev1.AgentInfo, 0, len(byNode))
	for _, n := range slices.Sorted(maps.Keys(byNode)) {
		out = append(out, byNode[n])
	}
	return out
}

// peerNodeStatus asks every peer for node's status and keeps the most
// recent connection's (nil if no peer has the node).
func (s *Server) peerNodeStatus(ctx context.Context, node string) *vsplanev1.GetNodeStatusResponse {
	answers, _ := fanOut(ctx, s.peers, func(ctx context.Context, c vsplanev1.InspectServiceClient) (*vsplanev1.GetNodeStatusResponse, error) {
		return c.GetNodeStatus(ctx, &vsplanev1.GetNodeStatusRequest{NodeName: node, Scope: vsplanev1.Scope_SCOPE_REPLICA})
	})
	var best *vsplanev1.GetNodeStatusResponse
	for _, a := range answers {
		if best == nil || a.GetAgent().GetConnectedSince().AsTime().After(best.GetAgent().GetConnectedSince().AsTime()) {
			best = a
		}
	}
	return best
}

// peerAcknowledgement fills resp's acknowledgement from the peer the node's
// agent is connected to, judged against this replica's desired version
// (replicas compute the same versions; one lagging behind shows PENDING).
func (s *Server) peerAcknowledgement(ctx context.Context, req *vsplanev1.ExplainServiceRequest, resp *vsplanev1.ExplainServiceResponse) {
	answers, _ := fanOut(ctx, s.peers, func(ctx context.Context, c vsplanev1.InspectServiceClient) (*vsplanev1.ExplainServiceResponse, error) {
		r := proto.Clone(req).(*vsplanev1.ExplainServiceRequest)
		r.Scope = vsplanev1.Scope_SCOPE_REPLICA
		return c.ExplainService(ctx, r)
	})
	for _, a := range answers {
		if a.GetAcknowledgement() == vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NOT_CONNECTED {
			continue
		}
		resp.Replica = a.GetReplica()
		resp.AcknowledgedVersion = a.GetAcknowledgedVersion()
		switch {
		case a.GetAcknowledgedVersion() == resp.GetVersion():
			resp.Acknowledgement = vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED
		case a.GetAcknowledgement() == vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NACKED && a.GetVersion() == resp.GetVersion():
			resp.Acknowledgement = vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NACKED
			resp.NackError = a.GetNackError()
		default:
			resp.Acknowledgement = vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_PENDING
		}
		return
	}
}
