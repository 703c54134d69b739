package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/e2e/vm/wire"
)

// kube-proxy's nftables mode keeps everything in one table per family
// (pkg/proxy/nftables: kubeProxyTable). A Service port has a chain
// "service-HASH-ns/name/proto/port" whose rule picks an endpoint with
// "numgen random mod N" from an anonymous dnat map (v1.37; Services with
// session affinity use a chain per endpoint instead), the chain and map
// written in one transaction per sync. The probe reads them over nf_tables
// netlink, as it reads IPVS: no nft process, a few requests per poll.
const nftTable = "kube-proxy"

// nftSocket returns the probe's NETLINK_NETFILTER socket in netns.
func (p *probe) nftSocket(netns string) (*nl.NetlinkSocket, error) {
	if s, ok := p.nft[netns]; ok {
		return s, nil
	}
	ns, err := netnsAt(netns)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	s, err := nl.GetNetlinkSocketAt(ns, netnsNone, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nf_tables socket in %s: %w", netns, err)
	}
	p.nft[netns] = s
	return s, nil
}

var netnsNone = netns.None()

func netnsAt(name string) (netns.NsHandle, error) {
	ns, err := netns.GetFromPath("/run/netns/" + name)
	if err != nil {
		return netns.None(), fmt.Errorf("namespace %s: %w", name, err)
	}
	return ns, nil
}

// nftExchange sends req on s and calls each for every answer message of
// nf_tables type reply until the kernel's closing DONE or ACK. A netlink
// error is returned as a syscall.Errno (ENOENT: no such object).
func nftExchange(s *nl.NetlinkSocket, req *nl.NetlinkRequest, reply int, each func(attrs []byte) error) error {
	if err := s.Send(req); err != nil {
		return err
	}
	for {
		msgs, _, err := s.Receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Seq {
				continue // an answer to an earlier request given up on
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return errors.New("short netlink error message")
				}
				if errno := -int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
					return syscall.Errno(errno)
				}
				return nil // the ACK
			case uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | reply):
				if len(m.Data) < nl.SizeofNfgenmsg {
					return errors.New("short nf_tables message")
				}
				if err := each(m.Data[nl.SizeofNfgenmsg:]); err != nil {
					return err
				}
			}
		}
	}
}

// nftRuleSets returns, by chain, the sets and maps that the rules of
// kube-proxy's IPv4 table in netns look up (chain "": every chain).
func (p *probe) nftRuleSets(netns, chain string) (map[string][]string, error) {
	s, err := p.nftSocket(netns)
	if err != nil {
		return nil, err
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETRULE, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.NFPROTO_IPV4, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(unix.NFTA_RULE_TABLE, nl.ZeroTerminated(nftTable)))
	if chain != "" {
		req.AddData(nl.NewRtAttr(unix.NFTA_RULE_CHAIN, nl.ZeroTerminated(chain)))
	}
	out := map[string][]string{}
	err = nftExchange(s, req, unix.NFT_MSG_NEWRULE, func(attrs []byte) error {
		as, err := nl.ParseRouteAttr(attrs)
		if err != nil {
			return err
		}
		var table, ch string
		var sets []string
		for _, a := range as {
			switch a.Attr.Type & nl.NLA_TYPE_MASK {
			case unix.NFTA_RULE_TABLE:
				table = cString(a.Value)
			case unix.NFTA_RULE_CHAIN:
				ch = cString(a.Value)
			case unix.NFTA_RULE_EXPRESSIONS:
				if sets, err = lookupSets(a.Value); err != nil {
					return err
				}
			}
		}
		if table == nftTable && (chain == "" || ch == chain) {
			out[ch] = append(out[ch], sets...)
		}
		return nil
	})
	if errors.Is(err, unix.ENOENT) {
		return out, nil // no table or chain yet
	}
	if err != nil {
		return nil, fmt.Errorf("nf_tables rules of %q in %s: %w", chain, netns, err)
	}
	return out, nil
}

// lookupSets returns the set names of a rule's "lookup" expressions
// (NFTA_RULE_EXPRESSIONS: a list of NFTA_EXPR_NAME + NFTA_EXPR_DATA).
func lookupSets(exprs []byte) ([]string, error) {
	list, err := nl.ParseRouteAttr(exprs)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list {
		as, err := nl.ParseRouteAttr(e.Value)
		if err != nil {
			return nil, err
		}
		var name string
		var data []byte
		for _, a := range as {
			switch a.Attr.Type & nl.NLA_TYPE_MASK {
			case unix.NFTA_EXPR_NAME:
				name = cString(a.Value)
			case unix.NFTA_EXPR_DATA:
				data = a.Value
			}
		}
		if name != "lookup" {
			continue
		}
		ds, err := nl.ParseRouteAttr(data)
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			if d.Attr.Type&nl.NLA_TYPE_MASK == unix.NFTA_LOOKUP_SET {
				out = append(out, cString(d.Value))
			}
		}
	}
	return out, nil
}

// nftSetData calls each with the data (a map's value; nil for a plain set)
// of every element of set in kube-proxy's IPv4 table in netns.
func (p *probe) nftSetData(netns, set string, each func(data []byte)) error {
	s, err := p.nftSocket(netns)
	if err != nil {
		return err
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSETELEM, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.NFPROTO_IPV4, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(unix.NFTA_SET_ELEM_LIST_TABLE, nl.ZeroTerminated(nftTable)))
	req.AddData(nl.NewRtAttr(unix.NFTA_SET_ELEM_LIST_SET, nl.ZeroTerminated(set)))
	err = nftExchange(s, req, unix.NFT_MSG_NEWSETELEM, func(attrs []byte) error {
		as, err := nl.ParseRouteAttr(attrs)
		if err != nil {
			return err
		}
		for _, a := range as {
			if a.Attr.Type&nl.NLA_TYPE_MASK != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				continue
			}
			elems, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return err
			}
			for _, e := range elems {
				fields, err := nl.ParseRouteAttr(e.Value)
				if err != nil {
					return err
				}
				var data []byte
				for _, f := range fields {
					if f.Attr.Type&nl.NLA_TYPE_MASK != unix.NFTA_SET_ELEM_DATA {
						continue
					}
					vs, err := nl.ParseRouteAttr(f.Value)
					if err != nil {
						return err
					}
					for _, v := range vs {
						if v.Attr.Type&nl.NLA_TYPE_MASK == unix.NFTA_DATA_VALUE {
							data = v.Value
						}
					}
				}
				each(data)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("nf_tables elements of %s in %s: %w", set, netns, err)
	}
	return nil
}

// isEndpoint reports whether a dnat map's value is ep: kube-proxy maps
// "numgen random mod N" to "ipv4_addr . inet_service", each field in a
// 4-byte register (the port big-endian in its first two bytes).
func isEndpoint(data []byte, ep netip.AddrPort) bool {
	a := ep.Addr().As4()
	return len(data) >= 6 && [4]byte(data[:4]) == a && binary.BigEndian.Uint16(data[4:6]) == ep.Port()
}

// nftHasEndpoints reports whether each target's endpoint (RS) is a value
// of the dnat map its service-port chain (VS) looks up in kube-proxy's
// table in netns (no table or chain yet: no).
func (p *probe) nftHasEndpoints(netns string, ts []wire.ProbeTarget) (bool, error) {
	for _, t := range ts {
		ep, err := netip.ParseAddrPort(t.RS)
		if err != nil || !ep.Addr().Is4() {
			return false, fmt.Errorf("nftables target endpoint %q: want IPv4 ip:port", t.RS)
		}
		sets, err := p.nftRuleSets(netns, t.VS)
		if err != nil {
			return false, err
		}
		found := false
		for _, set := range sets[t.VS] {
			err := p.nftSetData(netns, set, func(d []byte) { found = found || isEndpoint(d, ep) })
			if errors.Is(err, unix.ENOENT) {
				return false, nil // a sync replaced the map meanwhile: the next poll reads the new one
			}
			if err != nil {
				return false, err
			}
		}
		if !found {
			return false, nil
		}
	}
	return true, nil
}

// nftCount counts, in kube-proxy's IPv4 table in netns, the service-port
// chains ("service-...") whose name contains one of substrings (none: all)
// and the endpoints in the dnat maps they look up: the nftables
// counterparts of virtual and real servers. (Session-affinity Services
// keep their endpoints in chains instead; the benchmark has none.)
func (p *probe) nftCount(netns string, substrings []string) (services, endpoints int, err error) {
	// A sync that replaces a map between the rule dump and its element
	// dump makes the second ENOENT: count again.
	for range 5 {
		services, endpoints, err = p.nftCountOnce(netns, substrings)
		if !errors.Is(err, unix.ENOENT) {
			break
		}
	}
	return services, endpoints, err
}

func (p *probe) nftCountOnce(netns string, substrings []string) (services, endpoints int, err error) {
	sets, err := p.nftRuleSets(netns, "")
	if err != nil {
		return 0, 0, err
	}
	for chain, ss := range sets {
		if !strings.HasPrefix(chain, "service-") ||
			(len(substrings) > 0 && !slices.ContainsFunc(substrings, func(sub string) bool { return strings.Contains(chain, sub) })) {
			continue
		}
		services++
		for _, set := range ss {
			if err := p.nftSetData(netns, set, func(d []byte) {
				if len(d) >= 6 {
					endpoints++
				}
			}); err != nil {
				return 0, 0, err
			}
		}
	}
	return services, endpoints, nil
}

func cString(b []byte) string { return strings.TrimRight(string(b), "\x00") }
