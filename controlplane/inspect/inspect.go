// Package inspect implements vsplane.v1.InspectService, the read-only view of
// a control-plane replica meant for grpcurl.
package inspect

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Agents lists the agents connected to this replica, sorted by node name.
// *stream.Registry satisfies it.
type Agents interface {
	ListAgents() []*vsplanev1.AgentInfo
}

// Snapshots returns a node's desired state, sorted by name (nil, "", false for
// an unknown node). stream.Source (and so *snapshot.Store) satisfies it.
type Snapshots interface {
	List(node string) (resources []*vsplanev1.Resource, systemVersion string, ok bool)
}

// Server implements vsplanev1.InspectServiceServer. It never changes state.
type Server struct {
	vsplanev1.UnimplementedInspectServiceServer
	agents    Agents
	snapshots Snapshots
}

var _ vsplanev1.InspectServiceServer = (*Server)(nil)

// NewServer returns an inspection server over agents and snapshots; both must
// be non-nil.
func NewServer(agents Agents, snapshots Snapshots) *Server {
	return &Server{agents: agents, snapshots: snapshots}
}

// ListAgents lists the agents connected to this replica.
func (s *Server) ListAgents(context.Context, *vsplanev1.ListAgentsRequest) (*vsplanev1.ListAgentsResponse, error) {
	return &vsplanev1.ListAgentsResponse{Agents: s.agents.ListAgents()}, nil
}

// GetNodeSnapshot returns a node's current desired state.
func (s *Server) GetNodeSnapshot(_ context.Context, req *vsplanev1.GetNodeSnapshotRequest) (*vsplanev1.GetNodeSnapshotResponse, error) {
	node := req.GetNodeName()
	if strings.TrimSpace(node) == "" {
		return nil, status.Error(codes.InvalidArgument, "node_name must not be empty")
	}
	res, sv, ok := s.snapshots.List(node)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node %q is not known to this control plane (no Node object, or not synced yet)", node)
	}
	// Resources are shared and immutable; the response only reads them.
	return &vsplanev1.GetNodeSnapshotResponse{NodeName: node, SystemVersion: sv, Resources: res}, nil
}
