package engine

import (
	"google.golang.org/protobuf/proto"

	vsplanev1 "github.com/vsplane/vsplane/proto/vsplane/v1"
)

// partPool makes the variants of one Service built in one Apply share
// their equal sub-messages. Variants differ in little (a node hosting endpoints sees
// them marked local and gets their KUBE-LOOP-BACK entries), so without it
// every node-specific variant is another copy of every real server: at
// 10,000 Services × 10 endpoints that was 100,000 copies and most of the
// state's memory. Resources are immutable once built, so sharing is safe.
// Lookups go by a few identifying fields and equality is proto.Equal, so
// a field added to the protos later cannot make different parts shared.
type partPool struct {
	// vss are the virtual servers by index, of the first variant with one.
	vss     []*vsplanev1.VirtualServer
	rs      map[rsKey][]*vsplanev1.RealServer
	entries map[entryKey][]*vsplanev1.IPSetEntry
}

type rsKey struct {
	address string
	port    uint32
}

type entryKey struct {
	set          vsplanev1.IPSet
	ip, ip2, net string
	port         uint32
}

// share replaces st's parts by equal pooled ones and pools the new ones.
func (p *partPool) share(st *vsplanev1.ServiceState) {
	for i, en := range st.GetIpsetEntries() {
		st.IpsetEntries[i] = pooled(&p.entries, entryKey{en.GetSet(), en.GetIp(), en.GetIp2(), en.GetNet(), en.GetPort()}, en)
	}
	for i, vs := range st.GetVirtualServers() {
		if i < len(p.vss) && proto.Equal(vs, p.vss[i]) {
			st.VirtualServers[i] = p.vss[i]
			continue
		}
		if i == len(p.vss) {
			p.vss = append(p.vss, vs)
		}
		for j, rs := range vs.GetRealServers() {
			vs.RealServers[j] = pooled(&p.rs, rsKey{rs.GetAddress(), rs.GetPort()}, rs)
		}
	}
}

// pooled returns the pooled message equal to m (same key), pooling m if
// there is none.
func pooled[K comparable, M proto.Message](pool *map[K][]M, key K, m M) M {
	if *pool == nil {
		*pool = map[K][]M{}
	}
	for _, c := range (*pool)[key] {
		if proto.Equal(c, m) {
			return c
		}
	}
	(*pool)[key] = append((*pool)[key], m)
	return m
}
