package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/dataplane/kernel/memory"
	"github.com/vsplane/vsplane/dataplane/reconcile"
	"github.com/vsplane/vsplane/internal/wire"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func webResource(t *testing.T, backend string) *vsplanev1.Resource {
	t.Helper()
	// The version only has to change with the content here.
	st := &vsplanev1.ServiceState{
		Namespace: "default", Name: "web",
		VirtualServers: []*vsplanev1.VirtualServer{{
			Kind: vsplanev1.VirtualServerKind_VIRTUAL_SERVER_KIND_CLUSTER_IP, Address: "198.18.0.10", Family: vsplanev1.IPFamily_IP_FAMILY_IPV4,
			Port: 80, Protocol: vsplanev1.Protocol_PROTOCOL_TCP, Binding: vsplanev1.AddressBinding_ADDRESS_BINDING_ALWAYS,
			RealServers: []*vsplanev1.RealServer{{Address: backend, Port: 8080, Weight: 1, Ready: true, Serving: true}},
		}},
	}
	return &vsplanev1.Resource{Name: wire.ServiceResource("default", "web"), Version: "v-" + backend,
		Body: &vsplanev1.Resource_Service{Service: st}}
}

func newStateApplier(t *testing.T, mem *memory.Kernel, dir string) *persistentApplier {
	t.Helper()
	rec, err := reconcile.New(mem.Kernel(), reconcile.Config{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPersistentApplier(rec, dir, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRestartResumesWithoutKernelWrites(t *testing.T) {
	ctx := context.Background()
	mem, dir := memory.New(), t.TempDir()
	web := webResource(t, "198.19.1.10")

	p := newStateApplier(t, mem, dir)
	if ack := p.Apply(ctx, &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{web}}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v", ack)
	}
	p.save()

	// A new process: it says Hello with the saved versions...
	mem.ResetCalls()
	p2 := newStateApplier(t, mem, dir)
	if got := p2.Versions(); got[web.GetName()] != web.GetVersion() || len(got) != 1 {
		t.Fatalf("restored versions %v, want %s=%s", got, web.GetName(), web.GetVersion())
	}
	// ...receives an empty first Delta, and touches nothing.
	if ack := p2.Apply(ctx, &vsplanev1.Delta{Nonce: "1"}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply after restart: %v", ack)
	}
	if calls := mem.Calls(); len(calls) != 0 {
		t.Fatalf("restart wrote to the kernel: %v", calls)
	}
	if got := p2.Versions(); got[web.GetName()] != web.GetVersion() {
		t.Fatalf("after first apply the reconciler holds %v", got)
	}

	// A change while down arrives as the only resource of the first Delta.
	p3 := newStateApplier(t, mem, dir)
	web2 := webResource(t, "198.19.1.11")
	ack := p3.Apply(ctx, &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{web2}})
	if ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v", ack)
	}
	if ops := ack.GetKernelOperations(); ops[wire.OpAddService] != 0 || ops[wire.OpDeleteService] != 0 {
		t.Fatalf("a one-backend change re-created the virtual server: %v", ops)
	}
}

func TestDamagedStateFileMeansFullResync(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte("not a protobuf \xff\xff"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newStateApplier(t, memory.New(), dir)
	if got := p.Versions(); len(got) != 0 {
		t.Fatalf("damaged file restored %v, want nothing", got)
	}
}

// TestSaveWritesTheDeltaEncoding: save writes the stored encodings as they
// are; the file must be what marshalling a Delta of the applied resources
// (name order, deterministic) gives, as before, and nothing of a resource
// whose applied version is not the one stored.
func TestSaveWritesTheDeltaEncoding(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := newStateApplier(t, memory.New(), dir)
	web, other := webResource(t, "198.19.1.10"), memService(7)
	if ack := p.Apply(ctx, &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{web, other, memSettings()}}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply: %v", ack)
	}
	// A version the reconciler refuses (a bad address) stays out of the file.
	bad := webResource(t, "not-an-address")
	if ack := p.Apply(ctx, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{bad}}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("apply of a bad resource: %v", ack)
	}
	p.save()
	got, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(&vsplanev1.Delta{Resources: []*vsplanev1.Resource{memSettings(), other}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("state file differs from the Delta's encoding:\n got %x\nwant %x", got, want)
	}
}
