package stream

import (
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Hooks let the caller observe streams (metrics, tests). Every field is
// optional. Hooks run synchronously on the stream's goroutine: keep them fast
// and never block; they must not call back into the Server.
type Hooks struct {
	// OnConnect runs after a valid Hello has been accepted.
	OnConnect func(ev ConnectEvent)
	// OnDisconnect runs when an accepted stream (one that had OnConnect) ends;
	// err is what Connect returns (nil on a clean client close; ReasonOf
	// classifies it).
	OnDisconnect func(node string, err error)
	// OnReject runs when a stream ends before it was accepted: no valid
	// Hello, bad credentials, a Hello for another node (ReasonOf classifies it).
	OnReject func(err error)
	// OnDeltaSent runs after a Delta was handed to gRPC.
	OnDeltaSent func(node string, delta *vsplanev1.Delta)
	// OnAck runs for every Ack that matched an in-flight Delta.
	OnAck func(ev AckEvent)
}

// ConnectEvent describes an accepted stream.
type ConnectEvent struct {
	Node         string
	AgentVersion string
	Peer         string
	// HeldResources is the number of resources the agent reported in Hello
	// (listed, or counted beside HeldSystemVersion).
	HeldResources int
	// HeldSystemVersion is the Hello's held_system_version: the agent
	// resumes by system version instead of listing its versions ("": it
	// listed them).
	HeldSystemVersion string
	// Replaced is true when an older stream for the same node was closed.
	Replaced bool
}

// AckEvent describes one Ack and the Delta it answers.
type AckEvent struct {
	Node   string
	Nonce  string
	Status vsplanev1.AckStatus
	// ApplyDuration as reported by the agent (zero if it sent none).
	ApplyDuration time.Duration
	// SentAt is when the Delta was sent; ReceivedAt when the Ack arrived.
	SentAt, ReceivedAt time.Time
	// TriggerTimes of the Delta's resources (read with them from the Source), by
	// name; trigger→ReceivedAt is the end-to-end programming latency.
	TriggerTimes map[string]time.Time
	// Resources and Removed count what the Delta carried.
	Resources, Removed int
	Errors             []*vsplanev1.ResourceError
	KernelOperations   map[string]uint32
}
