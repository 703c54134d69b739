package images

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/imagebuild"
)

// TestTestbedImagesReproducible builds the real-node test bed's images
// (scripts/images -testbed) twice: the same digests and byte-identical
// archives, under the names the e2e framework and the kubelet use, each
// with the entrypoint its upstream image has.
func TestTestbedImagesReproducible(t *testing.T) {
	root := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var runs [2][]Image
	dirs := [2]string{t.TempDir(), t.TempDir()}
	for i := range runs {
		start := time.Now()
		imgs, log, err := imagebuild.Build(ctx, root, dirs[i], []string{"-testbed"})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("build %d: %v\n%s", i+1, time.Since(start).Round(time.Millisecond), log)
		runs[i] = imgs
	}
	if !slices.Equal(runs[0], runs[1]) {
		t.Fatalf("not reproducible:\n%v\n%v", runs[0], runs[1])
	}
	want := map[string][]string{
		"registry.k8s.io/pause:3.10.2":                               {"/pause"},
		"registry.k8s.io/e2e-test-images/busybox:1.37.0-2":           nil,
		"registry.k8s.io/e2e-test-images/agnhost:2.66.1":             {"/agnhost"},
		"registry.k8s.io/coredns/coredns:v1.14.6":                    {"/coredns"},
		"registry.k8s.io/e2e-test-images/regression-issue-74839:1.5": {"/regression-issue-74839"},
	}
	for _, img := range runs[0] {
		entry, ok := want[img.Ref]
		if !ok {
			t.Errorf("unexpected image %s", img.Ref)
			continue
		}
		delete(want, img.Ref)
		if a, b := fileSHA(t, filepath.Join(dirs[0], img.Name()+".tar")), fileSHA(t, filepath.Join(dirs[1], img.Name()+".tar")); a != b {
			t.Errorf("%s.tar differs between the builds", img.Name())
		}
		l, err := OpenLayout(filepath.Join(dirs[0], img.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(l.Config.Config.Entrypoint, entry) {
			t.Errorf("%s: entrypoint %q, want %q", img.Ref, l.Config.Config.Entrypoint, entry)
		}
		t.Logf("%s@%s", img.Ref, img.Digest)
	}
	for ref := range want {
		t.Errorf("no image %s", ref)
	}
	// agnhost carries the specs' commands, each finding its libraries
	// (the builder checks every ELF file; here: they are there).
	rootfs, _ := unpack(t, dirs[0], runs[0][slices.IndexFunc(runs[0], func(i Image) bool { return strings.Contains(i.Ref, "agnhost") })])
	for _, f := range []string{"agnhost", "usr/bin/curl", "usr/bin/nc", "usr/bin/dig", "usr/bin/ip", "usr/bin/ss", "usr/bin/bash", "usr/bin/socat", "usr/bin/dash", "bin/busybox"} {
		if _, err := filepath.EvalSymlinks(filepath.Join(rootfs, f)); err != nil {
			t.Errorf("agnhost lacks %s: %v", f, err)
		}
	}
	// dash, not busybox's ash, which would run busybox's nc for "nc".
	if sh, err := os.Readlink(filepath.Join(rootfs, "bin/sh")); err != nil || sh != "/usr/bin/dash" {
		t.Errorf("agnhost's /bin/sh -> %q (%v), want /usr/bin/dash", sh, err)
	}
}
