package inspect

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/snapshot"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// maxNameLen bounds names in requests (Kubernetes object names are at most 253).
const maxNameLen = 253

func checkName(field, v string) error {
	switch {
	case strings.TrimSpace(v) == "":
		return status.Errorf(codes.InvalidArgument, "%s must not be empty", field)
	case len(v) > maxNameLen:
		return status.Errorf(codes.InvalidArgument, "%s is %d bytes long; at most %d allowed", field, len(v), maxNameLen)
	}
	return nil
}

func checkNode(node string) error { return checkName("node_name", node) }

var errFeedClosed = status.Error(codes.Unavailable, "control plane shutting down")

func unknownNode(node string) error {
	return status.Errorf(codes.NotFound, "node %q is not known to this control plane (no Node object, or not synced yet)", node)
}

// GetNodeStatus returns a connected node's stream state and last report,
// from whichever replica the agent is connected to.
func (s *Server) GetNodeStatus(ctx context.Context, req *vsplanev1.GetNodeStatusRequest) (*vsplanev1.GetNodeStatusResponse, error) {
	node := req.GetNodeName()
	if err := checkNode(node); err != nil {
		return nil, err
	}
	info, ok := s.agents.Agent(node)
	if ok {
		info.Replica = s.self()
		return &vsplanev1.GetNodeStatusResponse{NodeName: node, Agent: info, Status: s.agents.LastStatus(node)}, nil
	}
	if s.fleetWide(req.GetScope()) {
		if r := s.peerNodeStatus(ctx, node); r != nil {
			return r, nil
		}
	}
	if !s.snapshots.Has(node) {
		return nil, unknownNode(node)
	}
	if s.fleetWide(req.GetScope()) {
		return nil, status.Errorf(codes.NotFound, "no agent for node %q is connected to any control-plane replica", node)
	}
	return nil, status.Errorf(codes.NotFound,
		"no agent for node %q is connected to this control-plane replica (it may be connected to another one)", node)
}

// ExplainService shows what one Service gives one node and whether the
// node's agent holds it (asking the replica it is connected to).
func (s *Server) ExplainService(ctx context.Context, req *vsplanev1.ExplainServiceRequest) (*vsplanev1.ExplainServiceResponse, error) {
	node, ns, name := req.GetNodeName(), req.GetNamespace(), req.GetName()
	for _, c := range []struct{ field, v string }{{"node_name", node}, {"namespace", ns}, {"name", name}} {
		if err := checkName(c.field, c.v); err != nil {
			return nil, err
		}
	}
	if strings.Contains(ns, "/") || strings.Contains(name, "/") {
		return nil, status.Error(codes.InvalidArgument, "namespace and name must not contain '/'")
	}
	var problems []string
	if s.problems != nil {
		for _, p := range s.problems.Problems(model.ServiceKey{Namespace: ns, Name: name}) {
			problems = append(problems, p.String())
		}
	}
	rname := snapshot.ServiceName(ns, name)
	res, ok := s.snapshots.Get(node, rname)
	if !ok {
		if !s.snapshots.Has(node) {
			return nil, unknownNode(node)
		}
		msg := fmt.Sprintf("Service %s/%s gives node %q nothing (no such Service, one without ClusterIP, or not translated yet)", ns, name, node)
		if len(problems) > 0 {
			msg += "; problems: " + strings.Join(problems, "; ")
		}
		return nil, status.Error(codes.NotFound, msg)
	}
	resp := &vsplanev1.ExplainServiceResponse{
		NodeName: node, Namespace: ns, Name: name,
		// Shared and immutable; the response only reads it.
		Service:  res.GetService(),
		Version:  res.GetVersion(),
		Problems: problems,
	}
	info, connected := s.agents.Agent(node)
	if !connected {
		resp.Acknowledgement = vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NOT_CONNECTED
		if s.fleetWide(req.GetScope()) {
			s.peerAcknowledgement(ctx, req, resp)
		}
		return resp, nil
	}
	resp.Replica = s.self()
	resp.AcknowledgedVersion = info.GetAcknowledgedVersions()[rname]
	if resp.AcknowledgedVersion == res.GetVersion() {
		resp.Acknowledgement = vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED
		return resp, nil
	}
	nack := s.feed.nackError(node, rname, res.GetVersion())
	// The stream records each NACKed resource with the Ack itself
	// ("version: message"); the Feed hears of it a moment later. Reading
	// both gives the same message whichever is first.
	if msg, ok := strings.CutPrefix(info.GetNacked()[rname], res.GetVersion()+": "); nack == "" && ok {
		nack = msg
	}
	// Without either (a NACK naming no resource), the stream's summary of
	// the last NACK still names the resource when it failed.
	if nack == "" && strings.Contains(info.GetLastNackError(), rname+"@"+res.GetVersion()) {
		nack = info.GetLastNackError()
	}
	if nack != "" {
		resp.Acknowledgement = vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_NACKED
		resp.NackError = nack
	} else {
		resp.Acknowledgement = vsplanev1.AcknowledgementState_ACKNOWLEDGEMENT_STATE_PENDING
	}
	return resp, nil
}

// WatchDeltas streams the Deltas sent to a node until the client goes away.
// Response headers are sent once the watch is registered, so a client that
// waits for them sees every Delta sent after that point (unless it reads too
// slowly; see Feed).
func (s *Server) WatchDeltas(req *vsplanev1.WatchDeltasRequest, st grpc.ServerStreamingServer[vsplanev1.WatchDeltasResponse]) error {
	node := req.GetNodeName()
	if err := checkNode(node); err != nil {
		return err
	}
	if s.feed == nil {
		return status.Error(codes.Unavailable, "delta watching is not wired on this control plane")
	}
	if _, _, known := s.snapshots.List(node); !known {
		return unknownNode(node)
	}
	select {
	case <-s.feed.closed:
		return errFeedClosed
	default:
	}
	w, cancel := s.feed.watch(node)
	defer cancel()
	if err := st.SendHeader(nil); err != nil {
		return err
	}
	ctx := st.Context()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.feed.closed:
			return errFeedClosed
		case ev := <-w.ch:
			if err := st.Send(&vsplanev1.WatchDeltasResponse{
				NodeName: node, SentAt: timestamppb.New(ev.sentAt),
				DroppedBefore: ev.droppedBefore, Delta: ev.delta,
			}); err != nil {
				return err
			}
		}
	}
}
