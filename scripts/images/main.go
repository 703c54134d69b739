// Command images builds vsplane's two OCI images without a container
// engine (go-containerregistry), reproducibly: the same sources, Go
// toolchain, pinned Debian packages (debian.lock) and SOURCE_DATE_EPOCH
// give the same digests.
//
//	vsplane-controlplane  /vsplane-controlplane (static), /etc/passwd+group, runs as 65532
//	vsplane-agent         /vsplane-agent (static), iptables/ip6tables legacy + nft with
//	                      their libraries from Debian, runs as root
//
// Each image lands in OUT as an OCI layout (OUT/NAME/) and a `docker
// save`-style tarball (OUT/NAME.tar); the last lines of stdout are
// "REF@DIGEST", also written to OUT/digests.txt.
//
//	go run . [-repo DIR] [-out DIR] [-registry R] [-tag T]   (make images)
//	go run . -relock                                          (make images-relock)
//
// Kept in its own module so go-containerregistry stays out of vsplane's go.mod.
package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

const modulePath = "module github.com/vsplane/vsplane"

const (
	controlPlanePkg = "./controlplane/cmd/vsplane-controlplane"
	agentPkg        = "./dataplane/cmd/vsplane-agent"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		repo     = flag.String("repo", "", "vsplane checkout (default: found above the working directory)")
		out      = flag.String("out", "", "output directory (default REPO/_out/images)")
		cache    = flag.String("cache", "", "where downloaded .debs are kept (default REPO/.cache/images/debs)")
		lockFile = flag.String("lock", "", "pinned Debian packages (default REPO/scripts/images/debian.lock)")
		relockF  = flag.Bool("relock", false, "pin apt's current candidates of the images' Debian packages (and the libraries agnhost's tools need) into -lock and exit")
		registry = flag.String("registry", "ghcr.io/vsplane", "registry and path the image names start with")
		tag      = flag.String("tag", "dev", "image tag (also the agent's reported version)")
		testbed  = flag.Bool("testbed", false, "build the real-node test bed's images (pause, busybox, agnhost, CoreDNS, regression-issue-74839 under their upstream names) instead of vsplane's")
	)
	flag.Parse()
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "images: "+format+"\n", args...) }

	root := *repo
	if root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if root, err = findRepoRoot(wd); err != nil {
			return err
		}
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if *out == "" {
		*out = filepath.Join(root, "_out", "images")
	}
	if *cache == "" {
		*cache = filepath.Join(root, ".cache", "images", "debs")
	}
	if *lockFile == "" {
		*lockFile = filepath.Join(root, "scripts", "images", "debian.lock")
	}
	if *relockF {
		libs, err := libraryClosure(*cache, agnhostTools, logf)
		if err != nil {
			return err
		}
		named := namedPackages()
		var extra []string
		for _, l := range libs {
			if !slices.Contains(named, l) {
				extra = append(extra, l)
			}
		}
		lock, err := relock(*cache, append(named, extra...), logf)
		if err != nil {
			return err
		}
		for i := range lock {
			lock[i].Library = slices.Contains(libs, lock[i].Package)
		}
		if err := writeLock(*lockFile, lock); err != nil {
			return err
		}
		logf("wrote %s", *lockFile)
		return nil
	}
	mtime, err := sourceDateEpoch()
	if err != nil {
		return err
	}

	t0 := time.Now()
	lock, err := readLock(*lockFile)
	if err != nil {
		return fmt.Errorf("%w (make images-relock writes it)", err)
	}
	if err := checkLockCovers(lock, namedPackages()); err != nil {
		return err
	}
	debs, err := fetchLocked(*cache, lock, logf)
	if err != nil {
		return err
	}
	var specs []imageSpec
	if *testbed {
		specs, err = testbedSpecs(root, debs, closureLibraries(lock), logf)
	} else {
		specs, err = vsplaneSpecs(root, debs, lock, *tag, logf)
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	var lines []string
	for _, s := range specs {
		img, err := s.build(mtime)
		if err != nil {
			return err
		}
		ref := s.Ref
		if ref == "" {
			ref = *registry + "/" + s.Name + ":" + *tag
		}
		if err := write(img, ref, filepath.Join(*out, s.Name), filepath.Join(*out, s.Name+".tar")); err != nil {
			return fmt.Errorf("write %s: %w", s.Name, err)
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		size := int64(0)
		layers, err := img.Layers()
		if err != nil {
			return err
		}
		for _, l := range layers {
			n, err := l.Size()
			if err != nil {
				return err
			}
			size += n
		}
		logf("%s: %d layers, %.1f MB compressed", s.Name, len(layers), float64(size)/1e6)
		lines = append(lines, ref+"@"+d.String())
	}
	digests := "digests.txt"
	if *testbed {
		digests = "testbed-digests.txt"
	}
	if err := os.WriteFile(filepath.Join(*out, digests), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	logf("done in %v: OCI layouts and tarballs in %s", time.Since(t0).Round(time.Millisecond), *out)
	for _, l := range lines {
		fmt.Println(l)
	}
	return nil
}

// vsplaneSpecs builds vsplane's two binaries and returns their images.
func vsplaneSpecs(root string, debs map[string]string, lock []lockEntry, tag string, logf func(string, ...any)) ([]imageSpec, error) {
	t0 := time.Now()
	binDir, err := os.MkdirTemp("", "vsplane-images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(binDir)
	if err := goBuild(root, binDir, tag); err != nil {
		return nil, err
	}
	logf("go build: %v", time.Since(t0).Round(time.Millisecond))
	cpBin, err := staticBinary(filepath.Join(binDir, "vsplane-controlplane"))
	if err != nil {
		return nil, err
	}
	agentBin, err := staticBinary(filepath.Join(binDir, "vsplane-agent"))
	if err != nil {
		return nil, err
	}

	base, err := baseTree()
	if err != nil {
		return nil, err
	}
	agentDeb, err := agentBase(debs, logf)
	if err != nil {
		return nil, err
	}
	cpLayer, err := binaryTree("vsplane-controlplane", cpBin)
	if err != nil {
		return nil, err
	}
	agentLayer, err := binaryTree("vsplane-agent", agentBin)
	if err != nil {
		return nil, err
	}
	var pinned []string
	for _, e := range lock {
		if slices.Contains(agentPackages, e.Package) {
			pinned = append(pinned, e.Package+"="+e.Version)
		}
	}
	specs := []imageSpec{
		{
			Name:       "vsplane-controlplane",
			Layers:     []*tree{base, cpLayer},
			LayerNames: []string{"passwd, group, /tmp", "vsplane-controlplane (CGO_ENABLED=0 go build -trimpath)"},
			Entrypoint: []string{"/vsplane-controlplane"},
			User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
		},
		{
			Name:       "vsplane-agent",
			Layers:     []*tree{agentDeb, agentLayer},
			LayerNames: []string{"iptables legacy+nft from Debian: " + strings.Join(pinned, " "), "vsplane-agent (CGO_ENABLED=0 go build -trimpath)"},
			Entrypoint: []string{"/vsplane-agent"},
			User:       "0:0",
			Labels:     map[string]string{"io.vsplane.debian-packages": strings.Join(pinned, " ")},
		},
	}
	return specs, nil
}

// sourceDateEpoch is $SOURCE_DATE_EPOCH (seconds), else the Unix epoch:
// every timestamp in the images.
func sourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a number of seconds", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// goBuild builds both binaries static and reproducibly: no cgo, no paths of
// this machine (-trimpath), no build ID.
func goBuild(root, dir, version string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ldflags := "-buildid= -X github.com/vsplane/vsplane/dataplane/agent.Version=" + version
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags="+ldflags, "-o", dir+string(filepath.Separator), controlPlanePkg, agentPkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// staticBinary reads an executable and fails unless it is statically linked.
func staticBinary(file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("%s is dynamically linked (CGO_ENABLED=0 expected)", file)
		}
	}
	return data, nil
}

func findRepoRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.Contains(data, []byte(modulePath+"\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("no vsplane checkout (go.mod of github.com/vsplane/vsplane) above " + dir)
		}
	}
}
