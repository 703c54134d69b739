package soak

import (
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WritePlot draws every process's RSS and goroutines over the run (PNG at
// path): one color per process, the line broken where the process
// restarted (a fault killed it), so a leak shows as a rising run and a
// restart is not mistaken for one.
func (r *Report) WritePlot(path string) error {
	rss, err := r.panel("resident memory", "MiB", func(s MemorySample) float64 { return mib(s.RSS) })
	if err != nil {
		return err
	}
	gor, err := r.panel("goroutines", "goroutines", func(s MemorySample) float64 { return float64(s.Goroutines) })
	if err != nil {
		return err
	}
	img := vgimg.New(12*vg.Inch, 10*vg.Inch)
	dc := draw.New(img)
	pad := vg.Inch / 4
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: pad, PadY: pad, PadLeft: pad, PadRight: pad, PadTop: pad, PadBottom: pad}
	canvases := plot.Align([][]*plot.Plot{{rss}, {gor}}, tiles, dc)
	rss.Draw(canvases[0][0])
	gor.Draw(canvases[1][0])
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

// panel plots y of every series against minutes into the run.
func (r *Report) panel(title, unit string, y func(MemorySample) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (seed %d, %v)", title, r.Seed, r.Duration)
	p.X.Label.Text = "minutes into the run"
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
	for i, m := range r.Memory {
		c := plotutil.Color(i)
		for j, run := range runs(m.Samples) {
			xys := make(plotter.XYs, len(run))
			for k, s := range run {
				xys[k] = plotter.XY{X: s.At.Minutes(), Y: y(s)}
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", title, m.Name, err)
			}
			line.LineStyle.Color, line.LineStyle.Width = c, vg.Points(1)
			line.LineStyle.Dashes = plotutil.Dashes(i / len(plotutil.SoftColors))
			p.Add(line)
			if j == 0 {
				p.Legend.Add(m.Name, line)
			}
		}
	}
	p.Add(plotter.NewGrid())
	return p, nil
}

// runs splits samples where the process restarted.
func runs(samples []MemorySample) [][]MemorySample {
	var out [][]MemorySample
	start := 0
	for i := 1; i <= len(samples); i++ {
		if i == len(samples) || samples[i].Start != samples[i-1].Start {
			out = append(out, samples[start:i])
			start = i
		}
	}
	return out
}
