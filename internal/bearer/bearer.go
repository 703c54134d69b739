// Package bearer sends a token file's content as gRPC call credentials
// ("authorization: Bearer <token>"). The file is read for every call, and an
// agent's stream is one call per (re)connect: a projected ServiceAccount
// token that kubelet rotates is picked up at the next reconnect.
package bearer

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// File is a credentials.PerRPCCredentials reading its token from a path.
type File struct {
	Path string
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (f File) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, fmt.Errorf("reading token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return nil, fmt.Errorf("token file %s is empty", f.Path)
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: a
// token is never sent in plaintext.
func (File) RequireTransportSecurity() bool { return true }
