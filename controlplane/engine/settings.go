package engine

import (
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
)

// Live fleet settings: SetTranslate records new settings; the next Apply
// (run by the watcher, which the caller asks for a run: watch.Watcher.Trigger)
// switches to them under the engine's lock, rewrites every node's
// node/settings and recomputes the Services whose translation reads a
// changed field (translate.UsesNodePortAddresses). Nothing else is touched:
// the store sends only what changed.

// SetTranslate makes cfg (defaults filled in) the fleet settings from the
// next Apply on. It never waits for a running Apply; settings set twice
// before an Apply take the last. Pending reports true until then, so the
// watcher runs an Apply even without object changes.
func (e *Engine) SetTranslate(cfg translate.Config) {
	cfg = cfg.WithDefaults()
	e.nextMu.Lock()
	e.next = &cfg
	e.nextMu.Unlock()
}

func (e *Engine) settingsPending() bool {
	e.nextMu.Lock()
	defer e.nextMu.Unlock()
	return e.next != nil
}

// settingsChange is what takeTranslate switched: nil if nothing.
type settingsChange struct {
	old translate.Config
}

// takeTranslate switches to the settings SetTranslate left, before the
// Apply translates anything, so all of this Apply uses them. Called with
// e.mu held.
func (e *Engine) takeTranslate() *settingsChange {
	e.nextMu.Lock()
	next := e.next
	e.next = nil
	e.nextMu.Unlock()
	if next == nil || reflect.DeepEqual(*next, e.cfg.Translate) {
		return nil
	}
	old := e.cfg.Translate
	e.cfg.Translate = *next
	return &settingsChange{old: old}
}

// applySettings writes the consequences of a settings change: every
// node's settings (those in nodes were written by applyNodes already) and
// the Services that read a changed field. Called with e.mu held, after
// applyNodes.
func (e *Engine) applySettings(w *work, c *settingsChange, nodes map[string]watch.Change[model.Node]) {
	if c == nil {
		return
	}
	for name, ne := range e.nodes {
		if _, done := nodes[name]; !done {
			e.setNodeSettings(w.b, ne.node, time.Time{})
		}
	}
	services := 0
	if !translate.NodePortSelectionEqual(c.old, e.cfg.Translate) {
		for k, se := range e.services {
			if translate.UsesNodePortAddresses(se.svc) {
				w.markDirty(k, time.Time{})
				services++
			}
		}
	}
	e.log.Info("fleet settings changed", zap.Int("nodes", len(e.nodes)), zap.Int("servicesRecomputed", services),
		zap.String("defaultScheduler", e.cfg.Translate.DefaultScheduler))
}
