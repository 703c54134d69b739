package config_test

import (
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vsplane/vsplane/controlplane/config"
)

// TestShippedConfigFile: deploy/base's configuration (the ConfigMap the
// Deployment mounts) decodes strictly, is valid, and writes out the
// defaults (a changed default must be changed there too).
func TestShippedConfigFile(t *testing.T) {
	data, err := os.ReadFile("../../deploy/base/config/vsplane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := config.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Config.Validate(); err != nil {
		t.Error(err)
	}
	if diff := cmp.Diff(config.Defaults(), l.Config, cmp.Comparer(func(a, b []string) bool {
		return strings.Join(a, ",") == strings.Join(b, ",")
	})); diff != "" {
		t.Errorf("deploy/base/config/vsplane.yaml differs from the defaults (-defaults +file):\n%s", diff)
	}
}
