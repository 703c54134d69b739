package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/vsplane/vsplane/dataplane/client"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// stateFileName holds the last applied resources, so a restarted agent says
// Hello with the versions its kernel already carries and receives only what
// changed while it was down. Keep it on a tmpfs (/run): after a reboot the
// kernel is empty and so must the state be.
const stateFileName = "applied-state.pb"

// saveInterval bounds how often the state file is rewritten. A crash loses at
// most this much: the file is then older than the kernel, which only means
// the control plane resends a few resources.
const saveInterval = time.Second

// deltaResources is the field number of Delta.resources.
var deltaResources = (&vsplanev1.Delta{}).ProtoReflect().Descriptor().Fields().ByName("resources").Number()

// persistentApplier wraps the reconciler: it restores the previously applied
// resources at start and saves them after applies.
//
// On restart the reconciler knows nothing, and its first Apply is taken as the
// node's full state. So the first Delta after a restore is widened to the
// restored resources plus the Delta's changes, with replace_all set: the
// reconciler compares all of it with the kernel and writes only what differs.
type persistentApplier struct {
	inner client.Applier
	path  string
	log   *zap.Logger

	mu       sync.Mutex
	restored map[string]*vsplanev1.Resource // until the first Apply
	known    map[string]storedResource      // latest content seen per name
	dirty    chan struct{}
}

// storedResource is a resource as the state file will hold it: its version
// and its wire encoding. Keeping the decoded messages instead (a message per
// real server and ipset entry, each string allocated apart) cost about 3.5
// KB per Service of 2 ports × 10 endpoints, 35 MB at 10,000 Services: the
// largest part of the agent's heap. The encoding is a fifth of that, and
// save writes it as it is.
type storedResource struct {
	version string
	wire    []byte // deterministic encoding of the Resource
}

// encodeForState returns r as the state file holds it (ok false: r cannot be
// encoded, and is left out of the file).
func encodeForState(r *vsplanev1.Resource) (storedResource, bool) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return storedResource{}, false
	}
	return storedResource{version: r.GetVersion(), wire: b}, true
}

func newPersistentApplier(inner client.Applier, dir string, log *zap.Logger) (*persistentApplier, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	p := &persistentApplier{inner: inner, path: filepath.Join(dir, stateFileName), log: log,
		known: map[string]storedResource{}, dirty: make(chan struct{}, 1)}
	restored, err := loadState(p.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		// A damaged file costs one full resync, never wrong kernel state.
		log.Warn("ignoring unreadable state file; the control plane will resend everything", zap.String("path", p.path), zap.Error(err))
	default:
		p.restored = restored
		for n, r := range restored {
			if sr, ok := encodeForState(r); ok {
				p.known[n] = sr
			}
		}
		log.Info("restored applied state", zap.String("path", p.path), zap.Int("resources", len(restored)))
	}
	return p, nil
}

func loadState(path string) (map[string]*vsplanev1.Resource, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d vsplanev1.Delta
	if err := proto.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	out := map[string]*vsplanev1.Resource{}
	for _, r := range d.GetResources() {
		if r.GetName() == "" || r.GetVersion() == "" {
			return nil, fmt.Errorf("decode %s: resource without name or version", path)
		}
		out[r.GetName()] = r
	}
	return out, nil
}

// Versions implements client.Applier: before the first Apply, the restored
// versions; afterwards what the reconciler applied.
func (p *persistentApplier) Versions() map[string]string {
	p.mu.Lock()
	restored := p.restored
	p.mu.Unlock()
	if restored != nil {
		out := make(map[string]string, len(restored))
		for n, r := range restored {
			out[n] = r.GetVersion()
		}
		return out
	}
	return p.inner.Versions()
}

// Apply implements client.Applier.
func (p *persistentApplier) Apply(ctx context.Context, delta *vsplanev1.Delta) *vsplanev1.Ack {
	p.mu.Lock()
	if p.restored != nil && delta != nil {
		delta = widen(p.restored, delta)
		p.restored = nil
	}
	for _, r := range delta.GetResources() {
		if sr, ok := encodeForState(r); ok {
			p.known[r.GetName()] = sr
		} else {
			// Left out of the file: a restart has it resent.
			delete(p.known, r.GetName())
			p.log.Warn("cannot encode a resource for the state file", zap.String("resource", r.GetName()))
		}
	}
	for _, n := range delta.GetRemoved() {
		delete(p.known, n)
	}
	p.mu.Unlock()
	ack := p.inner.Apply(ctx, delta)
	select {
	case p.dirty <- struct{}{}:
	default:
	}
	return ack
}

// widen merges restored resources with the first Delta into a full state.
func widen(restored map[string]*vsplanev1.Resource, d *vsplanev1.Delta) *vsplanev1.Delta {
	if d.GetReplaceAll() {
		return d
	}
	all := maps.Clone(restored)
	for _, n := range d.GetRemoved() {
		delete(all, n)
	}
	for _, r := range d.GetResources() {
		all[r.GetName()] = r
	}
	out := &vsplanev1.Delta{Nonce: d.GetNonce(), SystemVersion: d.GetSystemVersion(), ReplaceAll: true, TriggerTimes: d.GetTriggerTimes()}
	for _, n := range slices.Sorted(maps.Keys(all)) {
		out.Resources = append(out.Resources, all[n])
	}
	return out
}

// run saves the state after applies, at most once per saveInterval, and once
// more when ctx ends.
func (p *persistentApplier) run(ctx context.Context) {
	t := time.NewTicker(saveInterval)
	defer t.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			if pending {
				p.save()
			}
			return
		case <-p.dirty:
			pending = true
		case <-t.C:
			if pending {
				p.save()
				pending = false
			}
		}
	}
}

// save writes the applied resources atomically (temp file + rename): a
// Delta holding them in name order, encoded as proto.Marshal with
// Deterministic would (each resource's stored encoding as field
// resources), without decoding anything.
func (p *persistentApplier) save() {
	versions := p.inner.Versions()
	names := slices.Sorted(maps.Keys(versions))
	p.mu.Lock()
	size := 0
	for _, n := range names {
		if r, ok := p.known[n]; ok && r.version == versions[n] {
			size += protowire.SizeTag(deltaResources) + protowire.SizeBytes(len(r.wire))
		}
	}
	b := make([]byte, 0, size)
	for _, n := range names {
		if r, ok := p.known[n]; ok && r.version == versions[n] {
			b = protowire.AppendTag(b, deltaResources, protowire.BytesType)
			b = protowire.AppendBytes(b, r.wire)
		}
	}
	p.mu.Unlock()
	tmp := p.path + ".tmp"
	err := os.WriteFile(tmp, b, 0o600)
	if err == nil {
		err = os.Rename(tmp, p.path)
	}
	if err != nil {
		p.log.Warn("cannot save applied state; a restart will resync everything", zap.Error(err))
	}
}
