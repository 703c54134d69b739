// Command coredns is CoreDNS v1.14.6 with only the plugins the real-node test
// bed's cluster DNS uses (the kube-dns Service of e2e/nodes; its Corefile is
// kubeadm's without forwarding: nothing outside the test bed exists), built
// into the image registry.k8s.io/coredns/coredns:v1.14.6 by scripts/images.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives are the compiled-in plugins in CoreDNS's own order
// (core/dnsserver/zdirectives.go): a Corefile's plugins run in this order.
var directives = []string{
	"reload", "ready", "health", "prometheus", "errors", "log",
	"loadbalance", "cache", "kubernetes", "loop",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
