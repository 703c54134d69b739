package grpcserver

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type preEncoded struct {
	*wrapperspb.StringValue
	wire []byte
}

func (p preEncoded) WireEncoding() mem.BufferSlice { return mem.BufferSlice{mem.SliceBuffer(p.wire)} }

// A PreEncoded message goes out as its own bytes; anything else is
// marshalled by the proto codec.
func TestCodecSendsPreEncodedBytes(t *testing.T) {
	c := newCodec()
	own := []byte{0x0a, 0x01, 'x'} // StringValue{value: "x"}, not what the embedded message says
	got, err := c.Marshal(preEncoded{StringValue: wrapperspb.String("other"), wire: own})
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Materialize()) != string(own) {
		t.Fatalf("sent %x, want the message's own %x", got.Materialize(), own)
	}
	plain := wrapperspb.String("y")
	got, err = c.Marshal(plain)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(plain)
	if string(got.Materialize()) != string(want) {
		t.Fatalf("plain message marshalled to %x, want %x", got.Materialize(), want)
	}
	var back wrapperspb.StringValue
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(own)}, &back); err != nil || back.GetValue() != "x" {
		t.Fatalf("unmarshal: %v %q", err, back.GetValue())
	}
}
