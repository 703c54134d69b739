package integration_test

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/vsplane/vsplane/controlplane/config"
	"github.com/vsplane/vsplane/dataplane/agentconfig"
	"github.com/vsplane/vsplane/e2e/kubeenv"
)

// TestDeployConfigFiles renders every overlay in deploy/overlays (kubectl
// kustomize; no apiserver) and runs the binaries' own configuration code
// on what each container would get: the ConfigMaps written out at their
// mount paths, the args with $(VAR)s expanded from the container's env.
// Each binary's whole command line goes through its own parser
// (config.ParseCommandLine, agentconfig.ParseCommandLine: the flags, the
// --config file under them, validated), which is what its main runs.
// So a typo in a shipped configuration file, or a flag that pins a setting
// the file should hold, fails CI. Also: the probes use the metrics
// address's port, and the control plane's file is mounted so that it can
// be reloaded live (fixed ConfigMap name, no subPath).
func TestDeployConfigFiles(t *testing.T) {
	bin, err := kubeenv.FindBinDir("")
	if err != nil {
		t.Fatal(err)
	}
	kubectl := filepath.Join(bin, "kubectl")
	overlays, err := filepath.Glob(filepath.Join("..", "..", "deploy", "overlays", "*"))
	if err != nil || len(overlays) == 0 {
		t.Fatalf("no overlays under deploy/overlays (%v)", err)
	}
	for _, dir := range overlays {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, kubectl, "kustomize", dir)
			cmd.Stderr = &stderr
			rendered, err := cmd.Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
			}
			r := parseRendered(t, rendered)
			if r.controlPlane == nil || r.agent == nil {
				t.Fatalf("overlay renders no control-plane Deployment or agent DaemonSet")
			}
			t.Run("controlplane", func(t *testing.T) { checkControlPlane(t, r) })
			t.Run("agent", func(t *testing.T) { checkAgent(t, r) })
		})
	}
}

type rendered struct {
	configMaps   map[string]*corev1.ConfigMap
	controlPlane *appsv1.Deployment
	agent        *appsv1.DaemonSet
}

func parseRendered(t *testing.T, data []byte) *rendered {
	t.Helper()
	r := &rendered{configMaps: map[string]*corev1.ConfigMap{}}
	for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("rendered document: %v\n%s", err, doc)
		}
		var err error
		switch meta.Kind {
		case "ConfigMap":
			var cm corev1.ConfigMap
			err = yaml.UnmarshalStrict(doc, &cm)
			r.configMaps[cm.Name] = &cm
		case "Deployment":
			var d appsv1.Deployment
			err = yaml.UnmarshalStrict(doc, &d)
			if d.Name == "vsplane-controlplane" {
				r.controlPlane = &d
			}
		case "DaemonSet":
			var d appsv1.DaemonSet
			err = yaml.UnmarshalStrict(doc, &d)
			if d.Name == "vsplane-agent" {
				r.agent = &d
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	return r
}

// pod is a container as it would start: its args with $(VAR)s expanded,
// its env, and its ConfigMap volumes written under root.
type pod struct {
	args    []string
	env     map[string]string
	root    string
	mounts  map[string]corev1.VolumeMount // by mount path, ConfigMap volumes only
	volumes map[string]string             // ConfigMap volume name -> ConfigMap name
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func materialize(t *testing.T, r *rendered, spec *corev1.PodSpec) *pod {
	t.Helper()
	c := spec.Containers[0]
	p := &pod{env: map[string]string{}, root: t.TempDir(), mounts: map[string]corev1.VolumeMount{}, volumes: map[string]string{}}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			p.env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			p.env[e.Name] = map[string]string{"spec.nodeName": "node-1", "status.podIP": "198.18.1.11"}[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := r.configMaps[ref.Name]
			if cm == nil {
				t.Fatalf("env %s: no ConfigMap %s", e.Name, ref.Name)
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				t.Fatalf("env %s: ConfigMap %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			p.env[e.Name] = v
		}
	}
	for _, a := range c.Args {
		p.args = append(p.args, varRef.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := p.env[varRef.FindStringSubmatch(m)[1]]; ok {
				return v
			}
			return m
		}))
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			p.volumes[v.Name] = v.ConfigMap.Name
		}
	}
	for _, m := range c.VolumeMounts {
		name, ok := p.volumes[m.Name]
		if !ok {
			continue
		}
		cm := r.configMaps[name]
		if cm == nil {
			t.Fatalf("volume %s: no ConfigMap %s", m.Name, name)
		}
		p.mounts[m.MountPath] = m
		dir := filepath.Join(p.root, m.MountPath, m.SubPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for k, data := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return p
}

// localArgs points every --flag=PATH under a ConfigMap mount to the copy
// under p.root.
func (p *pod) localArgs() []string {
	var out []string
	for _, a := range p.args {
		if name, v, ok := strings.Cut(a, "="); ok {
			for mp := range p.mounts {
				if strings.HasPrefix(v, mp+"/") {
					a = name + "=" + filepath.Join(p.root, v)
				}
			}
		}
		out = append(out, a)
	}
	return out
}

// mountOf returns the ConfigMap mount holding the file path.
func (p *pod) mountOf(path string) (corev1.VolumeMount, bool) {
	for mp, m := range p.mounts {
		if strings.HasPrefix(path, mp+"/") {
			return m, true
		}
	}
	return corev1.VolumeMount{}, false
}

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	return n
}

func checkControlPlane(t *testing.T, r *rendered) {
	spec := &r.controlPlane.Spec.Template.Spec
	p := materialize(t, r, spec)
	fs := flag.NewFlagSet("vsplane-controlplane", flag.ContinueOnError)
	cl, err := config.ParseCommandLine(fs, p.localArgs(), func(k string) string { return p.env[k] })
	if err != nil {
		t.Fatalf("control plane command line %q: %v", p.args, err)
	}
	file := cl.ConfigFile
	if file == "" {
		t.Fatalf("control plane args %q: no --config", p.args)
	}
	if len(cl.Overridden) > 0 {
		t.Errorf("control plane args set %v, which config/vsplane.yaml holds: a flag overrides the file (and its live reload); set them in the file", cl.Overridden)
	}
	l := cl.Loaded
	if len(l.Warnings) > 0 {
		t.Errorf("control plane configuration warnings: %v", l.Warnings)
	}
	// Live reload: the kubelet updates a ConfigMap volume in place, never a
	// subPath mount, and a hashed name would roll the replicas instead.
	orig := strings.TrimPrefix(file, p.root)
	m, _ := p.mountOf(orig)
	if m.SubPath != "" {
		t.Errorf("control plane config mounted with subPath %q: the kubelet never updates it, so live reload would not work", m.SubPath)
	}
	if name := p.volumes[m.Name]; name != "vsplane-controlplane-config" {
		t.Errorf("control plane config ConfigMap named %q: want the fixed name vsplane-controlplane-config (disableNameSuffixHash) so it is reloaded live", name)
	}
	ctr := spec.Containers[0]
	metrics := port(t, l.Config.ControlPlane.MetricsAddress)
	for name, pr := range map[string]*corev1.Probe{"readiness": ctr.ReadinessProbe, "liveness": ctr.LivenessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Port.IntValue() != metrics {
			t.Errorf("control plane %s probe %+v: want port %d (metricsAddress)", name, pr, metrics)
		}
	}
	if listen := port(t, l.Config.ControlPlane.ListenAddress); len(ctr.Ports) == 0 || int(ctr.Ports[0].ContainerPort) != listen {
		t.Errorf("control plane ports %+v: want containerPort %d (listenAddress)", ctr.Ports, listen)
	}
}

func checkAgent(t *testing.T, r *rendered) {
	spec := &r.agent.Spec.Template.Spec
	p := materialize(t, r, spec)
	fs := flag.NewFlagSet("vsplane-agent", flag.ContinueOnError)
	cl, err := agentconfig.ParseCommandLine(fs, p.localArgs(), func(k string) string { return p.env[k] })
	if err != nil {
		t.Fatalf("agent command line %q: %v", p.args, err)
	}
	if cl.ConfigFile == "" {
		t.Errorf("agent args %q: no --config", p.args)
	}
	// --controlplane is the one file setting given as a flag: overlays set
	// the addresses in the ConfigMap vsplane-agent.
	if strings.Join(cl.Overridden, ",") != "controlplane" {
		t.Errorf("agent args set %v; want only --controlplane (the rest belongs in config/agent.yaml)", cl.Overridden)
	}
	if cl.NodeName != "node-1" || cl.InsecurePlaintext {
		t.Errorf("agent node %q, insecure %v", cl.NodeName, cl.InsecurePlaintext)
	}
	if pr := spec.Containers[0].LivenessProbe; pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Port.IntValue() != port(t, cl.Config.MetricsAddress) {
		t.Errorf("agent liveness probe %+v: want the port of metricsAddress %q", pr, cl.Config.MetricsAddress)
	}
}
