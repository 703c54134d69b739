// Package profiling serves Go's /debug/pprof/ handlers, for the binaries'
// enableProfiling settings (kube-proxy's enableProfiling): on their own
// metrics address, never on a public one.
package profiling

import (
	"net/http"
	"net/http/pprof"
)

// Register adds /debug/pprof/ and its named profiles to mux.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
