package engine

import (
	"github.com/vsplane/vsplane/controlplane/snapshot"
	"github.com/vsplane/vsplane/controlplane/stream"
)

// storeSource is the adapter main.go needs: *snapshot.Store has the
// stream.Source methods, but Subscribe returns snapshot.Subscription, a
// distinct (identical) interface type, so Go needs this one-line bridge.
type storeSource struct{ *snapshot.Store }

func (s storeSource) Subscribe(node string) stream.Subscription { return s.Store.Subscribe(node) }

var _ stream.Source = storeSource{}
