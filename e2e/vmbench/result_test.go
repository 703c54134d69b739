package vmbench

import (
	"slices"
	"testing"

	"bytes"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"time"
)

// The timeline is read back from the agent's production JSON log, in the
// order the steps were logged, total last.
func TestColdStartTimeline(t *testing.T) {
	var buf bytes.Buffer
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, zapcore.AddSync(&buf), zapcore.InfoLevel))
	log.Info("agent stream open", zap.Duration("unrelated", time.Second))
	log.Info("cold start", zap.String("node", "n1"), zap.Duration("total", 1500*time.Millisecond),
		zap.Duration("startup", 200*time.Millisecond), zap.Duration("kernel", 300*time.Millisecond), zap.Duration("first_response", time.Second))
	got, err := ColdStartTimeline(buf.String())
	if err != nil {
		t.Fatal(err)
	}
	want := []TimelineStep{{"startup", 200}, {"kernel", 300}, {"first_response", 1000}, {"total", 1500}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := ColdStartTimeline("{\"msg\":\"other\"}\n"); err == nil {
		t.Fatal("no error without a cold start line")
	}
}
