package stream

import (
	"testing"
	"time"
)

// Every (phase, event) pair: the transitions the state machine allows and
// the state each leads to; every other pair is refused and leaves the
// state as it was.
func TestSessionStateTransitions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0.Add(time.Minute)
	claim := resumeClaim{systemVersion: "sv", count: 3}
	st := func(p phase) sessionState { return sessionState{phase: p} }

	type key struct {
		from sessionState
		ev   event
	}
	// The states each phase is tried in: with and without the data it can
	// carry.
	froms := []sessionState{
		{phase: phaseWaitReady},
		{phase: phaseWaitReady, claim: claim},
		{phase: phaseResolve, claim: claim},
		{phase: phaseVersions, since: t0},
		{phase: phaseFirst},
		{phase: phaseStreaming},
		{phase: phaseUnknown, since: t0, back: phaseResolve, claim: claim},
		{phase: phaseUnknown, since: t0, back: phaseFirst},
		{phase: phaseUnknown, since: t0, back: phaseStreaming},
	}
	allowed := map[key]sessionState{
		// The Hello decides where a ready stream starts.
		{sessionState{phase: phaseWaitReady}, evReady}:               st(phaseFirst),
		{sessionState{phase: phaseWaitReady, claim: claim}, evReady}: {phase: phaseResolve, claim: claim},
		// The first full pass settles a claimed system version.
		{sessionState{phase: phaseResolve, claim: claim}, evClaimMatches}: st(phaseFirst),
		{sessionState{phase: phaseResolve, claim: claim}, evClaimDiffers}: {phase: phaseVersions, since: now},
		{sessionState{phase: phaseVersions, since: t0}, evHeldVersions}:   st(phaseFirst),
		// The first Delta starts streaming.
		{st(phaseFirst), evDeltaQueued}:     st(phaseStreaming),
		{st(phaseStreaming), evDeltaQueued}: st(phaseStreaming),
		// The node disappears: the wait starts now and remembers where
		// to go back to (with the claim still to settle).
		{sessionState{phase: phaseResolve, claim: claim}, evNodeAbsent}: {phase: phaseUnknown, since: now, back: phaseResolve, claim: claim},
		{st(phaseFirst), evNodeAbsent}:                                  {phase: phaseUnknown, since: now, back: phaseFirst},
		{st(phaseStreaming), evNodeAbsent}:                              {phase: phaseUnknown, since: now, back: phaseStreaming},
		// Still absent: the wait keeps its start.
		{sessionState{phase: phaseUnknown, since: t0, back: phaseResolve, claim: claim}, evNodeAbsent}: {phase: phaseUnknown, since: t0, back: phaseResolve, claim: claim},
		{sessionState{phase: phaseUnknown, since: t0, back: phaseFirst}, evNodeAbsent}:                 {phase: phaseUnknown, since: t0, back: phaseFirst},
		{sessionState{phase: phaseUnknown, since: t0, back: phaseStreaming}, evNodeAbsent}:             {phase: phaseUnknown, since: t0, back: phaseStreaming},
		// The node appears: back to where the stream was.
		{sessionState{phase: phaseUnknown, since: t0, back: phaseResolve, claim: claim}, evNodePresent}: {phase: phaseResolve, claim: claim},
		{sessionState{phase: phaseUnknown, since: t0, back: phaseFirst}, evNodePresent}:                 st(phaseFirst),
		{sessionState{phase: phaseUnknown, since: t0, back: phaseStreaming}, evNodePresent}:             st(phaseStreaming),
		// A full read of a known node changes nothing elsewhere.
		{sessionState{phase: phaseResolve, claim: claim}, evNodePresent}: {phase: phaseResolve, claim: claim},
		{st(phaseFirst), evNodePresent}:                                  st(phaseFirst),
		{st(phaseStreaming), evNodePresent}:                              st(phaseStreaming),
	}
	tried := 0
	for _, from := range froms {
		for ev := range numEvents {
			got, ok := from.next(ev, now)
			want, allow := allowed[key{from, ev}]
			if allow {
				tried++
			}
			switch {
			case ok != allow:
				t.Errorf("%v --%v--> ok=%v, want %v", from.phase, ev, ok, allow)
			case allow && got != want:
				t.Errorf("%v (%+v) --%v--> %+v, want %+v", from.phase, from, ev, got, want)
			case !allow && got != from:
				t.Errorf("refused %v --%v--> changed the state to %+v", from.phase, ev, got)
			}
		}
	}
	if tried != len(allowed) {
		t.Errorf("the table has %d transitions, %d of them from the states tried", len(allowed), tried)
	}
}

// Only the phases before the first Delta and the unknown-node wait read the
// node whole.
func TestPhaseFullPass(t *testing.T) {
	want := map[phase]bool{phaseResolve: true, phaseFirst: true, phaseUnknown: true}
	for p := range phaseUnknown + 1 {
		if got := p.fullPass(); got != want[p] {
			t.Errorf("%v.fullPass() = %v, want %v", p, got, want[p])
		}
	}
}
