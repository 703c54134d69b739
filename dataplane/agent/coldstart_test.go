package agent

import (
	"testing"
	"time"
)

// processStart reads this test process's start: before now, and not before
// the test binary could have started.
func TestProcessStart(t *testing.T) {
	got, err := processStart()
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(got); age < 0 || age > 10*time.Minute {
		t.Fatalf("process started %v ago", age)
	}
}
