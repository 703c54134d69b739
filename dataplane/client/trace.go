package client

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
)

// Step is a point a connection reaches on its way to the first applied
// Delta. Config.Trace receives each as it is reached, for every stream:
// the agent times its cold start with them (where the time from process
// start to the first Delta goes).
type Step string

const (
	// StepConnected: the TCP connection to a replica is up (the transport
	// handshake starts).
	StepConnected Step = "connected"
	// StepHandshake: the TLS handshake is done (with plaintext, at once).
	StepHandshake Step = "handshake"
	// StepHelloSent: the stream is open and the Hello sent.
	StepHelloSent Step = "hello_sent"
	// StepFirstResponse: the replica's first message arrived: its
	// authentication of the agent (a TokenReview) and its first Delta's
	// computation are behind it.
	StepFirstResponse Step = "first_response"
	// StepFirstDeltaApplied: the stream's first Delta was applied (its Ack
	// is sent next).
	StepFirstDeltaApplied Step = "first_delta_applied"
)

// tracedCredentials reports the transport handshake's start and end.
type tracedCredentials struct {
	credentials.TransportCredentials
	trace func(Step)
}

func (c tracedCredentials) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c.trace(StepConnected)
	out, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err == nil {
		c.trace(StepHandshake)
	}
	return out, info, err
}

func (c tracedCredentials) Clone() credentials.TransportCredentials {
	return tracedCredentials{TransportCredentials: c.TransportCredentials.Clone(), trace: c.trace}
}
