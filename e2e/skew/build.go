// Package skew builds vsplane's two sides from an earlier commit of this
// repository's history, for the version-skew test (TestVersionSkew): an
// agent and a control plane one protocol change apart, both ways.
package skew

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vsplane/vsplane/e2e/cluster"
	"github.com/vsplane/vsplane/e2e/vm"
)

// Binaries are one commit's static executables.
type Binaries struct {
	// ControlPlane is the host path of its vsplane-controlplane.
	ControlPlane string
	// Agent is the host path of its vsplane-agent, named
	// vsplane-agent-<short commit> so that it sits beside this checkout's
	// vsplane-agent in the guest's /usr/local/bin (cluster.Options.Binaries).
	Agent string
}

// AgentExec is the guest command that runs this agent
// (cluster.Options.AgentExecs, Cluster.SetAgentExec).
func (b Binaries) AgentExec() string { return filepath.Base(b.Agent) }

// Build returns commit's binaries, built static (as vm.BuildStatic builds
// this checkout's) from `git archive commit` unpacked in a temporary
// directory (the repository's own work trees are left alone), and cached
// under root/.cache/skew/<commit>/ so that a second run is fast. commit
// must be a full hash in root's history: a shallow clone lacks it, and the
// error says so.
func Build(ctx context.Context, root, commit string) (Binaries, error) {
	if len(commit) != 40 {
		return Binaries{}, fmt.Errorf("skew: commit %q: want a full 40-digit hash", commit)
	}
	if err := hasCommit(ctx, root, commit); err != nil {
		return Binaries{}, err
	}
	cache := filepath.Join(root, ".cache", "skew", commit)
	bins := Binaries{
		ControlPlane: filepath.Join(cache, "vsplane-controlplane"),
		Agent:        filepath.Join(cache, "vsplane-agent-"+commit[:7]),
	}
	done := filepath.Join(cache, ".done")
	if _, err := os.Stat(done); err == nil {
		return bins, nil
	}

	src, err := os.MkdirTemp("", "vsplane-skew-src-")
	if err != nil {
		return Binaries{}, err
	}
	defer os.RemoveAll(src)
	if err := unpack(ctx, root, commit, src); err != nil {
		return Binaries{}, err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return Binaries{}, err
	}
	out, err := vm.BuildStaticIn(ctx, src, cache, cluster.ControlPlanePackage, cluster.AgentPackage)
	if err != nil {
		return Binaries{}, fmt.Errorf("skew: build %s: %w", commit, err)
	}
	// out[1] is vsplane-agent: renamed, as the guest already has one.
	if err := os.Rename(out[1], bins.Agent); err != nil {
		return Binaries{}, err
	}
	return bins, os.WriteFile(done, nil, 0o644)
}

// ProtocolChanges lists the commits from commit (excluded) to HEAD that
// change proto/, newest first. The agent's local inspection API
// (agent_inspect.proto: grpcurl on the node, no other component calls it)
// is not part of the protocol between agent and control plane.
func ProtocolChanges(ctx context.Context, root, commit string) ([]string, error) {
	if err := hasCommit(ctx, root, commit); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := git(ctx, root, &out, "log", "--format=%H %s", commit+"..HEAD", "--", "proto/", ":(exclude)proto/vsplane/v1/agent_inspect*"); err != nil {
		return nil, err
	}
	return strings.FieldsFunc(out.String(), func(r rune) bool { return r == '\n' }), nil
}

// hasCommit fails unless commit is in root's history, saying why.
func hasCommit(ctx context.Context, root, commit string) error {
	if err := git(ctx, root, nil, "cat-file", "-e", commit+"^{commit}"); err == nil {
		return nil
	}
	shallow := ""
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--is-shallow-repository").Output(); err == nil &&
		strings.TrimSpace(string(out)) == "true" {
		shallow = " This is a shallow clone: `git fetch --unshallow` fetches the history."
	}
	return fmt.Errorf("skew: commit %s is not in the history of %s, and the version-skew test builds the other side from it.%s", commit, root, shallow)
}

// unpack writes commit's tree into dir: git archive | tar -x.
func unpack(ctx context.Context, root, commit, dir string) error {
	var tarball bytes.Buffer
	if err := git(ctx, root, &tarball, "archive", "--format=tar", commit); err != nil {
		return err
	}
	tar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	tar.Stdin = &tarball
	if out, err := tar.CombinedOutput(); err != nil {
		return fmt.Errorf("skew: unpack %s: %w\n%s", commit, err, out)
	}
	return nil
}

// git runs git in root, its standard output to stdout if not nil.
func git(ctx context.Context, root string, stdout io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", root}, args...)...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("skew: git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
