package stream

import (
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Limits on what an agent may send. A legitimate agent stays far below
// them; they bound what one stream can make this server hold or do.
const (
	// MaxHeldResources bounds Hello.resource_versions (and held_count),
	// HeldVersions and AgentStatus.recovered (a node holds one resource per
	// Service).
	MaxHeldResources = 1 << 20
	// MaxResourceNameLength bounds one name in Hello.resource_versions
	// ("service/" + a 63-character namespace + "/" + a 253-character name
	// is 325).
	MaxResourceNameLength = 512
	// MaxKernelOperationKinds bounds Ack.kernel_operations (agents report
	// 15 kinds, internal/wire).
	MaxKernelOperationKinds = 64
	// MaxStatusKernelErrors bounds AgentStatus.kernel_errors.
	MaxStatusKernelErrors = 256
	// MaxStatusDraining bounds AgentStatus.draining.
	MaxStatusDraining = 1 << 17
)

// CloseReason classifies why a stream ended or was refused; it is the
// label of vsplane_controlplane_agent_streams_closed_total, a fixed set.
type CloseReason string

const (
	ReasonClientClosed     CloseReason = "client_closed"
	ReasonTransport        CloseReason = "transport"
	ReasonReplaced         CloseReason = "replaced"
	ReasonShutdown         CloseReason = "shutdown"
	ReasonAckTimeout       CloseReason = "ack_timeout"
	ReasonUnknownNode      CloseReason = "unknown_node_timeout"
	ReasonTooManyUnknown   CloseReason = "too_many_unknown_nodes"
	ReasonProtocolError    CloseReason = "protocol_error"
	ReasonUnauthenticated  CloseReason = "unauthenticated"
	ReasonPermissionDenied CloseReason = "permission_denied"
	ReasonHelloTimeout     CloseReason = "hello_timeout"
)

// closeError is a gRPC status error that also says why, for metrics.
type closeError struct {
	reason CloseReason
	st     *status.Status
}

func (e *closeError) Error() string              { return e.st.Err().Error() }
func (e *closeError) GRPCStatus() *status.Status { return e.st }

func closeErr(reason CloseReason, code codes.Code, format string, args ...any) error {
	return &closeError{reason: reason, st: status.New(code, fmt.Sprintf(format, args...))}
}

// ReasonOf classifies an error returned by Connect (nil is a clean close by
// the agent).
func ReasonOf(err error) CloseReason {
	if err == nil {
		return ReasonClientClosed
	}
	var ce *closeError
	if errors.As(err, &ce) {
		return ce.reason
	}
	switch status.Code(err) {
	case codes.InvalidArgument:
		return ReasonProtocolError
	case codes.Unauthenticated:
		return ReasonUnauthenticated
	case codes.PermissionDenied:
		return ReasonPermissionDenied
	}
	return ReasonTransport
}

func invalid(format string, args ...any) error {
	return closeErr(ReasonProtocolError, codes.InvalidArgument, format, args...)
}

// checkNodeName: Node names are DNS-1123 subdomains (at most 253 characters).
func checkNodeName(node string) error {
	if node == "" {
		return invalid("Hello.node_name must not be empty")
	}
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return invalid("Hello.node_name %q is not a valid Node name: %s", truncate(node, 64), errs[0])
	}
	return nil
}

func checkHello(h *vsplanev1.Hello) error {
	if err := checkNodeName(h.GetNodeName()); err != nil {
		return err
	}
	if err := checkVersions("Hello.resource_versions", h.GetResourceVersions()); err != nil {
		return err
	}
	if sv := h.GetHeldSystemVersion(); sv != "" {
		if len(h.GetResourceVersions()) > 0 {
			return invalid("Hello carries both resource_versions and held_system_version; send one")
		}
		if b, err := hex.DecodeString(sv); err != nil || len(b) != 16 {
			return invalid("Hello.held_system_version %q is not a system version (32 hex digits)", truncate(sv, 40))
		}
		if n := h.GetHeldCount(); n > MaxHeldResources {
			return invalid("Hello.held_count is %d; at most %d", n, MaxHeldResources)
		}
	}
	return nil
}

// checkVersions bounds a name -> version map an agent sends (what field
// names it in the error).
func checkVersions(field string, versions map[string]string) error {
	if n := len(versions); n > MaxHeldResources {
		return invalid("%s lists %d resources; at most %d", field, n, MaxHeldResources)
	}
	for name, v := range versions {
		if len(name) > MaxResourceNameLength || len(v) > MaxResourceNameLength {
			return invalid("%s has a name or version longer than %d bytes", field, MaxResourceNameLength)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func checkAck(ack *vsplanev1.Ack, d *inflightDelta) error {
	if n, max := len(ack.GetErrors()), len(d.upserts)+len(d.removed)+1; n > max {
		return invalid("Ack for nonce %q carries %d errors; its Delta had %d resources", ack.GetNonce(), n, max-1)
	}
	if n := len(ack.GetKernelOperations()); n > MaxKernelOperationKinds {
		return invalid("Ack for nonce %q reports %d kernel operation kinds; at most %d", ack.GetNonce(), n, MaxKernelOperationKinds)
	}
	return nil
}

func checkStatus(st *vsplanev1.AgentStatus) error {
	switch {
	case len(st.GetKernelErrors()) > MaxStatusKernelErrors:
		return invalid("AgentStatus carries %d kernel errors; at most %d", len(st.GetKernelErrors()), MaxStatusKernelErrors)
	case len(st.GetDraining()) > MaxStatusDraining:
		return invalid("AgentStatus lists %d draining real servers; at most %d", len(st.GetDraining()), MaxStatusDraining)
	case len(st.GetRecovered()) > MaxHeldResources:
		return invalid("AgentStatus lists %d recovered resources; at most %d", len(st.GetRecovered()), MaxHeldResources)
	}
	return nil
}
