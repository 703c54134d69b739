package agent

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// FuzzSaveOverADamagedFile: whatever the previous state file holds (cut
// short, corrupted, written by something else), save never panics and
// writes a file that loads, holding only resources at the version the
// reconciler applied.
func FuzzSaveOverADamagedFile(f *testing.F) {
	good, err := proto.MarshalOptions{Deterministic: true}.Marshal(&vsplanev1.Delta{Resources: []*vsplanev1.Resource{memService(1), memService(2), memService(3)}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte("not a protobuf"))
	dir := f.TempDir() // one per process: its inputs run one at a time
	f.Fuzz(func(t *testing.T, prev []byte) {
		_ = os.Remove(filepath.Join(dir, stateFileName+".tmp"))
		rec := &versionsApplier{held: map[string]string{}}
		p, err := newPersistentApplier(rec, dir, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		// Applied after start: the previous file is read only by save.
		d := &vsplanev1.Delta{Nonce: "1", Resources: []*vsplanev1.Resource{memService(2), memSettings()}}
		if p.restored != nil {
			p.restored = nil // whatever the file restored, this Delta is the state
			d.ReplaceAll = true
		}
		if err := os.WriteFile(filepath.Join(dir, stateFileName), prev, 0o600); err != nil {
			t.Fatal(err)
		}
		p.Apply(context.Background(), d)
		p.save()
		got, err := loadState(filepath.Join(dir, stateFileName))
		if err != nil {
			t.Fatalf("the saved file does not load: %v", err)
		}
		applied := rec.Versions()
		for name, r := range got {
			if applied[name] != r.GetVersion() {
				t.Fatalf("the file holds %s at %q, the reconciler %q", name, r.GetVersion(), applied[name])
			}
		}
		for name, v := range applied {
			if got[name].GetVersion() != v {
				t.Fatalf("the file lost %s, applied and pending", name)
			}
		}
	})
}

// versionsApplier holds what it is given (the state file's view of a
// reconciler, without a kernel: fuzzing runs it thousands of times).
type versionsApplier struct{ held map[string]string }

func (a *versionsApplier) Apply(_ context.Context, d *vsplanev1.Delta) *vsplanev1.Ack {
	if d.GetReplaceAll() {
		clear(a.held)
	}
	for _, n := range d.GetRemoved() {
		delete(a.held, n)
	}
	for _, r := range d.GetResources() {
		a.held[r.GetName()] = r.GetVersion()
	}
	return &vsplanev1.Ack{Nonce: d.GetNonce(), Status: vsplanev1.AckStatus_ACK_STATUS_ACK}
}

func (a *versionsApplier) Versions() map[string]string { return maps.Clone(a.held) }
