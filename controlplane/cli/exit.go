package cli

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Exit codes of kubectl-vsplane, for scripts (README "kubectl vsplane").
const (
	// ExitOK: the command worked; for status, explain and rollout status,
	// everything it shows is in sync (acknowledged, no NACK, rollout done).
	ExitOK = 0
	// ExitError: any other failure (kubeconfig, API server, TLS, network).
	ExitError = 1
	// ExitUsage: wrong arguments or flags.
	ExitUsage = 2
	// ExitNotInSync: the answer came, and something is not in sync: an
	// agent behind or NACKing or holding a removal, a Service not
	// acknowledged, a rollout not (or not successfully) finished, an
	// unreachable replica.
	ExitNotInSync = 3
	// ExitNotFound: the node, Service or rollout is unknown to the control
	// plane (or no agent of the node is connected).
	ExitNotFound = 4
	// ExitDenied: the control plane refused the credentials
	// (unauthenticated, or not bound to vsplane-inspector).
	ExitDenied = 5
)

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// errNotInSync is returned after the output was written when what it shows
// is not in sync; it prints nothing more.
var errNotInSync = errors.New("not in sync")

// ExitCode maps a command's error to its exit code.
func ExitCode(err error) int {
	var u usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &u):
		return ExitUsage
	case errors.Is(err, errNotInSync):
		return ExitNotInSync
	}
	// status.Code finds a gRPC status through wrapping (fmt.Errorf %w).
	switch status.Code(err) {
	case codes.NotFound:
		return ExitNotFound
	case codes.Unauthenticated, codes.PermissionDenied:
		return ExitDenied
	}
	return ExitError
}
