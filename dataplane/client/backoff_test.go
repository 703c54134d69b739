package client

import (
	"testing"
	"time"
)

func TestBackoffGrowsWithJitterAndCaps(t *testing.T) {
	c, err := New(Config{Targets: []string{"x:1"}, NodeName: "n", Applier: nopApplier{},
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for attempt, full := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		full *= time.Millisecond
		for range 50 {
			d := c.backoff(attempt)
			if d < full/2 || d > full {
				t.Fatalf("attempt %d: backoff %v outside [%v, %v]", attempt, d, full/2, full)
			}
		}
	}
	if d := c.backoff(1000); d < 500*time.Millisecond || d > time.Second {
		t.Fatalf("huge attempt: %v", d)
	}
}
