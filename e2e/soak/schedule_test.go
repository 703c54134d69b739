package soak

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestScheduleReplays(t *testing.T) {
	a := Schedule(42, 30*time.Minute, DefaultShape)
	b := Schedule(42, 30*time.Minute, DefaultShape)
	if d := cmp.Diff(a, b); d != "" {
		t.Fatalf("same seed, different schedule (-first +second):\n%s", d)
	}
	if c := Schedule(43, 30*time.Minute, DefaultShape); cmp.Equal(a, c) {
		t.Fatal("seeds 42 and 43 drew the same schedule")
	}
	// A shorter soak is a prefix of a longer one with the same seed: the
	// CI run's faults are the first faults of any longer run of its seed.
	short := Schedule(42, 3*time.Minute, DefaultShape)
	if len(short) == 0 || !cmp.Equal(short, a[:len(short)]) {
		t.Fatalf("3-minute schedule is not a prefix of the 30-minute one:\n%v\n%v", short, a[:min(len(a), len(short)+1)])
	}
}

func TestScheduleBounds(t *testing.T) {
	const d = 30 * time.Minute
	s := DefaultShape
	seen := map[Kind]int{}
	for seed := range uint64(20) {
		faults := Schedule(seed, d, s)
		prev := time.Duration(-1)
		for i, f := range faults {
			seen[f.Kind]++
			if f.Seq != i+1 || f.At < s.Warmup || f.At > d-s.Tail || f.At%(100*time.Millisecond) != 0 {
				t.Fatalf("seed %d: fault %v out of bounds", seed, f)
			}
			if prev >= 0 && (f.At-prev < s.MinGap || f.At-prev > s.MaxGap) {
				t.Fatalf("seed %d: gap %v before %v", seed, f.At-prev, f)
			}
			prev = f.At
			max := s.Replicas
			if f.Kind.OnNode() {
				max = s.Nodes
			}
			if f.Target < 0 || f.Target >= max {
				t.Fatalf("seed %d: target of %v", seed, f)
			}
			hold := f.Kind == AgentStop || f.Kind == ReplicaStop || f.Kind == APIServerStop || f.Kind == AgentCutOff || f.Kind == AgentStateDiskFull
			if hold != (f.Hold > 0) || f.Hold > 15*time.Second {
				t.Fatalf("seed %d: hold of %v", seed, f)
			}
		}
	}
	for _, k := range Kinds {
		if seen[k] == 0 {
			t.Errorf("no %s in 20 schedules of %v", k, d)
		}
	}
}

// TestScheduleOfOtherKinds: a shape's own kinds are all drawn, and only
// they; the VM bed's schedules do not change with the real bed's kinds
// (CI's seed keeps its faults).
func TestScheduleOfOtherKinds(t *testing.T) {
	s := DefaultShape
	s.Kinds = RealKinds
	allowed := map[Kind]bool{}
	for _, k := range RealKinds {
		allowed[k] = true
		if weights[k] == 0 {
			t.Errorf("%s has no weight", k)
		}
	}
	seen := map[Kind]int{}
	for seed := range uint64(20) {
		for _, f := range Schedule(seed, 30*time.Minute, s) {
			if !allowed[f.Kind] {
				t.Fatalf("seed %d: %v is not of the shape's kinds", seed, f)
			}
			seen[f.Kind]++
		}
	}
	for _, k := range RealKinds {
		if seen[k] == 0 {
			t.Errorf("no %s in 20 schedules", k)
		}
	}
	explicit := DefaultShape
	explicit.Kinds = Kinds
	if !cmp.Equal(Schedule(ciSeed, 30*time.Minute, DefaultShape), Schedule(ciSeed, 30*time.Minute, explicit)) {
		t.Error("nil Kinds and Kinds draw different schedules")
	}
}
