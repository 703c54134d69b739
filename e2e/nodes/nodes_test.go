package nodes

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vsplane/vsplane/e2e/imagebuild"
)

// echoServer answers each connection with "hi\n" and then echoes it.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprint(c, "hi\n")
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestRelay: before SetTarget a connection is closed at once; after it, the
// unix socket relays both ways to the TCP target; Close ends it.
func TestRelay(t *testing.T) {
	r, err := NewRelay(filepath.Join(t.TempDir(), "relay.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := net.Dial("unix", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes before a target was set", n)
	}
	c.Close()

	r.SetTarget(echoServer(t))
	c, err = net.Dial("unix", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	if l, err := br.ReadString('\n'); err != nil || l != "hi\n" {
		t.Fatalf("through the relay: %q, %v", l, err)
	}
	fmt.Fprint(c, "ping\n")
	if l, err := br.ReadString('\n'); err != nil || l != "ping\n" {
		t.Fatalf("echo through the relay: %q, %v", l, err)
	}
	r.Close()
	if _, err := br.ReadString('\n'); err == nil {
		t.Fatal("relayed connection still open after Close")
	}
}

// TestDialThroughProxy against a minimal CONNECT proxy: the tunnel works, a
// refusal is an error carrying the status.
func TestDialThroughProxy(t *testing.T) {
	target := echoServer(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect || r.Host != target {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		up, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		down, _, _ := w.(http.Hijacker).Hijack()
		fmt.Fprint(down, "HTTP/1.1 200 OK\r\n\r\n")
		go func() { _, _ = io.Copy(up, down) }()
		_, _ = io.Copy(down, up)
		down.Close()
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := DialThroughProxy(ctx, ln.Addr().String(), target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if l, err := bufio.NewReader(c).ReadString('\n'); err != nil || l != "hi\n" {
		t.Fatalf("through the tunnel: %q, %v", l, err)
	}
	if _, err := DialThroughProxy(ctx, ln.Addr().String(), "198.18.0.1:1"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("refused CONNECT: %v", err)
	}
}

// TestConfigs: the CNI configuration carries the node's Pod range (valid
// JSON, bad ranges refused); the kubelet's and containerd's name the shared
// paths.
func TestConfigs(t *testing.T) {
	b, err := cniConfigFor("198.19.17.0/24")
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			Type string `json:"type"`
			IPAM struct {
				Ranges [][]struct {
					Subnet string `json:"subnet"`
				} `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatalf("CNI config is not JSON: %v\n%s", err, b)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0].Type != "ptp" || conf.Plugins[0].IPAM.Ranges[0][0].Subnet != "198.19.17.0/24" || conf.Plugins[1].Type != "portmap" {
		t.Errorf("CNI config: %+v", conf)
	}
	for _, bad := range []string{"", "198.19.17.0", "2001:2::/64", "x"} {
		if _, err := cniConfigFor(bad); err == nil {
			t.Errorf("Pod range %q accepted", bad)
		}
	}
	k, err := kubeletConfigFor("vsnode-node1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cgroupRoot: /vsnode-node1", "cgroupDriver: cgroupfs", "clusterDNS: [" + ClusterDNS + "]",
		"containerRuntimeEndpoint: unix://" + containerdSocket, "clientCAFile: " + clusterCAFile} {
		if !strings.Contains(string(k), want) {
			t.Errorf("kubelet config lacks %q:\n%s", want, k)
		}
	}
	cc, err := containerdConfigFor()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`address = "` + containerdSocket + `"`, `BinaryName = "` + ociRuntime + `"`, `sandbox = "` + PauseImage + `"`, "SystemdCgroup = false"} {
		if !strings.Contains(string(cc), want) {
			t.Errorf("containerd config lacks %q:\n%s", want, cc)
		}
	}
}

// TestFindBinariesNamesScripts: a checkout without built binaries gets an
// error naming the script that builds them.
func TestFindBinariesNamesScripts(t *testing.T) {
	root := t.TempDir()
	if _, err := FindBinaries(root); err == nil || !strings.Contains(err.Error(), "scripts/kube/build.sh") {
		t.Fatalf("no kubelet: %v", err)
	}
	kube := filepath.Join(root, ".cache", "kube", "v1-v2", "bin")
	writeExec(t, filepath.Join(kube, "kubelet"))
	if _, err := FindBinaries(root); err == nil || !strings.Contains(err.Error(), "scripts/kube/build.sh") {
		t.Fatalf("no kube-proxy: %v", err)
	}
	writeExec(t, filepath.Join(kube, "kube-proxy"))
	if _, err := FindBinaries(root); err == nil || !strings.Contains(err.Error(), "scripts/nodes/build.sh") {
		t.Fatalf("no containerd: %v", err)
	}
}

func writeExec(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestBuildDisk builds a disk from stand-in binaries, a real dynamically
// linked runtime (this machine's /bin/true) and a tiny OCI layout, and
// reads it back with debugfs: every program, the runtime with its loader
// and libc under /root, the image archive and its index.
func TestBuildDisk(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (e2fsprogs) is needed: %v", tool, err)
		}
	}
	dir := t.TempDir()
	bins := Binaries{Kube: filepath.Join(dir, "kube"), Node: filepath.Join(dir, "node"), Runtime: "/bin/true"}
	for _, b := range kubeBinaries {
		writeExec(t, filepath.Join(bins.Kube, b))
	}
	for _, b := range nodeBinaries {
		writeExec(t, filepath.Join(bins.Node, b))
	}
	for _, p := range cniPlugins {
		writeExec(t, filepath.Join(bins.Node, "cni", p))
	}
	layout := filepath.Join(dir, "layout")
	if err := os.MkdirAll(filepath.Join(layout, "blobs", "sha256"), 0o755); err != nil {
		t.Fatal(err)
	}
	for f, data := range map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": `{}`, "blobs/sha256/ab": "x"} {
		if err := os.WriteFile(filepath.Join(layout, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := DiskImage{Image: imagebuild.Image{Ref: "registry.k8s.io/pause:3.10.2", Digest: "sha256:ab"}, Layout: layout}
	out := filepath.Join(dir, "node.img")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := BuildDisk(ctx, bins, []DiskImage{img}, out); err != nil {
		t.Fatal(err)
	}
	debugfs := func(cmd string) string {
		b, err := exec.Command("debugfs", "-R", cmd, out).CombinedOutput()
		if err != nil {
			t.Fatalf("debugfs %s: %v\n%s", cmd, err, b)
		}
		return string(b)
	}
	listing := debugfs("ls -p /bin") + debugfs("ls -p /cni") + debugfs("ls -p /images") +
		debugfs("ls -p /root/usr/sbin") + debugfs("ls -p /root/usr/lib64") + debugfs("ls -p /root/usr/lib/x86_64-linux-gnu")
	for _, want := range []string{"/kubelet/", "/containerd/", "/ctr/", "/ptp/", "/portmap/", "/pause.tar/", "/index/",
		"/runc/", "/ld-linux-x86-64.so.2/", "/libc.so.6/"} {
		if !strings.Contains(listing, want) {
			t.Errorf("disk lacks %s:\n%s", want, listing)
		}
	}
	if idx := debugfs("cat /images/index"); !strings.Contains(idx, "pause registry.k8s.io/pause:3.10.2 sha256:ab") {
		t.Errorf("images/index: %q", idx)
	}
}
