package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
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

// Field numbers of Delta.resources, Resource.name and Resource.version.
var (
	deltaResources  = (&vsplanev1.Delta{}).ProtoReflect().Descriptor().Fields().ByName("resources").Number()
	resourceName    = (&vsplanev1.Resource{}).ProtoReflect().Descriptor().Fields().ByName("name").Number()
	resourceVersion = (&vsplanev1.Resource{}).ProtoReflect().Descriptor().Fields().ByName("version").Number()
)

// persistentApplier wraps the reconciler: it restores the previously applied
// resources at start and saves them after applies.
//
// On restart the reconciler knows nothing, and its first Apply is taken as the
// node's full state. So the first Delta after a restore is widened to the
// restored resources plus the Delta's changes, with replace_all set: the
// reconciler compares all of it with the kernel and writes only what differs.
//
// The file is the only whole copy of the applied resources: the applier holds
// the encodings of what changed since the last save (pending), and save
// streams the previous file, replacing those, into the new one. Holding an
// encoding of every resource instead cost 9 MB of the agent's live heap at
// 10,000 Services (plus that much again while saving), beside the file's own
// 9 MB on the tmpfs.
type persistentApplier struct {
	inner client.Applier
	path  string
	log   *zap.Logger

	mu       sync.Mutex
	restored map[string]*vsplanev1.Resource // until the first Apply
	// pending are the encodings received since the last save, by name: the
	// latest content of each. One whose version the reconciler does not hold
	// yet (still being applied, or refused) stays pending.
	pending map[string]storedResource
	dirty   chan struct{}
	// saveFailures counts failed saves (monotonic); failing is true while
	// the latest save failed (the first failure of a streak is logged as a
	// warning, the recovery once).
	saveFailures atomic.Uint64
	failing      bool
}

// storedResource is a resource as the state file holds it: its version and
// its deterministic wire encoding.
type storedResource struct {
	version string
	wire    []byte
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
		pending: map[string]storedResource{}, dirty: make(chan struct{}, 1)}
	restored, err := loadState(p.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		// A damaged file costs one full resync, never wrong kernel state;
		// the next save must not carry any of it over.
		log.Warn("ignoring unreadable state file; the control plane will resend everything", zap.String("path", p.path), zap.Error(err))
		if err := os.Remove(p.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove unreadable state file: %w", err)
		}
	default:
		p.restored = restored
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
	if delta.GetReplaceAll() {
		// Everything else is gone: nothing pending of it may reach the file.
		clear(p.pending)
	}
	for _, n := range delta.GetRemoved() {
		delete(p.pending, n)
	}
	// The Delta's own resources only: restored ones a widened first Delta
	// adds are in the file already, as they are.
	for _, r := range delta.GetResources() {
		if sr, ok := encodeForState(r); ok {
			p.pending[r.GetName()] = sr
		} else {
			// Left out of the file: a restart has it resent.
			delete(p.pending, r.GetName())
			p.log.Warn("cannot encode a resource for the state file", zap.String("resource", r.GetName()))
		}
	}
	if p.restored != nil && delta != nil {
		delta = widen(p.restored, delta)
		p.restored = nil
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
// more when ctx ends. A save that failed (a full or read-only disk) is tried
// again every saveInterval until one succeeds, changes or not: meanwhile the
// kernel is programmed and acknowledged as usual, and a restart only resyncs
// what the older file lacks.
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
				pending = !p.save()
			}
		}
	}
}

// save writes the applied resources atomically (temp file + rename): a
// Delta holding them in name order, encoded as proto.Marshal with
// Deterministic would. Each resource the reconciler holds is taken from
// pending if its version is the applied one, else from the previous file
// if its version there is; a resource in neither is left out (a restart
// has it resent). Nothing is decoded: the previous file is read one
// resource at a time. save runs in one goroutine at a time (run's).
func (p *persistentApplier) save() bool {
	versions := p.inner.Versions()
	// An Apply between these two lines leaves its resources pending with a
	// version versions does not hold yet: they stay pending (below).
	p.mu.Lock()
	pending := p.pending
	p.pending = make(map[string]storedResource, len(pending)/8)
	p.mu.Unlock()

	written, err := p.write(versions, pending)
	switch {
	case err != nil:
		p.saveFailures.Add(1)
		if !p.failing {
			p.log.Warn("cannot save applied state; retrying every second (the kernel is unaffected; a restart meanwhile resyncs what the file lacks)",
				zap.String("path", p.path), zap.Error(err))
		}
		p.failing = true
	case p.failing:
		p.log.Info("applied state saved again", zap.String("path", p.path), zap.Uint64("failed_saves", p.saveFailures.Load()))
		p.failing = false
	}
	if err != nil {
		written = nil // written into a temp file that never became the state file
	}
	// What did not reach the file stays pending, unless a newer Apply
	// replaced or removed it meanwhile (Apply only writes p.pending).
	p.mu.Lock()
	for n, sr := range pending {
		if written[n] {
			continue
		}
		if _, newer := p.pending[n]; !newer {
			p.pending[n] = sr
		}
	}
	p.mu.Unlock()
	return err == nil
}

// SaveFailures is the number of failed saves of the state file (monotonic).
func (p *persistentApplier) SaveFailures() uint64 { return p.saveFailures.Load() }

// write streams the previous file and pending into a new file and returns
// the names written from pending.
func (p *persistentApplier) write(versions map[string]string, pending map[string]storedResource) (map[string]bool, error) {
	written := map[string]bool{}
	var prev *stateReader
	if f, err := os.Open(p.path); err == nil {
		defer f.Close()
		prev = &stateReader{r: bufio.NewReaderSize(f, 64<<10)}
	} else if !errors.Is(err, fs.ErrNotExist) {
		p.log.Warn("cannot read the previous state file; resources not changed since are left out of the new one", zap.Error(err))
	}
	tmp := p.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return written, err
	}
	renamed := false
	defer func() {
		// A half-written temp file (a full disk) would hold the space the
		// next try needs.
		if !renamed {
			_ = os.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(f, 64<<10)
	var buf []byte
	emit := func(wire []byte) error {
		buf = protowire.AppendTag(buf[:0], deltaResources, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(len(wire)))
		if _, err := w.Write(buf); err != nil {
			return err
		}
		_, err := w.Write(wire)
		return err
	}
	for _, n := range slices.Sorted(maps.Keys(versions)) {
		want := versions[n]
		var from []byte
		if sr, ok := pending[n]; ok && sr.version == want {
			from = sr.wire
			written[n] = true
		} else if prev != nil {
			if old, ok := prev.find(n); ok && old.version == want {
				from = old.wire
			}
		}
		if from == nil {
			continue
		}
		if err := emit(from); err != nil {
			f.Close()
			return written, err
		}
	}
	if prev != nil && prev.err != nil {
		p.log.Warn("previous state file damaged; resources after the damage are left out of the new one", zap.Error(prev.err))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return written, err
	}
	if err := f.Close(); err != nil {
		return written, err
	}
	if err := os.Rename(tmp, p.path); err != nil {
		return written, err
	}
	renamed = true
	return written, nil
}

// stateReader reads a state file one resource at a time, for lookups by
// name in ascending order (the order save writes).
type stateReader struct {
	r    *bufio.Reader
	cur  storedResource // the resource read last; wire nil: none
	name string
	buf  []byte
	err  error // a damaged file ends the reading
	done bool
}

// find returns the resource called name, advancing past every resource
// before it in name order. Resources out of order are skipped.
func (s *stateReader) find(name string) (storedResource, bool) {
	for !s.done && (s.cur.wire == nil || s.name < name) {
		s.next()
	}
	if s.cur.wire != nil && s.name == name {
		return s.cur, true
	}
	return storedResource{}, false
}

// next reads the following resource into cur (cur.wire nil and done at the
// end or on damage).
func (s *stateReader) next() {
	last := s.name
	s.cur = storedResource{}
	for {
		num, typ, err := readTag(s.r)
		if err != nil {
			s.fail(err)
			return
		}
		if num != deltaResources || typ != protowire.BytesType {
			s.fail(fmt.Errorf("unexpected field %d of type %d", num, typ))
			return
		}
		n, err := binary.ReadUvarint(s.r)
		if err != nil || n > 1<<30 {
			s.fail(fmt.Errorf("resource length: %v", err))
			return
		}
		s.buf = slices.Grow(s.buf[:0], int(n))[:n]
		if _, err := io.ReadFull(s.r, s.buf); err != nil {
			s.fail(err)
			return
		}
		name, version, err := nameAndVersion(s.buf)
		if err != nil {
			s.fail(err)
			return
		}
		if last != "" && name <= last {
			continue // out of order (never written so): left out
		}
		s.name, s.cur = name, storedResource{version: version, wire: s.buf}
		return
	}
}

func (s *stateReader) fail(err error) {
	s.done = true
	if !errors.Is(err, io.EOF) {
		s.err = err
	}
}

// readTag reads a field tag from r (io.EOF at a clean end).
func readTag(r io.ByteReader) (protowire.Number, protowire.Type, error) {
	v, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(v)
	if num < protowire.MinValidNumber {
		return 0, 0, fmt.Errorf("invalid field number %d", num)
	}
	return num, typ, nil
}

// nameAndVersion reads Resource.name and Resource.version from an encoded
// Resource without decoding the rest.
func nameAndVersion(b []byte) (name, version string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", protowire.ParseError(n)
		}
		b = b[n:]
		if (num == resourceName || num == resourceVersion) && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", "", protowire.ParseError(m)
			}
			if num == resourceName {
				name = string(v)
			} else {
				version = string(v)
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return "", "", protowire.ParseError(m)
		}
		b = b[m:]
	}
	if name == "" || version == "" {
		return "", "", errors.New("resource without name or version")
	}
	return name, version, nil
}
