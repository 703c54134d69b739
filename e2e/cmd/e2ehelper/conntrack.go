package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
)

// conntrackCmd prints the caller's network namespace's IPv4 connection
// tracking entries of one protocol, one per line (the VM has no conntrack
// tool; the flow test dumps them beside ipvsadm -Lnc when it keeps logs):
//
//	udp 198.19.0.10:41000 -> 198.18.0.10:53 | reply 198.19.1.11:8080 -> 198.19.0.10:41000
func conntrackCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("conntrack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	protoFlag := fs.String("proto", "udp", "tcp, udp or sctp")
	ipv6 := fs.Bool("ipv6", false, "the IPv6 table instead of IPv4's")
	if err := fs.Parse(args); err != nil {
		return usageError(err.Error())
	}
	proto, err := kernel.ParseProtocol(*protoFlag)
	if err != nil {
		return usageError(err.Error())
	}
	family := kernel.FamilyIPv4
	if *ipv6 {
		family = kernel.FamilyIPv6
	}
	ct, err := linux.NewConntrack()
	if err != nil {
		return err
	}
	defer ct.Close()
	entries, err := ct.Entries(family, proto)
	for _, e := range entries {
		fmt.Fprintf(stdout, "%s %s -> %s | reply %s -> %s\n", e.Protocol, e.Orig.Src, e.Orig.Dst, e.Reply.Src, e.Reply.Dst)
	}
	return err
}
