// Package kubeenv runs a real, throw-away Kubernetes control plane (etcd +
// kube-apiserver, no controllers, no nodes) on 127.0.0.1 for tests and demos.
//
// The binaries come from scripts/kube/build.sh; they are found through the
// VSPLANE_KUBE_BIN environment variable (a directory) or in the repository's
// .cache/kube/*/bin. A missing binary is an error, never a silent skip.
package kubeenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/rest"

	"github.com/vsplane/vsplane/e2e/measure"

	"github.com/vsplane/vsplane/e2e/freeport"
)

// EnvBinDir names the environment variable that points at a directory
// holding kube-apiserver and etcd.
const EnvBinDir = "VSPLANE_KUBE_BIN"

// DefaultServiceCIDR is the Service ClusterIP range (see the address plan).
const DefaultServiceCIDR = "198.18.0.0/16"

// Options configures Start. The zero value is usable.
type Options struct {
	// BinDir holds kube-apiserver and etcd. Empty: $VSPLANE_KUBE_BIN, then
	// <repo>/.cache/kube/*/bin found by walking up from the working directory.
	BinDir string
	// ServiceCIDR is --service-cluster-ip-range; default DefaultServiceCIDR.
	ServiceCIDR string
	// StartTimeout bounds the whole start-up (both processes ready); default 90s.
	StartTimeout time.Duration
	// TempDir is the parent of the per-env directory; default os.TempDir().
	TempDir string
	// KeepDir keeps the per-env directory (logs, data) after Stop, for debugging.
	KeepDir bool
	// AuthorizationMode is --authorization-mode; default AlwaysAllow (tests
	// of authorization use RBAC). A list flag: ExtraAPIServerFlags would
	// add to it, not replace it.
	AuthorizationMode string
	// ExtraAPIServerFlags are appended to the kube-apiserver command line
	// (later flags win).
	ExtraAPIServerFlags []string
	// AdvertiseAddress, if set, is the address the apiserver publishes as
	// the endpoint of Service default/kubernetes (its secure port on it; the
	// lease endpoint reconciler on, as in a real cluster): where Pods reach
	// it, e.g. the VM test bed's view of host loopback. It, and the
	// Service's ClusterIP, are in the serving certificate. Empty: the
	// apiserver advertises 127.0.0.1 and publishes no endpoint.
	AdvertiseAddress string
	// EgressProxySocket, if set, is the unix socket of an HTTP CONNECT
	// proxy the apiserver dials kubelets and Pods through (its "cluster"
	// egress selection): logs, exec, port-forward and the proxy
	// subresources of a cluster it cannot route to. (Over TCP the
	// apiserver insists on TLS: v1.37.2 dereferences a nil tlsConfig for
	// an http:// proxy URL.)
	EgressProxySocket string
	// Controllers also runs kube-controller-manager and kube-scheduler
	// (from BinDir) with client certificates of their own users, the
	// cluster CA as --root-ca-file (ConfigMap kube-root-ca.crt in every
	// namespace) and the service-account key: Deployments, DaemonSets,
	// EndpointSlices and node lifecycle as in a real cluster.
	Controllers bool
	// ClusterCIDR, with Controllers, makes kube-controller-manager give
	// every Node a Pod range of NodeCIDRMaskSize (default 24) bits from it
	// (spec.podCIDR).
	ClusterCIDR      string
	NodeCIDRMaskSize int
	// Logger receives progress messages; default zap.NewNop().
	Logger *zap.Logger
}

// Env is a running control plane. Its methods are safe for concurrent use.
type Env struct {
	// Dir holds certs, etcd data, logs (etcd.log, kube-apiserver.log) and the kubeconfig.
	Dir string
	// Kubeconfig is the path of a kubeconfig (admin client cert) for this env.
	Kubeconfig string
	// Host is the apiserver URL, e.g. https://127.0.0.1:41234.
	Host string
	// EtcdURL is the etcd client URL.
	EtcdURL string
	// BinDir holds the kube binaries (kube-apiserver, etcd, kubectl).
	BinDir string
	// ServiceAccountKey is the PEM key the apiserver signs ServiceAccount
	// tokens with (tests forge expired tokens with it).
	ServiceAccountKey string
	// StartupDuration is how long Start took until /readyz answered ok.
	StartupDuration time.Duration

	cfg      *rest.Config
	pki      *pki
	log      *zap.Logger
	keepDir  bool
	stopOnce sync.Once
	stopErr  error

	mu      sync.Mutex
	procs   []*proc // in start order; stopped in reverse
	api     *proc   // the running kube-apiserver (nil while stopped)
	apiBin  string
	apiArgs []string
	hc      *http.Client
	starts  int // kube-apiserver starts (log file names)
}

type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // Wait result, valid after done
}

// RESTConfig returns a fresh copy of the admin client config with raised
// client-side rate limits (QPS 200, Burst 400) so tests are not throttled.
func (e *Env) RESTConfig() *rest.Config { return rest.CopyConfig(e.cfg) }

// Stop kills kube-apiserver and etcd (SIGTERM, then SIGKILL after 5s) and
// removes Dir unless Options.KeepDir. Idempotent; later calls return the
// first result.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		var errs []error
		e.mu.Lock()
		procs := slices.Clone(e.procs)
		e.mu.Unlock()
		for i := len(procs) - 1; i >= 0; i-- {
			t := time.Now()
			killed := procs[i].stop()
			e.log.Debug("stopped", zap.String("name", procs[i].name),
				zap.Duration("took", time.Since(t)), zap.Bool("killed", killed))
		}
		if !e.keepDir {
			if err := os.RemoveAll(e.Dir); err != nil {
				errs = append(errs, err)
			}
		} else {
			e.log.Info("kubeenv directory kept", zap.String("dir", e.Dir))
		}
		e.stopErr = errors.Join(errs...)
	})
	return e.stopErr
}

// Start launches etcd and kube-apiserver on free loopback ports and returns
// once /readyz is ok. On any failure everything started is torn down and the
// error carries the tail of the failing process's log. ctx cancels start-up
// only; use Stop to end the env.
func Start(ctx context.Context, opts Options) (*Env, error) {
	binDir, err := FindBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	if opts.AuthorizationMode == "" {
		opts.AuthorizationMode = "AlwaysAllow"
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = DefaultServiceCIDR
	}
	if _, _, err := net.ParseCIDR(opts.ServiceCIDR); err != nil {
		return nil, fmt.Errorf("kubeenv: bad ServiceCIDR: %w", err)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 90 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	// Free ports are found by bind-and-release, so another process can grab
	// one before etcd/apiserver bind it. Such a loss shows up as "address
	// already in use" and is retried with new ports.
	const attempts = 3
	for i := 1; ; i++ {
		env, err := start(ctx, binDir, opts)
		if err == nil || i == attempts || !strings.Contains(err.Error(), "address already in use") {
			return env, err
		}
		opts.Logger.Warn("kubeenv port race, retrying", zap.Error(err))
	}
}

func start(ctx context.Context, binDir string, opts Options) (_ *Env, retErr error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	dir, err := os.MkdirTemp(opts.TempDir, "vsplane-kubeenv-")
	if err != nil {
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	e := &Env{Dir: dir, log: opts.Logger, keepDir: opts.KeepDir}
	defer func() {
		if retErr != nil {
			_ = e.Stop()
		}
	}()

	var serverIPs []net.IP
	if opts.AdvertiseAddress != "" {
		ip := net.ParseIP(opts.AdvertiseAddress)
		if ip == nil {
			return nil, fmt.Errorf("kubeenv: AdvertiseAddress %q is not an IP address", opts.AdvertiseAddress)
		}
		serverIPs = append(serverIPs, ip)
	}
	if first, err := firstServiceIP(opts.ServiceCIDR); err == nil {
		serverIPs = append(serverIPs, first)
	}
	p, err := newPKI(serverIPs...)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: generating certs: %w", err)
	}
	files, err := p.write(dir)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: writing certs: %w", err)
	}
	ports, err := freeport.Pick(3)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: finding free ports: %w", err)
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	e.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	e.Host = "https://127.0.0.1:" + strconv.Itoa(apiPort)

	etcd, err := e.spawn(filepath.Join(binDir, "etcd"), "etcd",
		"--name=kubeenv",
		"--data-dir="+filepath.Join(dir, "etcd-data"),
		"--listen-client-urls="+e.EtcdURL,
		"--advertise-client-urls="+e.EtcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubeenv="+peerURL,
		"--initial-cluster-state=new",
		// Throw-away data: durability buys nothing and fsync dominates latency.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}
	if err := awaitReady(ctx, etcd, e.EtcdURL+"/health", http.DefaultClient, etcdHealthy); err != nil {
		return nil, err
	}
	e.log.Debug("etcd ready", zap.String("url", e.EtcdURL), zap.Duration("after", time.Since(t0)))

	advertise, reconciler := "127.0.0.1", "none"
	if opts.AdvertiseAddress != "" {
		advertise, reconciler = opts.AdvertiseAddress, "lease"
	}
	args := []string{
		"--etcd-servers=" + e.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=" + advertise,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + files.serverCert,
		"--tls-private-key-file=" + files.serverKey,
		"--client-ca-file=" + files.ca,
		"--authorization-mode=" + opts.AuthorizationMode,
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + files.saKey,
		"--service-account-signing-key-file=" + files.saKey,
		"--service-cluster-ip-range=" + opts.ServiceCIDR,
		// Without an AdvertiseAddress no real endpoint is behind the
		// "kubernetes" Service: 127.0.0.1 is not a routable endpoint and
		// nothing should be reconciled.
		"--endpoint-reconciler-type=" + reconciler,
		"--profiling=false",
		// As kubeadm and managed clusters do: the agent DaemonSet is
		// privileged (deploy/), and dry-run applies must accept it.
		"--allow-privileged=true",
	}
	if opts.Controllers {
		// Nodes: the apiserver authenticates to kubelets with a client
		// certificate of its own (system:masters, so their webhook
		// authorization passes) and dials them by InternalIP only (a
		// node name would be looked up in this machine's DNS).
		kargs, err := writeKubeletClient(dir, p)
		if err != nil {
			return nil, err
		}
		args = append(args, kargs...)
	}
	if opts.EgressProxySocket != "" {
		f, err := writeEgressConfig(dir, opts.EgressProxySocket)
		if err != nil {
			return nil, err
		}
		args = append(args, "--egress-selector-config-file="+f)
	}
	args = append(args, opts.ExtraAPIServerFlags...)
	e.apiBin, e.apiArgs = filepath.Join(binDir, "kube-apiserver"), args
	e.BinDir = binDir
	e.ServiceAccountKey = files.saKey
	cfg, hc, err := clientConfig(e.Host, p)
	if err != nil {
		return nil, err
	}
	e.hc = hc
	if err := e.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	// The apiserver creates Service default/kubernetes shortly after it is
	// ready. Await it, so no test sees it appear in the middle (a Service
	// every node then programs).
	if err := awaitReady(ctx, e.api, e.Host+"/api/v1/namespaces/default/services/kubernetes", e.hc, func([]byte) bool { return true }); err != nil {
		return nil, err
	}
	e.cfg = cfg
	e.pki = p
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kubeconfig(e.Host, p.caCert, "vsplane-admin", p.clientCert, p.clientKey), 0o600); err != nil {
		return nil, fmt.Errorf("kubeenv: writing kubeconfig: %w", err)
	}
	if opts.Controllers {
		if err := e.startControllers(ctx, opts, files); err != nil {
			return nil, err
		}
	}
	e.StartupDuration = time.Since(t0)
	e.log.Info("kubeenv ready", zap.String("host", e.Host), zap.String("dir", dir),
		zap.Duration("startup", e.StartupDuration))
	return e, nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 5s), leaving
// etcd and the data: clients see the API server down until
// StartAPIServer. No-op if it is not running.
func (e *Env) StopAPIServer() {
	e.mu.Lock()
	api := e.api
	e.api = nil
	e.mu.Unlock()
	if api != nil {
		api.stop()
	}
}

// StartAPIServer starts kube-apiserver (again) with the same flags, port
// and data, and returns once /readyz is ok. No-op if it is running.
func (e *Env) StartAPIServer(ctx context.Context) error {
	e.mu.Lock()
	if e.api != nil {
		e.mu.Unlock()
		return nil
	}
	e.starts++
	name := "kube-apiserver"
	if e.starts > 1 {
		name = fmt.Sprintf("kube-apiserver-%d", e.starts)
	}
	e.mu.Unlock()
	api, err := e.spawn(e.apiBin, name, e.apiArgs...)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.api = api
	e.mu.Unlock()
	return awaitReady(ctx, api, e.Host+"/readyz", e.hc, bodyOK)
}

// spawn starts one binary with stdout+stderr going to <Dir>/<name>.log.
func (e *Env) spawn(bin, name string, args ...string) (*proc, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("kubeenv: %s binary: %w (run scripts/kube/build.sh)", name, err)
	}
	logPath := filepath.Join(e.Dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Dir = e.Dir
	// Own process group, and killed by the kernel if our thread dies, so a
	// crashed test does not leak servers holding ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("kubeenv: starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	e.log.Debug("started", zap.String("name", name), zap.Int("pid", cmd.Process.Pid))
	return p, nil
}

// stop ends the process: SIGTERM, then SIGKILL after 5s. It reports
// whether SIGKILL was needed.
func (p *proc) stop() (killed bool) {
	select {
	case <-p.done:
		return false
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return false
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return true
	}
}

// LogTail returns the last n lines of each process log (etcd, then
// kube-apiserver), for diagnosing failures. Call it before Stop.
func (e *Env) LogTail(n int) string {
	var b strings.Builder
	e.mu.Lock()
	procs := slices.Clone(e.procs)
	e.mu.Unlock()
	for _, p := range procs {
		fmt.Fprintf(&b, "--- %s (%s) ---\n%s\n", p.name, p.logPath, p.logTail(n))
	}
	return b.String()
}

// logTail returns the last n lines of the process log.
func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.logPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func etcdHealthy(b []byte) bool { return bytes.Contains(b, []byte(`"health":"true"`)) }
func bodyOK(b []byte) bool      { return strings.TrimSpace(string(b)) == "ok" }

// awaitReady polls url until ok(body) with status 200, the process exits,
// or ctx ends. Failures carry the process log tail.
func awaitReady(ctx context.Context, p *proc, url string, hc *http.Client, ok func([]byte) bool) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
		if err != nil {
			cancel()
			return fmt.Errorf("kubeenv: %w", err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && ok(body) {
				cancel()
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, lastLines(string(body), 10))
		} else {
			last = err.Error()
		}
		cancel()
		select {
		case <-p.done:
			return fmt.Errorf("kubeenv: %s exited before becoming ready (%v); log tail:\n%s",
				p.name, p.err, p.logTail(40))
		case <-ctx.Done():
			return fmt.Errorf("kubeenv: %s not ready at %s: %w; last probe: %s; log tail:\n%s",
				p.name, url, ctx.Err(), last, p.logTail(40))
		case <-tick.C:
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// clientConfig builds the admin rest.Config and a matching HTTP client for
// the readiness probe.
func clientConfig(host string, p *pki) (*rest.Config, *http.Client, error) {
	cfg := &rest.Config{
		Host: host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   p.caCert,
			CertData: p.clientCert,
			KeyData:  p.clientKey,
		},
		QPS:   200,
		Burst: 400,
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(p.caCert) {
		return nil, nil, errors.New("kubeenv: bad generated CA")
	}
	cert, err := tls.X509KeyPair(p.clientCert, p.clientKey)
	if err != nil {
		return nil, nil, fmt.Errorf("kubeenv: client cert: %w", err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
	}}}
	return cfg, hc, nil
}

// kubeconfig renders a self-contained kubeconfig (all data inline, base64)
// for user, authenticated by a client certificate.
func kubeconfig(host string, ca []byte, user string, cert, key []byte) []byte {
	b64 := base64.StdEncoding.EncodeToString
	return []byte(`apiVersion: v1
kind: Config
clusters:
- name: vsplane-kubeenv
  cluster:
    server: ` + host + `
    certificate-authority-data: ` + b64(ca) + `
users:
- name: ` + user + `
  user:
    client-certificate-data: ` + b64(cert) + `
    client-key-data: ` + b64(key) + `
contexts:
- name: vsplane-kubeenv
  context:
    cluster: vsplane-kubeenv
    user: ` + user + `
current-context: vsplane-kubeenv
`)
}

var binaries = []string{"kube-apiserver", "etcd"}

func hasBinaries(dir string) bool {
	for _, b := range binaries {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// FindBinDir resolves the directory holding kube-apiserver and etcd:
// explicit (if non-empty), else $VSPLANE_KUBE_BIN, else the newest-versioned
// <repo>/.cache/kube/*/bin found walking up from the working directory.
// The error tells how to build the binaries.
func FindBinDir(explicit string) (string, error) {
	const hint = "run scripts/kube/build.sh (or set " + EnvBinDir + " to a directory with kube-apiserver and etcd)"
	for _, c := range []struct{ dir, from string }{{explicit, "Options.BinDir"}, {os.Getenv(EnvBinDir), EnvBinDir}} {
		if c.dir == "" {
			continue
		}
		if !hasBinaries(c.dir) {
			return "", fmt.Errorf("kubeenv: %s=%s lacks executable kube-apiserver and etcd; %s", c.from, c.dir, hint)
		}
		return c.dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kubeenv: %w", err)
	}
	var searched []string
	for d := wd; ; d = filepath.Dir(d) {
		pattern := filepath.Join(d, ".cache", "kube", "*", "bin")
		searched = append(searched, pattern)
		matches, _ := filepath.Glob(pattern)
		// Lexical order approximates version order for one major version;
		// the last complete one wins.
		sort.Sort(sort.Reverse(sort.StringSlice(matches)))
		for _, m := range matches {
			if hasBinaries(m) {
				return m, nil
			}
		}
		if measure.IsRepoRoot(d) {
			break
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Errorf("kubeenv: kube-apiserver/etcd not found (searched %s); %s",
		strings.Join(searched, ", "), hint)
}
