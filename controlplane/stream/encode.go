package stream

import (
	"fmt"
	"runtime"
	"sync"
	"weak"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// Encoding Deltas once per resource, not once per agent.
//
// Most nodes get the same resource values (package snapshot shares them),
// so marshalling every Delta whole encoded each value once per agent and
// kept a private copy per stream until the agent read it: ~30% of the
// control plane's CPU in a burst, and the largest part of its heap while a
// fleet cold-starts (e2e/fanout). Instead each resource's encoding, framed
// as an element of Delta.resources, is built once and referenced by every
// Delta that carries it; a Delta's own encoding is only its small head
// (nonce, version, removals, trigger times) followed by those references.
// The server's codec (internal/grpcserver PreEncoded) writes them as they
// are. Protobuf decoders accept fields in any order and concatenate
// repeated ones, so the agent decodes exactly the Delta queued.

// Field numbers of the messages encoded here (proto/vsplane/v1/agent.proto).
const (
	connectResponseDeltaField protowire.Number = 1
	deltaResourcesField       protowire.Number = 3
)

// wireCache holds the framed encoding of each shared resource for as long
// as the resource itself lives: keyed by a weak pointer, the entry is
// dropped when the resource is collected.
type wireCache struct{ m sync.Map } // weak.Pointer[vsplanev1.Resource] -> *wireEntry

type wireEntry struct {
	once sync.Once
	b    []byte
	err  error
}

// framed returns r's encoding as one element of Delta.resources: field tag,
// length, message. r must never be modified (the store's resources are
// immutable).
func (c *wireCache) framed(r *vsplanev1.Resource) ([]byte, error) {
	k := weak.Make(r)
	v, ok := c.m.Load(k)
	if !ok {
		var loaded bool
		if v, loaded = c.m.LoadOrStore(k, &wireEntry{}); !loaded {
			runtime.AddCleanup(r, func(k weak.Pointer[vsplanev1.Resource]) { c.m.Delete(k) }, k)
		}
	}
	e := v.(*wireEntry)
	e.once.Do(func() {
		size := proto.Size(r)
		b := make([]byte, 0, protowire.SizeTag(deltaResourcesField)+protowire.SizeBytes(size))
		b = protowire.AppendTag(b, deltaResourcesField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
		if b, e.err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, r); e.err != nil {
			e.err = fmt.Errorf("encoding resource %s: %w", r.GetName(), e.err)
			return
		}
		e.b = b
	})
	return e.b, e.err
}

// encodedResponse is a ConnectResponse with its wire encoding. It is the
// message too (embedded), so interceptors see a proto.Message and a server
// without the PreEncoded codec still sends it correctly, marshalled.
type encodedResponse struct {
	*vsplanev1.ConnectResponse
	wire mem.BufferSlice
}

// WireEncoding implements internal/grpcserver.PreEncoded.
func (e *encodedResponse) WireEncoding() mem.BufferSlice { return e.wire }

// encode builds m's encoding from its Delta's head and the shared
// resources' cached encodings.
func (c *wireCache) encode(m *vsplanev1.ConnectResponse) (*encodedResponse, error) {
	d := m.GetDelta()
	if d == nil {
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		return &encodedResponse{ConnectResponse: m, wire: mem.BufferSlice{mem.SliceBuffer(b)}}, nil
	}
	head := &vsplanev1.Delta{Nonce: d.GetNonce(), SystemVersion: d.GetSystemVersion(), Removed: d.GetRemoved(),
		ReplaceAll: d.GetReplaceAll(), TriggerTimes: d.GetTriggerTimes()}
	headSize := proto.Size(head)
	wire := make(mem.BufferSlice, 1, 1+len(d.GetResources()))
	total := headSize
	for _, r := range d.GetResources() {
		b, err := c.framed(r)
		if err != nil {
			return nil, err
		}
		wire = append(wire, mem.SliceBuffer(b))
		total += len(b)
	}
	first := make([]byte, 0, protowire.SizeTag(connectResponseDeltaField)+protowire.SizeVarint(uint64(total))+headSize)
	first = protowire.AppendTag(first, connectResponseDeltaField, protowire.BytesType)
	first = protowire.AppendVarint(first, uint64(total))
	first, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(first, head)
	if err != nil {
		return nil, err
	}
	wire[0] = mem.SliceBuffer(first)
	return &encodedResponse{ConnectResponse: m, wire: wire}, nil
}
