// Command kernelfloor measures the floor under an agent's cold start: how
// long the kernel takes to accept the same state written as fast as
// vsplane's kernel layer can batch it, with no control plane, stream,
// desired-state compilation or reconciler around it (#27 item 2). It runs
// in the VM test bed, twice:
//
//	ip netns exec SRC kernelfloor dump > state.json   # what SRC's agent wrote
//	ip netns exec DST kernelfloor write < state.json  # DST: a new, empty namespace
//
// dump reads SRC's IPVS (virtual and real servers), kube-ipvs0's addresses
// and the KUBE-* ipsets with their entries. write creates kube-ipvs0 and the
// sets (not timed), then times the netlink writes: every virtual server,
// every real server, every address, every set entry, each kind in one call
// of the kernel layer (which packs many per netlink round trip, as the
// agent's passes do). It reads the namespace back, fails unless it holds
// what was dumped, and prints a JSON wire.FloorResult. iptables-restore and sysctls,
// a few process starts and writes whatever the size, are not part of it.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vsplane/vsplane/dataplane/kernel"
	"github.com/vsplane/vsplane/dataplane/kernel/linux"
	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// State is what dump reads and write writes.
type State struct {
	Servers   []kernel.VirtualServer          `json:"servers"`
	Dests     map[string][]kernel.Destination `json:"dests"` // by VirtualServerKey.String()
	Addresses []netip.Addr                    `json:"addresses"`
	Sets      []kernel.IPSet                  `json:"sets"`
	Entries   map[string][]kernel.Entry       `json:"entries"` // by set name
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kernelfloor dump|write (in the namespace to read or write)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "dump":
		err = dump(os.Stdout)
	case "write":
		err = write(os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q (want dump or write)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kernelfloor:", err)
		os.Exit(1)
	}
}

// handles are the kernel layer's handles in the caller's namespace.
type handles struct {
	ipvs  *linux.IPVS
	links *linux.Links
	sets  *linux.IPSets
}

func open() (*handles, error) {
	var h handles
	var err error
	if h.ipvs, err = linux.NewIPVS(linux.IPVSOptions{}); err != nil {
		return nil, err
	}
	if h.links, err = linux.NewLinks(); err != nil {
		return nil, err
	}
	if h.sets, err = linux.NewIPSets(); err != nil {
		return nil, err
	}
	return &h, nil
}

func dump(out io.Writer) error {
	h, err := open()
	if err != nil {
		return err
	}
	ipvs, links, sets := h.ipvs, h.links, h.sets
	var s State
	if s.Servers, err = ipvs.ListVirtualServers(); err != nil {
		return err
	}
	s.Dests = make(map[string][]kernel.Destination, len(s.Servers))
	for _, vs := range s.Servers {
		d, err := ipvs.ListDestinations(vs.Key)
		if err != nil {
			return err
		}
		s.Dests[vs.Key.String()] = d
	}
	if s.Addresses, err = links.BoundAddresses(kernel.DummyDevice); err != nil {
		return err
	}
	all, err := sets.ListSets()
	if err != nil {
		return err
	}
	s.Entries = map[string][]kernel.Entry{}
	for _, set := range all {
		if !strings.HasPrefix(set.Name, "KUBE-") {
			continue
		}
		s.Sets = append(s.Sets, set)
		if s.Entries[set.Name], err = sets.ListEntries(set.Name); err != nil {
			return err
		}
	}
	return json.NewEncoder(out).Encode(&s)
}

func write(in io.Reader, out io.Writer) error {
	var s State
	if err := json.NewDecoder(in).Decode(&s); err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	h, err := open()
	if err != nil {
		return err
	}
	ipvs, links, sets := h.ipvs, h.links, h.sets
	if have, err := ipvs.ListVirtualServers(); err != nil || len(have) != 0 {
		return fmt.Errorf("the namespace must start without virtual servers: %d (%v)", len(have), err)
	}
	// Not timed: what exists before the agent's first Delta too, or is
	// one write whatever the size.
	if _, err := links.EnsureDummy(kernel.DummyDevice); err != nil {
		return err
	}
	for _, set := range s.Sets {
		if err := sets.CreateSet(set); err != nil {
			return err
		}
	}

	var vsOps, rsOps []kernel.IPVSOp
	for _, vs := range s.Servers {
		vsOps = append(vsOps, kernel.IPVSOp{Kind: kernel.AddVirtualServer, Server: vs})
		for _, d := range s.Dests[vs.Key.String()] {
			rsOps = append(rsOps, kernel.IPVSOp{Kind: kernel.AddDestination, Server: kernel.VirtualServer{Key: vs.Key}, Destination: d})
		}
	}
	addrOps := make([]kernel.AddressOp, 0, len(s.Addresses))
	for _, a := range s.Addresses {
		addrOps = append(addrOps, kernel.AddressOp{Kind: kernel.BindAddress, Addr: a})
	}
	var entryOps []kernel.EntryOp
	for _, set := range s.Sets {
		for _, e := range s.Entries[set.Name] {
			entryOps = append(entryOps, kernel.EntryOp{Kind: kernel.AddEntry, Set: set, Entry: e})
		}
	}

	r := wire.FloorResult{VirtualServers: len(vsOps), RealServers: len(rsOps), Addresses: len(addrOps), SetEntries: len(entryOps)}
	start := time.Now()
	if err := firstError("IPVS", append(ipvs.Apply(vsOps), ipvs.Apply(rsOps)...)); err != nil {
		return err
	}
	r.IPVSSeconds = time.Since(start).Seconds()
	t := time.Now()
	if err := firstError("address", links.ApplyAddresses(kernel.DummyDevice, addrOps)); err != nil {
		return err
	}
	r.AddrSeconds = time.Since(t).Seconds()
	t = time.Now()
	if err := firstError("ipset", sets.ApplyEntries(entryOps)); err != nil {
		return err
	}
	r.SetSeconds = time.Since(t).Seconds()
	r.Seconds = time.Since(start).Seconds()
	r.Writes = r.VirtualServers + r.RealServers + r.Addresses + r.SetEntries
	if r.Seconds > 0 {
		r.WritesPerSec = float64(r.Writes) / r.Seconds
	}
	if err := verify(ipvs, links, sets, &s, r); err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(r)
}

// verify reads the namespace back: it must hold what was dumped.
func verify(ipvs *linux.IPVS, links *linux.Links, sets *linux.IPSets, s *State, r wire.FloorResult) error {
	vs, err := ipvs.ListVirtualServers()
	if err != nil {
		return err
	}
	rs := 0
	for _, v := range vs {
		d, err := ipvs.ListDestinations(v.Key)
		if err != nil {
			return err
		}
		rs += len(d)
	}
	addrs, err := links.BoundAddresses(kernel.DummyDevice)
	if err != nil {
		return err
	}
	counts, err := sets.EntryCounts()
	if err != nil {
		return err
	}
	entries := 0
	for _, set := range s.Sets {
		entries += counts[set.Name]
	}
	if len(vs) != r.VirtualServers || rs != r.RealServers || len(addrs) != r.Addresses || entries != r.SetEntries {
		return fmt.Errorf("written %d virtual servers, %d real servers, %d addresses, %d set entries; the namespace holds %d, %d, %d, %d",
			r.VirtualServers, r.RealServers, r.Addresses, r.SetEntries, len(vs), rs, len(addrs), entries)
	}
	return nil
}

func firstError(what string, errs []error) error {
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d %s writes failed, first: %w", len(failed), len(errs), what, failed[0])
}
