// Package healthcheck serves the health-check node ports of Services with
// externalTrafficPolicy: Local, like kube-proxy's ServiceHealthServer
// (pkg/proxy/healthcheck/service_health.go): one HTTP server per Service
// on its healthCheckNodePort, answering 200 while the node has a local
// endpoint of the Service (and the proxy is healthy) and 503 otherwise, so
// external load balancers send traffic only to nodes that can serve it.
// Like kube-proxy, which runs one health server per proxied IP family, a
// dual-stack Service gets an IPv4 and an IPv6 listener, each counting only
// its family's endpoints.
//
//	reconciler ──HealthChecks, NodePortAddresses──▶ Server.Sync ──▶ listeners
//	                                                             (one per address)
//
// Contract:
//   - Sync makes the running servers match the given Services: new ones are
//     opened, removed ones closed, a changed port or listen address set
//     reopens that Service's servers; everything else is left running.
//   - A port that cannot be bound is never fatal: the Service is left
//     without a server, the error is kept (Errors) and logged once, and the
//     next Sync tries again (like kube-proxy).
//   - Listen addresses: nil means every address of each family the
//     Service has ("0.0.0.0:port" on tcp4, "[::]:port" on tcp6, as
//     kube-proxy with an empty --nodeport-addresses); otherwise one listener
//     per address of those families.
//   - Safe for concurrent use. Close stops every server.
package healthcheck

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Service is one Service's health-check node port.
type Service struct {
	Namespace, Name string
	Port            uint16
	// IPv4 and IPv6 are the families the Service has; LocalEndpoints4 and
	// LocalEndpoints6 the number of this node's endpoints of each.
	IPv4, IPv6                       bool
	LocalEndpoints4, LocalEndpoints6 int
}

func (s Service) key() string { return s.Namespace + "/" + s.Name }

// Config configures a Server.
type Config struct {
	Logger *zap.Logger
	// ProxyHealthy is the agent's own health (kube-proxy's
	// serviceProxyHealthy); an unhealthy proxy answers 503. nil: healthy.
	ProxyHealthy func() bool
	// Listen opens a listener (default net.Listen); tests may replace it.
	Listen func(network, address string) (net.Listener, error)
}

// Server runs the health-check servers.
type Server struct {
	cfg Config
	log *zap.Logger

	mu       sync.Mutex
	services map[string]*instance // running, by namespace/name
	errs     map[string]string    // bind failures, by namespace/name
	closed   bool
}

type instance struct {
	svc     Service // LocalEndpoints updated in place under Server.mu
	addrs   []netip.Addr
	servers []*http.Server
	// listeners are closed directly too: a Serve goroutine that has not
	// started yet would close its listener only later, and a reopen on the
	// same port must not find it still bound.
	listeners []net.Listener
}

// New returns a Server with nothing running.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Listen == nil {
		cfg.Listen = net.Listen
	}
	return &Server{cfg: cfg, log: cfg.Logger, services: map[string]*instance{}, errs: map[string]string{}}
}

// Sync runs one server set per Service in services, listening on addrs
// (nil: all addresses; empty non-nil: nowhere, an error per Service). It
// returns the Services that have no server because of an error, by
// namespace/name.
func (s *Server) Sync(services []Service, addrs []netip.Addr) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	want := make(map[string]Service, len(services))
	for _, svc := range services {
		if _, dup := want[svc.key()]; !dup {
			want[svc.key()] = svc
		}
	}
	for key, in := range s.services {
		w, ok := want[key]
		if !ok || w.Port != in.svc.Port || w.IPv4 != in.svc.IPv4 || w.IPv6 != in.svc.IPv6 ||
			!slices.Equal(addrs, in.addrs) || (addrs == nil) != (in.addrs == nil) {
			s.log.Info("closing health check", zap.String("service", key), zap.Uint16("port", in.svc.Port))
			in.close()
			delete(s.services, key)
		}
	}
	errs := map[string]string{}
	for _, key := range sortedKeys(want) {
		svc := want[key]
		if in, ok := s.services[key]; ok {
			in.svc.LocalEndpoints4, in.svc.LocalEndpoints6 = svc.LocalEndpoints4, svc.LocalEndpoints6
			continue
		}
		in, err := s.open(svc, addrs)
		if err != nil {
			msg := fmt.Sprintf("health check node port %d of %s: %v", svc.Port, key, err)
			if s.errs[key] != msg {
				s.log.Error("cannot start health check server", zap.String("service", key), zap.Uint16("port", svc.Port), zap.Error(err))
			}
			errs[key] = msg
			continue
		}
		s.log.Info("opened health check", zap.String("service", key), zap.Uint16("port", svc.Port))
		s.services[key] = in
	}
	s.errs = errs
	out := make(map[string]string, len(errs))
	for k, v := range errs {
		out[k] = v
	}
	return out
}

// open starts svc's servers; on any failure it closes what it opened.
func (s *Server) open(svc Service, addrs []netip.Addr) (*instance, error) {
	if svc.Port == 0 {
		return nil, errors.New("port 0")
	}
	if !svc.IPv4 && !svc.IPv6 {
		return nil, errors.New("no IP family to serve")
	}
	in := &instance{svc: svc, addrs: slices.Clone(addrs)}
	type listen struct {
		network, host string
		v6            bool
	}
	var listens []listen
	if addrs == nil {
		if svc.IPv4 {
			listens = append(listens, listen{"tcp4", "0.0.0.0", false})
		}
		if svc.IPv6 {
			listens = append(listens, listen{"tcp6", "::", true})
		}
	} else {
		for _, a := range addrs {
			if a.Is4() && svc.IPv4 {
				listens = append(listens, listen{"tcp4", a.String(), false})
			} else if a.Is6() && svc.IPv6 {
				listens = append(listens, listen{"tcp6", a.String(), true})
			}
		}
		if len(listens) == 0 {
			return nil, errors.New("no NodePort address of the Service's families to listen on (node_port_addresses matches none of the node's addresses)")
		}
	}
	key := svc.key()
	for _, l := range listens {
		ln, err := s.cfg.Listen(l.network, net.JoinHostPort(l.host, strconv.Itoa(int(svc.Port))))
		if err != nil {
			in.close()
			return nil, err
		}
		srv := &http.Server{Handler: s.handler(key, svc.Namespace, svc.Name, l.v6), ReadHeaderTimeout: 5 * time.Second}
		in.servers = append(in.servers, srv)
		in.listeners = append(in.listeners, ln)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("health check server stopped", zap.String("service", key), zap.Error(err))
			}
		}()
	}
	return in, nil
}

func (in *instance) close() {
	for _, srv := range in.servers {
		_ = srv.Close()
	}
	for _, ln := range in.listeners {
		_ = ln.Close()
	}
	in.servers, in.listeners = nil, nil
}

// Errors returns the current bind failures, by namespace/name.
func (s *Server) Errors() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.errs))
	for k, v := range s.errs {
		out[k] = v
	}
	return out
}

// Close stops every server; later Syncs do nothing.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, in := range s.services {
		in.close()
		delete(s.services, key)
	}
	s.closed = true
}

// handler answers like kube-proxy's hcHandler: same status rule, headers
// and body bytes.
func (s *Server) handler(key, namespace, name string, v6 bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		in, ok := s.services[key]
		count := 0
		if ok {
			count = in.svc.LocalEndpoints4
			if v6 {
				count = in.svc.LocalEndpoints6
			}
		}
		s.mu.Unlock()
		if !ok {
			// Closed between accept and now; kube-proxy answers nothing.
			return
		}
		healthy := s.cfg.ProxyHealthy == nil || s.cfg.ProxyHealthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if count != 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(Body(namespace, name, count, healthy))
	})
}

// Body is kube-proxy's health-check answer, byte for byte.
func Body(namespace, name string, localEndpoints int, proxyHealthy bool) []byte {
	return fmt.Appendf(nil, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		namespace, name, localEndpoints, proxyHealthy)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
