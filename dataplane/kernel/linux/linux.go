// Package linux implements the kernel interfaces against the running Linux
// kernel of the caller's network namespace: IPVS through moby/ipvs, links
// and addresses through vishvananda/netlink, ipsets through the ipset
// netlink protocol, iptables through iptables-restore/-save, sysctls
// through /proc/sys.
//
// Every handle binds to the network namespace of the thread that created it
// (netlink sockets) or of the process (exec'd iptables tools), so create
// them in the namespace you mean to change.
package linux

import "time"

// netlinkTimeout bounds each netlink round trip.
const netlinkTimeout = 30 * time.Second
