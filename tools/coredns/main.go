// CoreDNS with only the plugins the local platform's cluster DNS uses. No
// forward plugin: names outside cluster.local get no answer, so nothing a Pod
// asks is sent beyond this machine. The full plugin set (cloud providers,
// etcd, ...) would triple a cold build.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order a query passes the plugins in, as in CoreDNS's plugin.cfg.
func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }
