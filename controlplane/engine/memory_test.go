package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// memoryPoint is one size of the state-memory sweep.
type memoryPoint struct {
	Services   int     `json:"services"`
	Nodes      int     `json:"nodes"`
	Endpoints  int     `json:"endpoints_per_service"`
	HeapMB     float64 `json:"state_heap_mb"`
	SyncS      float64 `json:"initial_sync_s"`
	Slots      int     `json:"node_slots"`
	Exceptions int     `json:"per_node_exceptions"`
	Distinct   int     `json:"distinct_values"`
	// PerNodeMapsMB is the baseline measured in the same run: what one
	// map per node (name -> value, trigger) holding the same slots costs on
	// top; the store kept exactly that before. 0: not measured (too big).
	PerNodeMapsMB float64 `json:"per_node_maps_baseline_mb,omitempty"`
}

// maxBaselineSlots bounds the per-node-maps baseline (it is built for real).
const maxBaselineSlots = 20_000_000

// measureMemory builds the state at one size and measures it, and the
// per-node-map baseline when it is small enough.
func measureMemory(tb testing.TB, services, endpoints, nodes int) memoryPoint {
	s := buildState(tb, services, endpoints, nodes)
	st := s.store.Stats()
	p := memoryPoint{Services: services, Nodes: nodes, Endpoints: endpoints, HeapMB: mb(s.heapBytes),
		SyncS: s.took.Seconds(), Slots: st.Slots, Exceptions: st.Exceptions, Distinct: st.Distinct}
	if st.Slots <= maxBaselineSlots {
		p.PerNodeMapsMB = mb(perNodeMapsBytes(s))
	}
	runtime.KeepAlive(s)
	return p
}

// perNodeMapsBytes measures the heap a map per node of the same slots
// takes: the layout the store used before its holdings were kept per name.
func perNodeMapsBytes(s builtState) uint64 {
	type slot struct {
		res     *vsplanev1.Resource
		trigger int64
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	maps := map[string]map[string]slot{}
	for _, n := range s.store.Nodes() {
		list, _, _ := s.store.List(n)
		m := make(map[string]slot, len(list))
		for _, e := range list {
			m[e.Resource.GetName()] = slot{res: e.Resource, trigger: e.Trigger.UnixNano()}
		}
		maps[n] = m
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(maps)
	return after.HeapAlloc - before.HeapAlloc
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }

// TestStateMemoryTiny runs the memory measurement at a tiny size (so the
// benchmark cannot rot) and checks what makes memory flat in nodes: only
// values that differ from their name's common value are stored per node,
// and nodes without endpoints store none.
func TestStateMemoryTiny(t *testing.T) {
	const services, endpoints, nodes = 30, 2, 12
	p := measureMemory(t, services, endpoints, nodes)
	names := services + 1 // + node/settings
	if p.Slots != names*nodes {
		t.Errorf("slots %d, want %d (every node holds every Service and its settings)", p.Slots, names*nodes)
	}
	// Every distinct value beyond one per name is held by one node as an
	// exception (per-node variants, per-node settings), and nothing else is.
	if want := p.Distinct - names; p.Exceptions != want {
		t.Errorf("exceptions %d, want %d (distinct values %d - names %d)", p.Exceptions, want, p.Distinct, names)
	}
	if p.Exceptions >= p.Slots/2 {
		t.Errorf("exceptions %d of %d slots: the holdings do not compact", p.Exceptions, p.Slots)
	}
	if p.PerNodeMapsMB <= 0 {
		t.Errorf("baseline not measured: %+v", p)
	}
}

// BenchmarkStateMemory sweeps the control plane's state memory against
// nodes (100 -> 5,000 at 10,000 Services) and against Services (1,000 ->
// 20,000 at 1,000 nodes), 10 endpoints per Service, with the per-node-map
// baseline measured in the same run, and writes bench/results/memory.json,
// memory.md and memory.png. Run with -benchtime 1x (make bench).
func BenchmarkStateMemory(b *testing.B) {
	var byNodes, byServices []memoryPoint
	for range b.N {
		byNodes, byServices = nil, nil
		for _, n := range []int{100, 500, 1000, 2000, 5000} {
			byNodes = append(byNodes, measureMemory(b, 10000, 10, n))
			b.Logf("%+v", byNodes[len(byNodes)-1])
		}
		for _, s := range []int{1000, 5000, 10000, 20000} {
			byServices = append(byServices, measureMemory(b, s, 10, 1000))
			b.Logf("%+v", byServices[len(byServices)-1])
		}
	}
	dir := resultsDir(b)
	js, err := json.MarshalIndent(map[string]any{"time": time.Now().UTC().Format(time.RFC3339),
		"by_nodes": byNodes, "by_services": byServices}, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.json"), append(js, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.md"), []byte(memoryMarkdown(byNodes, byServices)), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := memoryPlot(filepath.Join(dir, "memory.png"), byNodes, byServices); err != nil {
		b.Fatal(err)
	}
	for _, p := range byNodes {
		if p.Nodes == 1000 {
			b.ReportMetric(p.HeapMB, "MB-at-10k-services-1k-nodes")
			if p.PerNodeMapsMB > 0 {
				b.ReportMetric((p.HeapMB+p.PerNodeMapsMB)/p.HeapMB, "baseline/now")
			}
		}
	}
}

// resultsDir is bench/results at the repository root.
func resultsDir(tb testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
	out := filepath.Join(dir, "bench", "results")
	if err := os.MkdirAll(out, 0o755); err != nil {
		tb.Fatal(err)
	}
	return out
}

func memoryMarkdown(byNodes, byServices []memoryPoint) string {
	var b strings.Builder
	b.WriteString("| Services | nodes | state heap (MB) | with a map per node (MB, baseline) | per-node exceptions | initial sync (s) |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range append(append([]memoryPoint{}, byNodes...), byServices...) {
		base := "not built"
		if p.PerNodeMapsMB > 0 {
			base = fmt.Sprintf("%.0f", p.HeapMB+p.PerNodeMapsMB)
		}
		fmt.Fprintf(&b, "| %d | %d | %.0f | %s | %d | %.1f |\n", p.Services, p.Nodes, p.HeapMB, base, p.Exceptions, p.SyncS)
	}
	return b.String()
}

// memoryPlot draws heap against nodes and against Services, with the
// baseline where it was measured.
func memoryPlot(path string, byNodes, byServices []memoryPoint) error {
	panel := func(title, x string, pts []memoryPoint, xOf func(memoryPoint) float64) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = x
		p.Y.Label.Text = "MB"
		p.Y.Min = 0
		var now, base plotter.XYs
		for _, pt := range pts {
			now = append(now, plotter.XY{X: xOf(pt), Y: pt.HeapMB})
			if pt.PerNodeMapsMB > 0 {
				base = append(base, plotter.XY{X: xOf(pt), Y: pt.HeapMB + pt.PerNodeMapsMB})
			}
		}
		if err := plotutil.AddLinePoints(p, "store (holdings per name)", now, "a map per node (baseline)", base); err != nil {
			return nil, err
		}
		p.Legend.Top = true
		p.Legend.Left = true
		return p, nil
	}
	left, err := panel("state heap vs nodes (10k Services)", "nodes", byNodes, func(p memoryPoint) float64 { return float64(p.Nodes) })
	if err != nil {
		return err
	}
	right, err := panel("state heap vs Services (1k nodes)", "Services", byServices, func(p memoryPoint) float64 { return float64(p.Services) })
	if err != nil {
		return err
	}
	img := vgimg.New(16*vg.Inch, 6*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 4, PadY: vg.Inch / 4, PadLeft: vg.Inch / 4, PadRight: vg.Inch / 4,
		PadTop: vg.Inch / 4, PadBottom: vg.Inch / 4}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
