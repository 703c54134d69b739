package stream

import (
	"testing"
	"time"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func service(vs []int, entries int) *vsplanev1.Resource {
	st := &vsplanev1.ServiceState{}
	for _, rs := range vs {
		v := &vsplanev1.VirtualServer{}
		for range rs {
			v.RealServers = append(v.RealServers, &vsplanev1.RealServer{})
		}
		st.VirtualServers = append(st.VirtualServers, v)
	}
	for range entries {
		st.IpsetEntries = append(st.IpsetEntries, &vsplanev1.IPSetEntry{})
	}
	return &vsplanev1.Resource{Name: "service/default/s", Body: &vsplanev1.Resource_Service{Service: st}}
}

func TestResourceCost(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    *vsplanev1.Resource
		want int
	}{
		{"node settings", &vsplanev1.Resource{Body: &vsplanev1.Resource_NodeSettings{NodeSettings: &vsplanev1.NodeSettings{}}}, 1},
		{"no body", &vsplanev1.Resource{}, 1},
		{"service without virtual servers", service(nil, 0), 1},
		// 1 + (1+3) + (1+0) + 4 ipset entries.
		{"two virtual servers", service([]int{3, 0}, 4), 10},
	} {
		if got := ResourceCost(tc.r); got != tc.want {
			t.Errorf("%s: ResourceCost = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestFitTakesWholeResourcesInOrder(t *testing.T) {
	of := func(costs ...int) []Entry {
		var out []Entry
		for _, c := range costs {
			out = append(out, Entry{Resource: service([]int{c - 2}, 0)}) // 1 + (1 + c-2)
		}
		return out
	}
	for _, tc := range []struct {
		name          string
		costs         []int
		budget        int
		wantN, wantCo int
	}{
		{"nothing", nil, 10, 0, 0},
		{"all fit", []int{3, 3}, 10, 2, 6},
		{"exact fit", []int{5, 5, 2}, 10, 2, 10},
		{"stops at the first that does not fit", []int{3, 9, 2}, 10, 1, 3},
		{"oversize first goes alone", []int{25, 2}, 10, 1, 25},
		{"oversize later waits", []int{2, 25}, 10, 1, 2},
	} {
		n, c := fit(of(tc.costs...), tc.budget)
		if n != tc.wantN || c != tc.wantCo {
			t.Errorf("%s: fit = %d resources, cost %d; want %d, %d", tc.name, n, c, tc.wantN, tc.wantCo)
		}
	}
}

func TestApplyRateBudget(t *testing.T) {
	const target = 250 * time.Millisecond
	t.Run("initial", func(t *testing.T) {
		if got := newApplyRate(target, 256, 50_000).budget(); got != InitialDeltaOps {
			t.Fatalf("budget = %d, want %d", got, InitialDeltaOps)
		}
		if got := newApplyRate(target, 1, 100).budget(); got != 100 {
			t.Fatalf("initial budget above max = %d, want 100", got)
		}
		if got := newApplyRate(target, 5000, 50_000).budget(); got != 5000 {
			t.Fatalf("initial budget below min = %d, want 5000", got)
		}
	})
	t.Run("fast agent grows it up to max", func(t *testing.T) {
		r := newApplyRate(target, 256, 50_000)
		r.observe(4096, 100*time.Millisecond) // 40,960 ops/s
		if got := r.budget(); got != 10_240 {
			t.Fatalf("budget = %d, want 10240 (40960/s x 250ms)", got)
		}
		prev := r.budget()
		for range 20 {
			r.observe(uint64(prev), 10*time.Millisecond)
			if b := r.budget(); b < prev {
				t.Fatalf("budget shrank from %d to %d for a faster agent", prev, b)
			}
			prev = r.budget()
		}
		if prev != 50_000 {
			t.Fatalf("budget = %d, want the max 50000", prev)
		}
	})
	t.Run("slow agent shrinks it down to min", func(t *testing.T) {
		r := newApplyRate(target, 256, 50_000)
		r.observe(4096, 2*time.Second) // 2,048 ops/s
		if got := r.budget(); got != 512 {
			t.Fatalf("budget = %d, want 512 (2048/s x 250ms)", got)
		}
		for range 20 {
			r.observe(512, 10*time.Second)
		}
		if got := r.budget(); got != 256 {
			t.Fatalf("budget = %d, want the min 256", got)
		}
	})
	t.Run("moving average", func(t *testing.T) {
		r := newApplyRate(time.Second, 1, 1_000_000)
		r.observe(1000, time.Second)
		r.observe(5000, time.Second) // 1000 + (5000-1000)/4
		if got := r.budget(); got != 2000 {
			t.Fatalf("budget = %d, want 2000", got)
		}
		r.observe(500, time.Second) // 2000 + (500-2000)/4
		if got := r.budget(); got != 1625 {
			t.Fatalf("budget = %d, want 1625", got)
		}
	})
	t.Run("ignores tiny and untimed samples", func(t *testing.T) {
		r := newApplyRate(time.Second, 1, 1_000_000)
		r.observe(minRateSampleOps-1, time.Hour)
		r.observe(1_000_000, 0)
		r.observe(1_000_000, -time.Second)
		if got := r.budget(); got != InitialDeltaOps {
			t.Fatalf("budget = %d, want the initial %d", got, InitialDeltaOps)
		}
	})
}
