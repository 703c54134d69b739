package kernel

import (
	"fmt"
	"net/netip"
	"strconv"
)

// SetType is an ipset type; only the ones the proxier needs are supported.
type SetType string

const (
	HashIP        SetType = "hash:ip"
	HashIPPort    SetType = "hash:ip,port"
	HashIPPortIP  SetType = "hash:ip,port,ip"
	HashIPPortNet SetType = "hash:ip,port,net"
	HashNet       SetType = "hash:net"
	BitmapPort    SetType = "bitmap:port"
)

// Valid reports whether t is one of the supported types.
func (t SetType) Valid() bool {
	switch t {
	case HashIP, HashIPPort, HashIPPortIP, HashIPPortNet, HashNet, BitmapPort:
		return true
	}
	return false
}

// Kernel defaults the implementations fill in on read.
const (
	DefaultHashSize = 1024
	DefaultMaxElem  = 65536
	// MaxSetNameLen is IPSET_MAXNAMELEN-1.
	MaxSetNameLen = 31
)

// IPSet describes a set (its header, not its entries).
type IPSet struct {
	Name string
	Type SetType
	// Family of hash sets (inet or inet6). Must be unspecified for bitmap:port.
	Family Family
	// HashSize is the initial hash size (hash types); 0 = DefaultHashSize.
	// The kernel grows it, so reads report the current size and it is not
	// part of the set's identity.
	HashSize uint32
	// MaxElem (hash types); 0 = DefaultMaxElem.
	MaxElem uint32
	// PortFrom..PortTo is the range of a bitmap:port set (required).
	PortFrom, PortTo uint16
	// Comments creates the set with the comment extension so entries can
	// carry Entry.Comment.
	Comments bool
}

// Normalize fills kernel defaults so a desired set compares equal to what
// a read returns (HashSize is dropped: see IPSet.HashSize).
func (s IPSet) Normalize() IPSet {
	s.HashSize = 0
	if s.Type != BitmapPort && s.MaxElem == 0 {
		s.MaxElem = DefaultMaxElem
	}
	return s
}

// SameAs reports whether s and o are interchangeable for CreateSet: same
// name, type, family, maxelem, comment extension and port range.
func (s IPSet) SameAs(o IPSet) bool { return s.Normalize() == o.Normalize() }

// Validate reports a set the kernel would reject, wrapping ErrInvalid.
func (s IPSet) Validate() error {
	if s.Name == "" || len(s.Name) > MaxSetNameLen {
		return fmt.Errorf("ipset %q: name must be 1..%d bytes: %w", s.Name, MaxSetNameLen, ErrInvalid)
	}
	if !s.Type.Valid() {
		return fmt.Errorf("ipset %s: unsupported type %q: %w", s.Name, s.Type, ErrInvalid)
	}
	if s.Type == BitmapPort {
		if s.Family != FamilyUnspecified {
			return fmt.Errorf("ipset %s: bitmap:port takes no family: %w", s.Name, ErrInvalid)
		}
		if s.PortFrom > s.PortTo {
			return fmt.Errorf("ipset %s: port range %d-%d is empty: %w", s.Name, s.PortFrom, s.PortTo, ErrInvalid)
		}
		if s.HashSize != 0 || s.MaxElem != 0 {
			return fmt.Errorf("ipset %s: bitmap:port takes no hashsize/maxelem: %w", s.Name, ErrInvalid)
		}
		return nil
	}
	if !s.Family.Valid() {
		return fmt.Errorf("ipset %s: family must be inet or inet6: %w", s.Name, ErrInvalid)
	}
	if s.PortFrom != 0 || s.PortTo != 0 {
		return fmt.Errorf("ipset %s: port range only for bitmap:port: %w", s.Name, ErrInvalid)
	}
	return nil
}

// Entry is one member of a set. Which fields are used depends on the type:
//
//	hash:ip           IP
//	hash:ip,port      IP, Protocol, Port
//	hash:ip,port,ip   IP, Protocol, Port, IP2
//	hash:ip,port,net  IP, Protocol, Port, Net
//	hash:net          Net
//	bitmap:port       Port
//
// Other fields must be zero. Comment needs a set created with Comments.
type Entry struct {
	IP       netip.Addr
	Protocol Protocol
	Port     uint16
	IP2      netip.Addr
	Net      netip.Prefix
	Comment  string
}

// Normalize unmaps addresses and masks Net, as reads return them. An
// invalid Net (e.g. a prefix length too long for its address, which netip
// keeps with the address) becomes the zero Prefix, so that equal entries
// compare equal.
func (e Entry) Normalize() Entry {
	e.IP = e.IP.Unmap()
	e.IP2 = e.IP2.Unmap()
	if e.Net.IsValid() {
		e.Net = netip.PrefixFrom(e.Net.Addr().Unmap(), e.Net.Bits()).Masked()
	} else {
		e.Net = netip.Prefix{}
	}
	return e
}

// Validate reports an entry that does not fit set s, wrapping ErrInvalid.
func (e Entry) Validate(s IPSet) error {
	e = e.Normalize()
	bad := func(why string) error {
		return fmt.Errorf("ipset %s (%s): entry %+v: %s: %w", s.Name, s.Type, e, why, ErrInvalid)
	}
	addrOK := func(a netip.Addr) bool { return CheckAddr(a) == nil && FamilyOf(a) == s.Family }
	var needIP, needPort, needIP2, needNet bool
	switch s.Type {
	case HashIP:
		needIP = true
	case HashIPPort:
		needIP, needPort = true, true
	case HashIPPortIP:
		needIP, needPort, needIP2 = true, true, true
	case HashIPPortNet:
		needIP, needPort, needNet = true, true, true
	case HashNet:
		needNet = true
	case BitmapPort:
		if e.IP.IsValid() || e.IP2.IsValid() || e.Net.IsValid() || e.Protocol != 0 {
			return bad("bitmap:port entries carry only a port")
		}
		if e.Port < s.PortFrom || e.Port > s.PortTo {
			return bad(fmt.Sprintf("port outside range %d-%d", s.PortFrom, s.PortTo))
		}
		return nil
	default:
		return bad("unsupported set type")
	}
	if needIP != e.IP.IsValid() || (needIP && !addrOK(e.IP)) {
		return bad("IP missing, unexpected or of the wrong family")
	}
	if needIP2 != e.IP2.IsValid() || (needIP2 && !addrOK(e.IP2)) {
		return bad("IP2 missing, unexpected or of the wrong family")
	}
	if needNet != e.Net.IsValid() || (needNet && (!addrOK(e.Net.Addr()) || e.Net.Bits() == 0)) {
		return bad("Net missing, unexpected, /0 or of the wrong family")
	}
	if needPort {
		if !e.Protocol.Valid() {
			return bad("protocol must be tcp, udp or sctp")
		}
	} else if e.Port != 0 || e.Protocol != 0 {
		return bad("type has no port")
	}
	if e.Comment != "" && !s.Comments {
		return bad("comment on a set created without comments")
	}
	if len(e.Comment) > 255 {
		return bad("comment longer than 255 bytes")
	}
	return nil
}

// Format renders e the way `ipset list` prints it for a set of type t,
// e.g. "198.18.0.1,tcp:80". Comments are not included.
func (e Entry) Format(t SetType) string {
	port := func() string { return e.Protocol.String() + ":" + strconv.Itoa(int(e.Port)) }
	switch t {
	case HashIP:
		return e.IP.String()
	case HashIPPort:
		return e.IP.String() + "," + port()
	case HashIPPortIP:
		return e.IP.String() + "," + port() + "," + e.IP2.String()
	case HashIPPortNet:
		return e.IP.String() + "," + port() + "," + e.Net.String()
	case HashNet:
		return e.Net.String()
	case BitmapPort:
		return strconv.Itoa(int(e.Port))
	}
	return fmt.Sprintf("%+v", e)
}

// IPSets manages the ipsets of one network namespace.
//
// Contract:
//   - CreateSet is idempotent like `ipset create -exist`: nil when a set
//     with the same name and SameAs parameters exists, ErrExist when one
//     with different parameters exists.
//   - ListEntries of a missing set: ErrNotFound.
//   - ApplyEntries performs a batch of entry adds and deletes in order and
//     returns one error per op (nil: done); a failed op does not stop the
//     ones after it. The Linux implementation sends many ops per netlink
//     round trip. Adds and deletes are idempotent like `ipset add/del
//     -exist`: adding a present entry or deleting an absent one is nil
//     (adding a present entry updates its comment). A missing set:
//     ErrNotFound. An op's Set must describe the set as it exists (its
//     type and family decide the encoding); at least Name, Type, Family
//     and, for bitmap:port, the range must match.
//   - Sets are never destroyed or flushed by the agent: the interface has
//     no such writes (the implementations' DestroySet and FlushSet serve
//     tests and the contract suite's clean-up).
//   - Reads return normalized values; ListSets sorted by name, ListEntries
//     in no particular order.
//   - EntryCounts is every set's number of entries by name, read from the
//     sets' headers without listing an entry (the drift probe's cheap
//     check); a set whose header has no count (a kernel before ~4.10)
//     is there with -1.
//   - Bad input (including addresses with an IPv6 zone, see CheckAddr):
//     ErrInvalid, the kernel is not called.
//   - Safe for concurrent use.
type IPSets interface {
	CreateSet(set IPSet) error
	ApplyEntries(ops []EntryOp) []error
	ListSets() ([]IPSet, error)
	ListEntries(name string) ([]Entry, error)
	EntryCounts() (map[string]int, error)
}

// EntryOpKind names the write an EntryOp performs.
type EntryOpKind uint8

const (
	AddEntry EntryOpKind = iota + 1
	DelEntry
)

func (k EntryOpKind) String() string {
	switch k {
	case AddEntry:
		return "add entry"
	case DelEntry:
		return "delete entry"
	}
	return fmt.Sprintf("ipset op %d", uint8(k))
}

// EntryOp is one write of an IPSets.ApplyEntries batch: Entry added to or
// deleted from Set (which describes the set as it exists). A batch may mix
// sets.
type EntryOp struct {
	Kind  EntryOpKind
	Set   IPSet
	Entry Entry
}

// Validate reports what ApplyEntries refuses as ErrInvalid without calling
// the kernel (DelEntry ignores the comment).
func (op EntryOp) Validate() error {
	switch op.Kind {
	case AddEntry:
		return op.Entry.Validate(op.Set)
	case DelEntry:
		e := op.Entry
		e.Comment = ""
		return e.Validate(op.Set)
	}
	return fmt.Errorf("ipset: %v: %w", op.Kind, ErrInvalid)
}
