package config

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/vsplane/vsplane/controlplane/translate"
	"github.com/vsplane/vsplane/internal/configfile"
)

// DefaultCheckInterval is how often Reloader reads the file.
const DefaultCheckInterval = 2 * time.Second

// Source is where the configuration comes from: a file (Path; "" is no
// file: the defaults) and the command line (Flags; the flags set on it
// override the file, see Overlay; nil: none).
type Source struct {
	Path  string
	Flags *flag.FlagSet
}

// Load reads the file and returns the configuration it and the flags
// give, validated. Loaded.Sum identifies the bytes read.
func (s Source) Load() (*Loaded, error) {
	if s.Path == "" {
		return s.Parse(nil)
	}
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return s.Parse(data)
}

// Parse is Load of the file contents data (nil: no file).
func (s Source) Parse(data []byte) (*Loaded, error) {
	l := &Loaded{Config: Defaults(), Kind: Kind}
	if data != nil {
		var err error
		if l, err = Decode(data); err != nil {
			return nil, fmt.Errorf("config %s: %w", s.Path, err)
		}
		l.Sum = sha256.Sum256(data)
	}
	if s.Flags != nil {
		if err := Overlay(&l.Config, s.Flags); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	if err := l.Config.Validate(); err != nil {
		where := "flags"
		if s.Path != "" {
			where = s.Path + " (with flags)"
		}
		return nil, fmt.Errorf("config %s: invalid: %s", where, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return l, nil
}

// Reloader polls a Source's file and hands each valid new version's fleet
// settings to apply. An invalid or unreadable version is logged (with the
// validation error), counted, and not applied: the settings in force stay.
// A change of process settings (controlPlane) is logged as needing a
// restart and shown by a metric; it is not applied.
type Reloader struct {
	src      Source
	interval time.Duration
	log      *zap.Logger
	running  ControlPlaneConfiguration // the process settings in force

	mu        sync.Mutex
	sum       [32]byte // of the file's contents last seen (valid or not)
	lastFleet translate.Config

	reloads         *prometheus.CounterVec
	lastSuccess     prometheus.Gauge
	restartRequired prometheus.Gauge
}

// NewReloader returns a Reloader for src, whose file gave initial (Load);
// interval <= 0 means DefaultCheckInterval.
func NewReloader(src Source, initial *Loaded, interval time.Duration, log *zap.Logger) *Reloader {
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Reloader{
		src: src, interval: interval, log: log, running: initial.Config.ControlPlane,
		sum: initial.Sum, lastFleet: initial.Config.Translate(),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vsplane_controlplane_config_reloads_total",
			Help: "Changes of the configuration file seen, by result: applied (valid; its fleet settings are in force), invalid (rejected; the previous settings stay), unreadable.",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vsplane_controlplane_config_last_reload_successful",
			Help: "1 if the configuration file's current contents are valid and in force, 0 if they were rejected (see the log).",
		}),
		restartRequired: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vsplane_controlplane_config_restart_required",
			Help: "1 if the configuration file changes process settings (controlPlane) that take effect only after a restart.",
		}),
	}
}

// Collectors are the Reloader's metrics, for the caller to register.
func (r *Reloader) Collectors() []prometheus.Collector {
	r.lastSuccess.Set(1)
	return []prometheus.Collector{r.reloads, r.lastSuccess, r.restartRequired}
}

// Run checks the file every interval until ctx ends.
func (r *Reloader) Run(ctx context.Context, apply func(translate.Config)) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Check(apply)
		}
	}
}

// Check reads the file once; if its contents changed since the last
// check, it validates them and calls apply with the new fleet settings
// when they are valid and differ from those in force. It returns the
// outcome: "" (unchanged), "applied", "invalid" or "unreadable".
func (r *Reloader) Check(apply func(translate.Config)) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, err := os.ReadFile(r.src.Path)
	if err != nil {
		// A ConfigMap update swaps a symlink; a missing file between
		// checks is not a new configuration. Logged once per state.
		if r.sum != ([32]byte{}) {
			r.sum = [32]byte{}
			r.reloads.WithLabelValues("unreadable").Inc()
			r.log.Warn("configuration file unreadable; keeping the settings in force", zap.String("file", r.src.Path), zap.Error(err))
		}
		return "unreadable"
	}
	sum := sha256.Sum256(data)
	if sum == r.sum {
		return ""
	}
	r.sum = sum
	l, err := r.src.Parse(data)
	if err != nil {
		// The gauge before the counter: a reader that sees the new count
		// must also see the verdict.
		r.lastSuccess.Set(0)
		r.reloads.WithLabelValues("invalid").Inc()
		r.log.Error("configuration file changed but is invalid; NOT applied, the previous settings stay in force",
			zap.String("file", r.src.Path), zap.Error(err))
		return "invalid"
	}
	for _, w := range l.Warnings {
		r.log.Warn(w, zap.String("file", r.src.Path))
	}
	r.lastSuccess.Set(1)
	r.reloads.WithLabelValues("applied").Inc()
	if changed := ProcessChanges(r.running, l.Config.ControlPlane); len(changed) > 0 {
		r.restartRequired.Set(1)
		r.log.Warn("configuration file changes process settings; they take effect after a restart",
			zap.String("file", r.src.Path), zap.Strings("restartRequired", changed))
	} else {
		r.restartRequired.Set(0)
	}
	fleet := l.Config.Translate()
	if reflect.DeepEqual(fleet, r.lastFleet) {
		r.log.Info("configuration file changed; fleet settings unchanged", zap.String("file", r.src.Path))
		return "applied"
	}
	r.lastFleet = fleet
	r.log.Info("configuration file changed; applying the new fleet settings to every node", zap.String("file", r.src.Path),
		zap.String("defaultScheduler", fleet.DefaultScheduler))
	apply(fleet)
	return "applied"
}

// ProcessChanges lists the process settings that differ between running
// and file, as `controlPlane.listenAddress ":18000" -> ":19000"`.
func ProcessChanges(running, file ControlPlaneConfiguration) []string {
	var out []string
	a, b := reflect.ValueOf(running), reflect.ValueOf(file)
	t := a.Type()
	for i := range t.NumField() {
		if reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			continue
		}
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, fmt.Sprintf("controlPlane.%s %s -> %s", name, show(a.Field(i).Interface()), show(b.Field(i).Interface())))
	}
	return out
}

func show(v any) string {
	if d, ok := v.(interface{ String() string }); ok {
		return fmt.Sprintf("%q", d.String())
	}
	return configfile.QuoteValue(v)
}
