package agent

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

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

// savedVersions is what the state file in dir holds: name -> version.
func savedVersions(t *testing.T, dir string) map[string]string {
	t.Helper()
	got, err := loadState(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for n, r := range got {
		out[n] = r.GetVersion()
	}
	return out
}

func mustAck(t *testing.T, p *persistentApplier, d *vsplanev1.Delta) {
	t.Helper()
	if ack := p.Apply(context.Background(), d); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_ACK {
		t.Fatalf("apply %s: %v", d.GetNonce(), ack)
	}
}

// TestSaveCarriesTheFileOver: the applier holds only what changed since
// the last save; everything else comes from the previous file, also after
// a restart, and removed resources leave it.
func TestSaveCarriesTheFileOver(t *testing.T) {
	dir, mem := t.TempDir(), memory.New()
	web, a, b := webResource(t, "198.19.1.10"), memService(1), memService(2)
	p := newStateApplier(t, mem, dir)
	mustAck(t, p, &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{web, a, b, memSettings()}})
	p.save()
	if n := len(p.pending); n != 0 {
		t.Fatalf("%d resources still pending after a save", n)
	}
	want := p.inner.Versions()
	if got := savedVersions(t, dir); !maps.Equal(got, want) {
		t.Fatalf("file holds %v, want %v", got, want)
	}

	// One change and one removal: the rest is streamed from the old file.
	web2 := webResource(t, "198.19.1.11")
	mustAck(t, p, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{web2}, Removed: []string{a.GetName()}})
	p.save()
	want = map[string]string{web2.GetName(): web2.GetVersion(), b.GetName(): b.GetVersion(), reconcile.SettingsResource: memSettings().GetVersion()}
	if got := savedVersions(t, dir); !maps.Equal(got, want) {
		t.Fatalf("after a change and a removal the file holds %v, want %v", got, want)
	}

	// A restart with nothing new, then a save: the file is unchanged.
	before, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	p2 := newStateApplier(t, mem, dir)
	mustAck(t, p2, &vsplanev1.Delta{Nonce: "1"})
	p2.save()
	after, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatalf("a restart and a save changed the file:\nbefore %x\n after %x", before, after)
	}
}

// TestSaveKeepsTheAppliedVersion: the file holds the versions the
// reconciler holds, never a refused one, and an encoding whose
// version the reconciler does not hold yet stays pending for the next save.
func TestSaveKeepsTheAppliedVersion(t *testing.T) {
	dir := t.TempDir()
	p := newStateApplier(t, memory.New(), dir)
	web := webResource(t, "198.19.1.10")
	mustAck(t, p, &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{web}})
	p.save()
	bad := webResource(t, "not-an-address")
	if ack := p.Apply(context.Background(), &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{bad}}); ack.GetStatus() != vsplanev1.AckStatus_ACK_STATUS_NACK {
		t.Fatalf("apply of a bad resource: %v", ack)
	}
	p.save()
	if got := savedVersions(t, dir); !maps.Equal(got, p.inner.Versions()) || got[web.GetName()] == bad.GetVersion() {
		t.Fatalf("after a NACK the file holds %v, the reconciler %v", got, p.inner.Versions())
	}

	// An encoding recorded but not applied yet (Apply records before it
	// applies; save may run in between).
	other := memService(3)
	sr, ok := encodeForState(other)
	if !ok {
		t.Fatal("cannot encode")
	}
	p.mu.Lock()
	p.pending[other.GetName()] = sr
	p.mu.Unlock()
	p.save()
	if _, ok := savedVersions(t, dir)[other.GetName()]; ok {
		t.Fatal("a resource the reconciler does not hold reached the file")
	}
	if _, ok := p.pending[other.GetName()]; !ok {
		t.Fatal("an encoding not applied yet was dropped from pending")
	}
	mustAck(t, p, &vsplanev1.Delta{Nonce: "3", Resources: []*vsplanev1.Resource{other}})
	p.save()
	if got := savedVersions(t, dir); got[other.GetName()] != other.GetVersion() {
		t.Fatalf("after its apply the file holds %v", got)
	}
}

// TestSaveAfterADamagedFile: a file damaged on disk after the agent read
// it loses only what follows the damage; a file damaged at start is
// removed, so nothing of it reaches a later file.
func TestSaveAfterADamagedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, stateFileName)
	p := newStateApplier(t, memory.New(), dir)
	a, b := memService(1), memService(2)
	mustAck(t, p, &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{a, b}})
	p.save()
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, full[:len(full)-5], 0o600); err != nil { // b cut short
		t.Fatal(err)
	}
	web := webResource(t, "198.19.1.10")
	mustAck(t, p, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{web}})
	p.save()
	want := map[string]string{a.GetName(): a.GetVersion(), web.GetName(): web.GetVersion()}
	if got := savedVersions(t, dir); !maps.Equal(got, want) {
		t.Fatalf("file holds %v, want %v (b lost with the damage)", got, want)
	}

	if err := os.WriteFile(path, []byte("\x0a\xff\xff"), 0o600); err != nil {
		t.Fatal(err)
	}
	p2 := newStateApplier(t, memory.New(), dir)
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a damaged file was kept: %v", err)
	}
	mustAck(t, p2, &vsplanev1.Delta{Nonce: "1", ReplaceAll: true, Resources: []*vsplanev1.Resource{b}})
	p2.save()
	if got := savedVersions(t, dir); len(got) != 1 || got[b.GetName()] != b.GetVersion() {
		t.Fatalf("file holds %v, want only %s", got, b.GetName())
	}
}

// fillDisk makes the next save of p fail as on a full disk: its temp file
// is /dev/full, where every write fails with ENOSPC (after the buffered
// resources were counted as written).
func fillDisk(t *testing.T, p *persistentApplier) {
	t.Helper()
	if err := os.Symlink("/dev/full", p.path+".tmp"); err != nil {
		t.Fatal(err)
	}
}

// TestSaveOnAFullDisk: a failed save leaves the previous file as it was,
// no temp file behind, and every change pending for the next save (a save
// that failed after writing part of them once dropped those from pending,
// so the next good file lacked them); run tries again every saveInterval
// without a new Apply.
func TestSaveOnAFullDisk(t *testing.T) {
	dir := t.TempDir()
	p := newStateApplier(t, memory.New(), dir)
	a, b := memService(1), memService(2)
	mustAck(t, p, &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{a, b}})
	if !p.save() {
		t.Fatal("save failed")
	}
	before := savedVersions(t, dir)

	web := webResource(t, "198.19.1.10")
	mustAck(t, p, &vsplanev1.Delta{Nonce: "2", Resources: []*vsplanev1.Resource{web}})
	fillDisk(t, p)
	if p.save() {
		t.Fatal("a save onto a full disk reported success")
	}
	if n := p.SaveFailures(); n != 1 {
		t.Fatalf("%d save failures counted, want 1", n)
	}
	if got := savedVersions(t, dir); !maps.Equal(got, before) {
		t.Fatalf("a failed save changed the file: %v, was %v", got, before)
	}
	if _, ok := p.pending[web.GetName()]; !ok {
		t.Fatal("a change that never reached the file was dropped from pending")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != stateFileName {
		t.Fatalf("state dir after a failed save holds %v, want only %s", entries, stateFileName)
	}

	// run retries on its own: the disk is full for one more try, then
	// frees up (the failed try removes its temp file, here the link).
	fillDisk(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	p.dirty <- struct{}{}
	want := p.inner.Versions()
	deadline := time.Now().Add(10 * saveInterval)
	for !maps.Equal(savedVersions(t, dir), want) {
		if time.Now().After(deadline) {
			t.Fatalf("after %v the file holds %v, want %v (%d failed saves)", 10*saveInterval, savedVersions(t, dir), want, p.SaveFailures())
		}
		time.Sleep(50 * time.Millisecond) // polling the file: nothing to wait on
	}
	cancel()
	<-done
	if n := p.SaveFailures(); n != 2 {
		t.Fatalf("%d save failures counted, want 2", n)
	}
}
