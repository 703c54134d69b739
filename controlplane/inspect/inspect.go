// Package inspect implements vsplane.v1.InspectService, the read-only view of
// the control plane meant for grpcurl (the server registers reflection; calls
// need a bearer token allowed to get inspection.vsplane.io, see package auth):
//
//	G="grpcurl -cacert ca.crt -servername vsplane-controlplane.vsplane-system.svc -H 'authorization: Bearer ...'"
//	$G $CP list vsplane.v1.InspectService
//	$G $CP vsplane.v1.InspectService/ListAgents
//	$G -d '{"node_name":"n1"}' $CP vsplane.v1.InspectService/GetNodeSnapshot
//	$G -d '{"node_name":"n1"}' $CP vsplane.v1.InspectService/GetNodeStatus
//	$G -d '{"node_name":"n1","namespace":"default","name":"web"}' $CP vsplane.v1.InspectService/ExplainService
//	$G -d '{"node_name":"n1"}' $CP vsplane.v1.InspectService/WatchDeltas
//
// Unknown nodes and Services give NotFound, malformed requests
// InvalidArgument. No call changes state.
package inspect

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Agents is the view of the agents connected to this replica.
// *stream.Registry satisfies it. Results are copies the caller may keep.
type Agents interface {
	// ListAgents returns every connected agent, sorted by node name;
	// without versions, acknowledged_versions and nacked are left out (and
	// not copied).
	ListAgents(withVersions bool) []*vsplanev1.AgentInfo
	// ListAgentsOf is ListAgents reporting only the resources names
	// (acknowledged and NACKed versions), without pending counts.
	ListAgentsOf(names []string) []*vsplanev1.AgentInfo
	// Agent returns one connected node's info (false if not connected).
	Agent(node string) (*vsplanev1.AgentInfo, bool)
	// LastStatus returns the last AgentStatus the node's agent sent (nil if
	// not connected or none sent).
	LastStatus(node string) *vsplanev1.AgentStatus
}

// Snapshots is the desired state. stream.Source (and so *snapshot.Store)
// satisfies it. Returned resources are shared and must not be modified.
type Snapshots interface {
	// List returns a node's resources sorted by name, with their trigger
	// times (nil, "", false for an unknown node).
	List(node string) (entries []snapshot.Entry, systemVersion string, ok bool)
	// Get returns one resource of a node.
	Get(node, name string) (*vsplanev1.Resource, bool)
	// Has reports whether node is known.
	Has(node string) bool
}

// Problems returns the translation problems of a Service and its
// EndpointSlices. *engine.Engine satisfies it.
type Problems interface {
	Problems(k model.ServiceKey) []model.Problem
}

// Config is what a Server reads from.
type Config struct {
	// Agents and Snapshots are required.
	Agents    Agents
	Snapshots Snapshots
	// Problems, if nil, leaves ExplainService's problems empty.
	Problems Problems
	// Feed, installed in the stream server's Hooks (Feed.Hooks), serves
	// WatchDeltas and per-resource NACK errors. If nil, WatchDeltas returns
	// Unavailable.
	Feed *Feed
	// Peers, if set, makes ListAgents, GetNodeStatus and ExplainService
	// answer for the agents of every replica (fleet.go).
	Peers Peers
	// Rollouts, if set, serves GetRollout (*rollout.Controller).
	Rollouts Rollouts
}

// Rollouts describes SchedulerRollouts per node.
type Rollouts interface {
	// Progress returns rollout name's per-node progress (false: no such
	// rollout).
	Progress(ctx context.Context, name string) (*vsplanev1.GetRolloutResponse, bool, error)
}

// Server implements vsplanev1.InspectServiceServer. It never changes state.
type Server struct {
	vsplanev1.UnimplementedInspectServiceServer
	agents    Agents
	snapshots Snapshots
	problems  Problems
	feed      *Feed
	peers     Peers
	rollouts  Rollouts
}

var _ vsplanev1.InspectServiceServer = (*Server)(nil)

// NewServer returns an inspection server over cfg; cfg.Agents and
// cfg.Snapshots must be non-nil.
func NewServer(cfg Config) *Server {
	return &Server{agents: cfg.Agents, snapshots: cfg.Snapshots, problems: cfg.Problems, feed: cfg.Feed, peers: cfg.Peers, rollouts: cfg.Rollouts}
}

// ListAgents lists the agents connected to any replica (this one only with
// SCOPE_REPLICA).
func (s *Server) ListAgents(ctx context.Context, req *vsplanev1.ListAgentsRequest) (*vsplanev1.ListAgentsResponse, error) {
	local := s.localAgents(req.GetOmitVersions(), req.GetVersionsOf())
	if !s.fleetWide(req.GetScope()) {
		return &vsplanev1.ListAgentsResponse{Agents: local}, nil
	}
	answers, failed := fanOut(ctx, s.peers, func(ctx context.Context, c vsplanev1.InspectServiceClient) (*vsplanev1.ListAgentsResponse, error) {
		return c.ListAgents(ctx, &vsplanev1.ListAgentsRequest{Scope: vsplanev1.Scope_SCOPE_REPLICA,
			OmitVersions: req.GetOmitVersions(), VersionsOf: req.GetVersionsOf()})
	})
	lists := [][]*vsplanev1.AgentInfo{local}
	for _, a := range answers {
		lists = append(lists, a.GetAgents())
	}
	return &vsplanev1.ListAgentsResponse{Agents: mergeAgents(lists...), UnreachableReplicas: failed}, nil
}

// GetNodeSnapshot returns a node's current desired state.
func (s *Server) GetNodeSnapshot(_ context.Context, req *vsplanev1.GetNodeSnapshotRequest) (*vsplanev1.GetNodeSnapshotResponse, error) {
	node := req.GetNodeName()
	if err := checkNode(node); err != nil {
		return nil, err
	}
	entries, sv, ok := s.snapshots.List(node)
	if !ok {
		return nil, unknownNode(node)
	}
	// Resources are shared and immutable; the response only reads them.
	return &vsplanev1.GetNodeSnapshotResponse{NodeName: node, SystemVersion: sv, Resources: snapshot.Resources(entries)}, nil
}

// SetRollouts installs the rollout view (it needs this server for the fleet
// view, so it is made after it); call before serving.
func (s *Server) SetRollouts(r Rollouts) { s.rollouts = r }

// GetRollout shows a SchedulerRollout's per-node progress.
func (s *Server) GetRollout(ctx context.Context, req *vsplanev1.GetRolloutRequest) (*vsplanev1.GetRolloutResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if s.rollouts == nil {
		return nil, status.Error(codes.Unimplemented, "this control plane runs without SchedulerRollouts (--rollouts=false)")
	}
	resp, ok, err := s.rollouts.Progress(ctx, req.GetName())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "rollout %q: %v", req.GetName(), err)
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no SchedulerRollout %q", req.GetName())
	}
	return resp, nil
}
