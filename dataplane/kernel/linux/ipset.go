package linux

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// IPSets talks the ipset netlink protocol directly (message building with
// vishvananda/netlink/nl). netlink's own Ipset* helpers are not used: in
// v1.3.1 they send a protocol attribute bitmap:port rejects, pick revision 0
// for hash:net, treat a missing set as destroyed and log unknown attributes.
type IPSets struct {
	mu   sync.Mutex
	sock *nl.SocketHandle
	// batch carries ApplyEntries: many entry writes per syscall; reads
	// carries the listings (in-place dumps), so neither waits on or
	// breaks the other.
	batch, reads *nlBatch
	revs         map[string]uint8 // "type/family" -> highest revision the kernel offers
	// listed is how many entries each set held when last listed (sizes
	// the next listing).
	listed map[string]int
}

var _ kernel.IPSets = (*IPSets)(nil)

// NewIPSets opens a netfilter netlink socket in the caller's network
// namespace and checks the kernel speaks the ipset protocol.
func NewIPSets() (*IPSets, error) {
	s, err := openNetfilterSocket()
	if err != nil {
		return nil, fmt.Errorf("ipset: open netfilter netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
	if err := s.SetReceiveTimeout(&tv); err != nil {
		s.Close()
		return nil, fmt.Errorf("ipset: socket timeout: %w", err)
	}
	h := &IPSets{sock: &nl.SocketHandle{Socket: s}, revs: map[string]uint8{}, listed: map[string]int{}}
	if _, err := h.exec(newIpsetRequest(nl.IPSET_CMD_PROTOCOL, 0)); err != nil {
		s.Close()
		return nil, fmt.Errorf("ipset: kernel does not answer the ipset netlink protocol (is the ip_set module available?): %w", err)
	}
	if h.batch, err = newNLBatch(unix.NETLINK_NETFILTER); err != nil {
		s.Close()
		return nil, fmt.Errorf("ipset: %w", err)
	}
	if h.reads, err = newNLBatch(unix.NETLINK_NETFILTER); err != nil {
		s.Close()
		h.batch.close()
		h.reads.close()
		return nil, fmt.Errorf("ipset: %w", err)
	}
	return h, nil
}

// nfnetlinkLoadWait bounds how long NewIPSets waits for nfnetlink to finish
// loading. Opening the socket makes the kernel load the module; when another
// process's load of it is still running (agents of several nodes starting
// together, iptables-nft), the open can fail with EPROTONOSUPPORT before the
// protocol registers. Seen once in the VM test bed under load.
const nfnetlinkLoadWait = 5 * time.Second

func openNetfilterSocket() (*nl.NetlinkSocket, error) {
	deadline := time.Now().Add(nfnetlinkLoadWait)
	for delay := 20 * time.Millisecond; ; delay *= 2 {
		s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
		if err == nil || !errors.Is(err, unix.EPROTONOSUPPORT) || time.Now().After(deadline) {
			return s, err
		}
		time.Sleep(delay)
	}
}

// Close releases the netlink sockets.
func (h *IPSets) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sock.Close()
	h.batch.close()
}

// exec sends req on the shared socket and returns the reply payloads.
func (h *IPSets) exec(req *nl.NetlinkRequest) ([][]byte, error) {
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: h.sock}
	return req.Execute(unix.NETLINK_NETFILTER, 0)
}

// ipsetError wraps err with the sentinel its errno stands for.
func ipsetError(what string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", what, err)
	}
	var s error
	switch int(errno) {
	case int(unix.ENOENT):
		s = kernel.ErrNotFound
	case int(unix.EEXIST), nl.IPSET_ERR_EXIST:
		s = kernel.ErrExist
	case int(unix.EBUSY), nl.IPSET_ERR_BUSY, nl.IPSET_ERR_REFERENCED:
		s = kernel.ErrBusy
	case nl.IPSET_ERR_FIND_TYPE:
		s = kernel.ErrUnsupported
	case nl.IPSET_ERR_PROTOCOL, nl.IPSET_ERR_TYPE_MISMATCH, nl.IPSET_ERR_INVALID_CIDR,
		nl.IPSET_ERR_INVALID_NETMASK, nl.IPSET_ERR_INVALID_FAMILY, nl.IPSET_ERR_IPADDR_IPV4,
		nl.IPSET_ERR_IPADDR_IPV6, nl.IPSET_ERR_COMMENT:
		s = kernel.ErrInvalid
	}
	msg := errno.Error()
	if int(errno) >= nl.IPSET_ERR_PRIVATE {
		msg = nl.IPSetError(errno).Error()
		if int(errno) >= ipsetErrTypeSpecific {
			// e.g. "hash is full" or "element out of range", depending on the type.
			msg = fmt.Sprintf("set-type specific error %d", int(errno)-ipsetErrTypeSpecific)
		}
	}
	if s == nil {
		return fmt.Errorf("%s: %s", what, msg)
	}
	return fmt.Errorf("%s: %s: %w", what, msg, s)
}

// revision returns the newest revision of a set type the kernel has, like
// the ipset tool does (netlink's default of the oldest lacks features, e.g.
// comments on hash:net).
func (h *IPSets) revision(t kernel.SetType, f kernel.Family) (uint8, error) {
	key := string(t) + "/" + f.String()
	if r, ok := h.revs[key]; ok {
		return r, nil
	}
	req := newIpsetRequest(nl.IPSET_CMD_TYPE, 0)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(string(t))))
	fam := nfproto(f)
	if fam == nfprotoUnspec {
		fam = nfprotoIPv4
	}
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, nl.Uint8Attr(fam)))
	msgs, err := h.exec(req)
	if err != nil {
		return 0, ipsetError(fmt.Sprintf("ipset type %s", t), err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := parseAttrs(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Type == nl.IPSET_ATTR_REVISION {
				h.revs[key] = attrU8(a.Value)
				return h.revs[key], nil
			}
		}
	}
	return 0, fmt.Errorf("ipset type %s: kernel reply has no revision: %w", t, kernel.ErrUnsupported)
}

func (h *IPSets) CreateSet(s kernel.IPSet) error {
	if err := s.Validate(); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	rev, err := h.revision(s.Type, s.Family)
	if err != nil {
		return err
	}
	// NLM_F_EXCL: an existing set is reported, then compared below, so a
	// set of another family is not silently accepted as the kernel's
	// `create -exist` would.
	req := newIpsetRequest(nl.IPSET_CMD_CREATE, unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(s.Name)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(string(s.Type))))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_REVISION, nl.Uint8Attr(rev)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, nl.Uint8Attr(nfproto(s.Family))))
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|attrNested, nil)
	if s.Type == kernel.BitmapPort {
		data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT_FROM|attrNetOrder, be16(s.PortFrom)))
		data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT_TO|attrNetOrder, be16(s.PortTo)))
	} else {
		if s.HashSize != 0 {
			data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_HASHSIZE|attrNetOrder, be32(s.HashSize)))
		}
		if s.MaxElem != 0 {
			data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_MAXELEM|attrNetOrder, be32(s.MaxElem)))
		}
	}
	if s.Comments {
		data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_CADT_FLAGS|attrNetOrder, be32(nl.IPSET_FLAG_WITH_COMMENT)))
	}
	req.AddData(data)
	_, err = h.exec(req)
	if err == nil {
		return nil
	}
	err = ipsetError("create ipset "+s.Name, err)
	if !errors.Is(err, kernel.ErrExist) {
		return err
	}
	sets, lerr := h.list(s.Name, true, nil)
	if lerr != nil {
		return fmt.Errorf("%w (and reading it back: %v)", err, lerr)
	}
	if len(sets) == 1 && sets[0].set.SameAs(s) {
		return nil
	}
	return err
}

func (h *IPSets) nameOnly(cmd int, what, name string) error {
	if name == "" || len(name) > kernel.MaxSetNameLen {
		return fmt.Errorf("ipset name %q must be 1..%d bytes: %w", name, kernel.MaxSetNameLen, kernel.ErrInvalid)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// NLM_F_EXCL makes a missing set an error (without it destroy is -exist).
	req := newIpsetRequest(cmd, unix.NLM_F_ACK|unix.NLM_F_EXCL)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	if _, err := h.exec(req); err != nil {
		return ipsetError(what+" ipset "+name, err)
	}
	return nil
}

// DestroySet destroys a set: for tests and the contract suite's clean-up
// (see contract.SetCleaner); the agent never destroys a set.
func (h *IPSets) DestroySet(name string) error {
	return h.nameOnly(nl.IPSET_CMD_DESTROY, "destroy", name)
}

// FlushSet deletes every entry of a set, like DestroySet for tests only.
func (h *IPSets) FlushSet(name string) error {
	return h.nameOnly(nl.IPSET_CMD_FLUSH, "flush", name)
}

// adtOp is the command and wording of an entry write.
func adtOp(k kernel.EntryOpKind) (cmd int, what string) {
	if k == kernel.DelEntry {
		return nl.IPSET_CMD_DEL, "delete"
	}
	return nl.IPSET_CMD_ADD, "add"
}

func adtWhat(what string, set kernel.IPSet, e kernel.Entry) string {
	return fmt.Sprintf("%s %s in ipset %s", what, e.Format(set.Type), set.Name)
}

// adtEntry is the entry op sends: normalized, without comment for a delete.
func adtEntry(op kernel.EntryOp) kernel.Entry {
	e := op.Entry.Normalize()
	if op.Kind == kernel.DelEntry {
		e.Comment = ""
	}
	return e
}

// ApplyEntries sends ops in batches of many netlink requests per syscall
// (see kernel.IPSets.ApplyEntries and nlBatch).
func (h *IPSets) ApplyEntries(ops []kernel.EntryOp) []error {
	errs := make([]error, len(ops))
	valid := validOps(ops, kernel.EntryOp.Validate, errs)
	if len(valid) == 0 {
		return errs
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	res := h.batch.do(len(valid), func(j int) nlPayload {
		op := ops[valid[j]]
		cmd, _ := adtOp(op.Kind)
		return func(buf []byte) ([]byte, uint16, uint16) {
			return appendADT(buf, cmd, op.Set, adtEntry(op)), uint16(cmd | unix.NFNL_SUBSYS_IPSET<<8), 0
		}
	})
	for j, i := range valid {
		op := ops[i]
		_, what := adtOp(op.Kind)
		switch {
		case res[j].lost != nil:
			errs[i] = fmt.Errorf("ipset: %s: %w: %w", adtWhat(what, op.Set, adtEntry(op)), errBatchLost, res[j].lost)
		case res[j].errno != 0:
			errs[i] = ipsetError(adtWhat(what, op.Set, adtEntry(op)), res[j].errno)
		}
	}
	return errs
}

type listedSet struct {
	setHeader
}

// list dumps one set (name != "") or all sets, headers only or with
// entries, with an in-place dump on the batch socket (nldump.go): the
// netlink library copied every reply and the entries were sliced out of
// the copies (35 MB allocated per two full passes at 10k Services). Reply
// messages of one set are merged (large sets span many); entry, when
// entries are listed, receives each entry's raw attributes, valid only
// during the call, after its set's header.
func (h *IPSets) list(name string, headerOnly bool, entry func(ls *listedSet, raw []byte) error) ([]*listedSet, error) {
	var out []*listedSet
	err := h.reads.dump(func(buf []byte) ([]byte, uint16, uint16) {
		buf = append(buf, unix.AF_INET, nl.NFNETLINK_V0, 0, 0) // nfgenmsg: family, version, res_id
		buf = nlaU8(buf, nl.IPSET_ATTR_PROTOCOL, ipsetProtocol)
		if name != "" {
			buf = nlaString(buf, nl.IPSET_ATTR_SETNAME, name)
		}
		if headerOnly {
			buf = nlaBytes(buf, uint16(nl.IPSET_ATTR_FLAGS|attrNetOrder), be32(ipsetFlagListHeader))
		}
		return buf, nl.IPSET_CMD_LIST | unix.NFNL_SUBSYS_IPSET<<8, unix.NLM_F_DUMP
	}, func(msg []byte) error {
		n, hdr, entries, err := decodeListMessage(msg)
		if err != nil {
			return err
		}
		var ls *listedSet
		if len(out) > 0 && out[len(out)-1].set.Name == n {
			ls = out[len(out)-1] // a set's messages come together
		} else {
			ls = &listedSet{}
			ls.set.Name = n
			out = append(out, ls)
		}
		if hdr != nil {
			ls.setHeader = *hdr
		}
		if entry == nil {
			return nil
		}
		for _, raw := range entries {
			if err := entry(ls, raw); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		what := "list ipsets"
		if name != "" {
			what = "list ipset " + name
		}
		return nil, ipsetError(what, err)
	}
	return out, nil
}

func (h *IPSets) ListSets() ([]kernel.IPSet, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sets, err := h.list("", true, nil)
	if err != nil {
		return nil, err
	}
	out := make([]kernel.IPSet, 0, len(sets))
	for _, s := range sets {
		out = append(out, s.set.Normalize())
	}
	slices.SortFunc(out, func(a, b kernel.IPSet) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

func (h *IPSets) EntryCounts() (map[string]int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sets, err := h.list("", true, nil)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(sets))
	for _, s := range sets {
		out[s.set.Name] = s.elements
	}
	return out, nil
}

func (h *IPSets) ListEntries(name string) ([]kernel.Entry, error) {
	if name == "" || len(name) > kernel.MaxSetNameLen {
		return nil, fmt.Errorf("ipset name %q must be 1..%d bytes: %w", name, kernel.MaxSetNameLen, kernel.ErrInvalid)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]kernel.Entry, 0, h.listed[name])
	sets, err := h.list(name, false, func(ls *listedSet, raw []byte) error {
		e, err := decodeEntry(ls.set.Type, raw)
		if err != nil {
			return fmt.Errorf("list ipset %s: %w", name, err)
		}
		out = append(out, e.Normalize())
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(sets) != 1 {
		return nil, fmt.Errorf("list ipset %s: kernel returned %d sets", name, len(sets))
	}
	h.listed[name] = len(out)
	return out, nil
}
