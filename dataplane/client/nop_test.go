package client

import (
	"context"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

type nopApplier struct{}

func (nopApplier) Apply(context.Context, *vsplanev1.Delta) *vsplanev1.Ack { return nil }
func (nopApplier) Versions() map[string]string                            { return nil }
