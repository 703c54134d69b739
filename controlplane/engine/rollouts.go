package engine

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/vsplane/vsplane/controlplane/model"
	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/controlplane/watch"
)

// Scheduler rollouts in the engine: every replica computes, from the
// rollouts' specs and the status the leader writes, which nodes each
// rollout reached (model.Rollout.Reaches) and gives each Service the
// rollouts that select it, newest first (translate.Input.Rollouts). The
// leader (package rollout) only moves the status on; it never tells
// replicas what to send.

// reached is one rollout's assignment, computed once per change.
type reached struct {
	r  *model.Rollout
	tr *translate.Rollout
	// version identifies the assignment (scheduler, flags, nodes): a
	// Service whose rollouts' versions did not change is not recomputed.
	version string
}

// applyRollouts records namespace and rollout changes; if anything that
// decides schedulers changed (rollouts, namespaces, or the node set or
// labels), it recomputes every assignment and marks the Services whose
// rollouts changed: on the nodes whose assignment changed when only the
// rollouts' node sets did (a step), else dirty. A step of 10% of 1,000
// nodes so recomputes 100 nodes' resources per selected Service, not
// 1,000 (BenchmarkRolloutStep).
func (e *Engine) applyRollouts(w *work, ch *watch.Changes) {
	for name, c := range ch.Namespaces {
		if c.Current == nil || c.Current.Value == nil {
			delete(e.namespaces, name)
			continue
		}
		e.namespaces[name] = c.Current.Value
	}
	for name, c := range ch.Rollouts {
		report(e, c.Current)
		if c.Current == nil || c.Current.Value == nil {
			delete(e.rollouts, name)
			continue
		}
		e.rollouts[name] = c.Current.Value
	}
	if len(ch.Namespaces) == 0 && len(ch.Rollouts) == 0 && len(ch.Nodes) == 0 {
		return
	}
	if len(e.rollouts) == 0 && len(e.reached) == 0 {
		return // nothing to decide, before or after
	}
	e.reached = e.reached[:0]
	for _, r := range e.rollouts {
		if !r.Applies() {
			continue
		}
		tr := &translate.Rollout{Name: r.Name, Scheduler: r.Scheduler, Flags: r.Flags, Nodes: map[string]struct{}{}}
		for name, ne := range e.nodes {
			if r.Reaches(ne.node) {
				tr.Nodes[name] = struct{}{}
			}
		}
		e.reached = append(e.reached, reached{r: r, tr: tr, version: assignmentVersion(tr)})
	}
	slices.SortFunc(e.reached, func(a, b reached) int { return model.CompareRollouts(a.r, b.r) })
	// Services with the same rollouts before and after share one node set.
	changed := map[[2]string]map[string]struct{}{}
	for key, se := range e.services {
		if se.svc == nil {
			continue
		}
		now, v := e.rolloutsFor(se.svc)
		if v == se.rolloutVersion {
			continue
		}
		pair := [2]string{se.rolloutVersion, v}
		nodes, seen := changed[pair]
		if !seen {
			nodes = nodesReassigned(se.in.Rollouts, now)
			changed[pair] = nodes
		}
		if nodes == nil {
			w.markDirty(key, time.Time{})
			continue
		}
		if w.nodesOnly == nil {
			w.nodesOnly = map[model.ServiceKey]map[string]struct{}{}
		}
		w.nodesOnly[key] = nodes
	}
}

// nodesReassigned returns the nodes whose scheduler can differ between a
// Service's rollouts before and after (newest first, as translate reads
// them), or nil when any node's can: a node's scheduler is that of the
// first rollout reaching it, so with the same rollouts (names, schedulers,
// flags, order) only the nodes some rollout reached or left change.
func nodesReassigned(before, after []*translate.Rollout) map[string]struct{} {
	if len(before) != len(after) {
		return nil
	}
	out := map[string]struct{}{}
	for i, b := range before {
		a := after[i]
		if a.Name != b.Name || a.Scheduler != b.Scheduler || !slices.Equal(a.Flags, b.Flags) {
			return nil
		}
		for n := range a.Nodes {
			if _, ok := b.Nodes[n]; !ok {
				out[n] = struct{}{}
			}
		}
		for n := range b.Nodes {
			if _, ok := a.Nodes[n]; !ok {
				out[n] = struct{}{}
			}
		}
	}
	return out
}

// rolloutsFor returns the rollouts that select svc, newest first, and a
// version of that list.
func (e *Engine) rolloutsFor(svc *model.Service) ([]*translate.Rollout, string) {
	var out []*translate.Rollout
	var versions []string
	nsLabels := e.namespaceLabels(svc.Key.Namespace)
	for _, rc := range e.reached {
		if rc.r.Selects(svc, nsLabels) {
			out = append(out, rc.tr)
			versions = append(versions, rc.version)
		}
	}
	return out, strings.Join(versions, ",")
}

// namespaceLabels returns a namespace's labels (nil if unknown).
func (e *Engine) namespaceLabels(namespace string) map[string]string {
	if ns := e.namespaces[namespace]; ns != nil {
		return ns.Labels
	}
	return nil
}

func assignmentVersion(tr *translate.Rollout) string {
	h := sha256.New()
	h.Write([]byte(tr.Name + "\x00" + tr.Scheduler + "\x00"))
	for _, f := range tr.Flags {
		h.Write([]byte(string(f) + ","))
	}
	for _, n := range slices.Sorted(maps.Keys(tr.Nodes)) {
		h.Write([]byte("\x00" + n))
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// RolloutNodes returns the nodes rollout name reached, sorted (nil if it
// does not apply): for the rollout controller and inspection.
func (e *Engine) RolloutNodes(name string) []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	for _, rc := range e.reached {
		if rc.r.Name == name {
			return slices.Sorted(maps.Keys(rc.tr.Nodes))
		}
	}
	return nil
}

// NodesMatching returns the known nodes a selector-bearing rollout selects,
// sorted by name (the rollout controller counts steps over them).
func (e *Engine) NodesMatching(r *model.Rollout) []*model.Node {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var out []*model.Node
	for _, ne := range e.nodes {
		if r.NodeSelector.Matches(labels.Set(ne.node.Labels)) {
			out = append(out, ne.node)
		}
	}
	slices.SortFunc(out, func(a, b *model.Node) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// ServicesSelected returns the Services rollout r selects, sorted (for the
// controller: their resources must be acknowledged).
func (e *Engine) ServicesSelected(r *model.Rollout) []model.ServiceKey {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var out []model.ServiceKey
	for key, se := range e.services {
		if se.svc == nil || se.svc.Scheduler != "" {
			continue // a Service with its own scheduler is not the rollout's
		}
		if r.Selects(se.svc, e.namespaceLabels(key.Namespace)) {
			out = append(out, key)
		}
	}
	slices.SortFunc(out, compareKeys)
	return out
}
