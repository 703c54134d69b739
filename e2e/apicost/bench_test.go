//go:build apicostbench

package apicost_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/apicost"
)

// TestAPICostBench is the API-server cost benchmark at full size (issue
// #12: 1,000 watchers x 10,000 Services x 10 endpoints, 1,000 slice
// updates), or at APICOST_SIZE ("WATCHERSxSERVICESxENDPOINTS") and
// APICOST_UPDATES (K). A measurement, not a CI test:
//
//	go test -tags apicostbench -v -count=1 -timeout 90m -run TestAPICostBench ./e2e/apicost
//
// It writes bench/results/apicost.json and apicost.md at the repository
// root and prints the headline; a scenario that does not converge fails
// it, numbers never do.
func TestAPICostBench(t *testing.T) {
	size, k := apicost.FullSize, 1000
	var notes []string
	if s := os.Getenv("APICOST_SIZE"); s != "" {
		if _, err := fmt.Sscanf(s, "%dx%dx%d", &size.Watchers, &size.Services, &size.Endpoints); err != nil || size.Watchers < 1 || size.Services < 1 || size.Endpoints < 1 {
			t.Fatalf("APICOST_SIZE=%q: want WATCHERSxSERVICESxENDPOINTS, e.g. 1000x10000x10", s)
		}
	}
	if s := os.Getenv("APICOST_UPDATES"); s != "" {
		var err error
		if k, err = strconv.Atoi(s); err != nil || k < 1 {
			t.Fatalf("APICOST_UPDATES=%q: want a positive count", s)
		}
	}
	if size != apicost.FullSize {
		notes = append(notes, fmt.Sprintf("Run at %s, not the full %s (APICOST_SIZE).", size, apicost.FullSize))
	}
	if note := os.Getenv("APICOST_NOTE"); note != "" {
		notes = append(notes, note)
	}
	rep := apicost.Run(t, apicost.Options{Size: size, SliceUpdates: k, Timeout: 30 * time.Minute,
		OutDir: filepath.Join("..", "..", "bench", "results"), Notes: notes})
	if len(rep.Problems) > 0 {
		t.Fatalf("problems: %v", rep.Problems)
	}
	fmt.Println("HEADLINE:", rep.Headline)
}
