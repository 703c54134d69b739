package stream

import (
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func wireResource(name, version string, rs int) *vsplanev1.Resource {
	vs := &vsplanev1.VirtualServer{Address: "198.18.0.1", Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP}
	for i := range rs {
		vs.RealServers = append(vs.RealServers, &vsplanev1.RealServer{Address: "198.18.1.1", Port: uint32(8000 + i), Weight: 1})
	}
	return &vsplanev1.Resource{Name: name, Version: version, Body: &vsplanev1.Resource_Service{Service: &vsplanev1.ServiceState{
		Namespace: "ns", Name: name, VirtualServers: []*vsplanev1.VirtualServer{vs}}}}
}

// The pre-encoded Delta decodes to exactly the Delta queued, whatever it
// holds, and shares each resource's bytes between Deltas.
func TestEncodedDeltaDecodesToTheDelta(t *testing.T) {
	var c wireCache
	a, b := wireResource("service/ns/a", "v1", 3), wireResource("service/ns/b", "v2", 200)
	cases := map[string]*vsplanev1.Delta{
		"empty":     {Nonce: "1"},
		"resources": {Nonce: "2", SystemVersion: "sv", Resources: []*vsplanev1.Resource{a, b}},
		"everything": {Nonce: "3", SystemVersion: "sv2", Resources: []*vsplanev1.Resource{b, a}, Removed: []string{"service/ns/c"},
			ReplaceAll: true, TriggerTimes: map[string]*timestamppb.Timestamp{"service/ns/a": timestamppb.New(time.Unix(5, 6))}},
	}
	for name, d := range cases {
		t.Run(name, func(t *testing.T) {
			m := &vsplanev1.ConnectResponse{Message: &vsplanev1.ConnectResponse_Delta{Delta: d}}
			enc, err := c.encode(m)
			if err != nil {
				t.Fatal(err)
			}
			if enc.ConnectResponse != m {
				t.Fatal("encoded response does not carry its message")
			}
			var got vsplanev1.ConnectResponse
			if err := proto.Unmarshal(enc.WireEncoding().Materialize(), &got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&got, m) {
				t.Fatalf("decoded %v, want %v", &got, m)
			}
			if n, want := enc.WireEncoding().Len(), proto.Size(m); n != want {
				t.Fatalf("encoding is %d bytes, proto.Size says %d", n, want)
			}
		})
	}
	fa, _ := c.framed(a)
	fa2, _ := c.framed(a)
	if &fa[0] != &fa2[0] {
		t.Fatal("a resource's encoding is built twice, not shared")
	}
}

// A resource's cached encoding goes when the resource does.
func TestWireCacheForgetsCollectedResources(t *testing.T) {
	var c wireCache
	func() {
		r := wireResource("service/ns/gone", "v1", 1)
		if _, err := c.framed(r); err != nil {
			t.Fatal(err)
		}
	}()
	entries := func() int {
		n := 0
		c.m.Range(func(any, any) bool { n++; return true })
		return n
	}
	// Cleanups run on their own goroutine after a GC: poll, bounded.
	for i := 0; i < 100 && entries() > 0; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := entries(); n != 0 {
		t.Fatalf("%d cache entries left after the resource was collected", n)
	}
}
