package client

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func heldServices(n int) map[string]string {
	m := map[string]string{"node/settings": "s"}
	for i := range n {
		m[fmt.Sprintf("service/ns/s%02d", i)] = "v"
	}
	return m
}

func removing(n int) *vsplanev1.Delta {
	d := &vsplanev1.Delta{Removed: []string{"node/settings", "service/ns/not-held"}}
	for i := range n {
		d.Removed = append(d.Removed, fmt.Sprintf("service/ns/s%02d", i))
	}
	return d
}

func TestRemovalGuard(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var reports []*vsplanev1.HeldRemoval
	g := removalGuard{maxShare: 0.5, confirm: 30 * time.Second, log: zaptest.NewLogger(t),
		notify: func(h *vsplanev1.HeldRemoval) { reports = append(reports, h) }}
	held := heldServices(10)

	// Half is not more than half: applied. Names not held and non-Service
	// resources do not count.
	if d := g.check(removing(5), held, "a", t0); d != 0 {
		t.Fatalf("removing 5 of 10: hold %v, want none", d)
	}
	// Six of ten: held for the confirmation period.
	if d := g.check(removing(6), held, "a", t0); d != 30*time.Second {
		t.Fatalf("removing 6 of 10: hold %v, want 30s", d)
	}
	if len(reports) != 1 || reports[0].GetRemovals() != 6 || reports[0].GetHeldServices() != 10 || reports[0].GetTarget() != "a" {
		t.Fatalf("reports %v", reports)
	}
	// Asked again early (reconnect for another reason): wait the rest.
	if d := g.check(removing(7), held, "b", t0.Add(10*time.Second)); d != 20*time.Second {
		t.Fatalf("asked again after 10s: hold %v, want 20s", d)
	}
	// Still asked for after the period: confirmed and applied.
	if d := g.check(removing(7), held, "b", t0.Add(31*time.Second)); d != 0 {
		t.Fatalf("confirmed removal held %v", d)
	}
	if last := reports[len(reports)-1]; last != nil {
		t.Fatalf("the hold must be reported cleared, got %v", last)
	}

	// A hold that the control plane no longer asks for is dropped.
	if d := g.check(removing(9), held, "a", t0.Add(time.Hour)); d == 0 {
		t.Fatal("removing 9 of 10 not held")
	}
	if d := g.check(removing(1), held, "b", t0.Add(time.Hour+time.Second)); d != 0 || g.held != nil {
		t.Fatalf("sane Delta after a hold: hold %v, state %v", d, g.held)
	}

	// replace_all that leaves most Services out counts as removal.
	all := &vsplanev1.Delta{ReplaceAll: true, Resources: []*vsplanev1.Resource{{Name: "service/ns/s00"}}}
	if d := g.check(all, held, "a", t0.Add(2*time.Hour)); d == 0 {
		t.Fatal("replace_all keeping 1 of 10 Services not held")
	}
	// Nothing held, or the guard disabled: never held.
	g2 := removalGuard{maxShare: 0.5, confirm: time.Second, log: zaptest.NewLogger(t)}
	if d := g2.check(removing(0), map[string]string{}, "a", t0); d != 0 {
		t.Fatal("empty node held")
	}
	g3 := removalGuard{maxShare: 1, confirm: time.Second, log: zaptest.NewLogger(t)}
	if d := g3.check(removing(10), held, "a", t0); d != 0 {
		t.Fatal("disabled guard held")
	}
}
