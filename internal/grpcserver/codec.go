package grpcserver

import (
	"google.golang.org/grpc/encoding"
	// Registers the "proto" codec the default case delegates to.
	_ "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// PreEncoded is a message that carries its own wire encoding. The server's
// codec sends those bytes as they are, so parts shared by many messages
// (the control plane's resources, the same for most nodes) are encoded
// once and referenced, not marshalled again for every stream. A PreEncoded
// value should also be a proto.Message equal to its encoding: interceptors
// log and count it as one, and a server without this codec marshals it
// like any other message.
//
// Contract: WireEncoding returns the encoding of the whole message; the
// buffers must stay unchanged until freed (their Free is called once the
// message is written).
type PreEncoded interface {
	WireEncoding() mem.BufferSlice
}

// codec is the server's codec: PreEncoded messages go out as they are,
// everything else through gRPC's proto codec.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func (c codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(PreEncoded); ok {
		return p.WireEncoding(), nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }
