// Command kstate runs inside a node of the VM test bed (e2e/soak) and
// prints, as one JSON line, what the node's agent says of its kernel
// against its desired state (AgentInspectService.GetKernelState on the
// agent's loopback inspection address): the number of differences, the
// items not in sync (virtual servers, addresses, ipsets, iptables chains
// and jumps), failed resources and read errors.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/vsplane/vsplane/e2e/soak"
	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:10263", "the agent's inspection address")
	timeout := flag.Duration("timeout", 5*time.Second, "bound of the call")
	flag.Parse()
	if err := run(*addr, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "kstate:", err)
		os.Exit(1)
	}
}

func run(addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := vsplanev1.NewAgentInspectServiceClient(conn).GetKernelState(ctx, &vsplanev1.GetKernelStateRequest{})
	if err != nil {
		return err
	}
	st := soak.KernelState{Differences: resp.GetDifferences(), VirtualServers: len(resp.GetVirtualServers()),
		Addresses: len(resp.GetAddresses()), Failed: resp.GetFailed(),
		ReadErrors: resp.GetReadErrors(), KernelErrors: resp.GetKernelErrors()}
	for _, vs := range resp.GetVirtualServers() {
		if vs.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			st.NotInSync = append(st.NotInSync, vs.GetKey()+" "+vs.GetStatus().String())
		}
	}
	for _, a := range resp.GetAddresses() {
		if a.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			st.NotInSync = append(st.NotInSync, "address "+a.GetAddress()+" "+a.GetStatus().String())
		}
	}
	for _, set := range resp.GetIpsets() {
		if set.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			st.NotInSync = append(st.NotInSync, fmt.Sprintf("ipset %s %s missing %q extra %q %s", set.GetName(), set.GetStatus(),
				set.GetMissingEntries(), set.GetExtraEntries(), set.GetHeaderDiffers()))
		}
	}
	for _, ch := range resp.GetChains() {
		if ch.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			st.NotInSync = append(st.NotInSync, fmt.Sprintf("chain %s %s %s %s: %d rules, want %d, missing %q extra %q",
				ch.GetFamily(), ch.GetTable(), ch.GetChain(), ch.GetStatus(), ch.GetKernelRules(), ch.GetDesiredRules(), ch.GetMissingRules(), ch.GetExtraRules()))
		}
	}
	for _, j := range resp.GetJumps() {
		if j.GetStatus() != vsplanev1.ItemStatus_ITEM_STATUS_IN_SYNC {
			st.NotInSync = append(st.NotInSync, fmt.Sprintf("jump %s %s %s %s %s", j.GetFamily(), j.GetTable(), j.GetChain(), j.GetRule(), j.GetStatus()))
		}
	}
	st.IPSets, st.Chains = len(resp.GetIpsets()), len(resp.GetChains())
	return json.NewEncoder(os.Stdout).Encode(st)
}
