package linux

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vsplane/vsplane/dataplane/kernel"
)

// IPVS generic-netlink wire constants (include/uapi/linux/ip_vs.h) for the
// batched write path; moby/ipvs keeps its own copies unexported.
const (
	ipvsGenlName    = "IPVS"
	ipvsGenlVersion = 1

	ipvsCmdNewService = 1
	ipvsCmdSetService = 2
	ipvsCmdDelService = 3
	ipvsCmdNewDest    = 5
	ipvsCmdSetDest    = 6
	ipvsCmdDelDest    = 7

	ipvsCmdAttrService = 1
	ipvsCmdAttrDest    = 2

	ipvsSvcAttrAF        = 1
	ipvsSvcAttrProtocol  = 2
	ipvsSvcAttrAddr      = 3
	ipvsSvcAttrPort      = 4
	ipvsSvcAttrFWMark    = 5
	ipvsSvcAttrSchedName = 6
	ipvsSvcAttrFlags     = 7
	ipvsSvcAttrTimeout   = 8
	ipvsSvcAttrNetmask   = 9

	ipvsDestAttrAddr      = 1
	ipvsDestAttrPort      = 2
	ipvsDestAttrFwdMethod = 3
	ipvsDestAttrWeight    = 4
	ipvsDestAttrUThresh   = 5
	ipvsDestAttrLThresh   = 6
)

// ipvsBatcher writes IPVS objects over its own generic-netlink socket,
// many requests per syscall (nlBatch), and lists the virtual servers over
// another (reads: ipvs_list.go). It is used under IPVS.mu.
type ipvsBatcher struct {
	sock, reads *nlBatch
	family      uint16
}

// newIPVSBatcher opens the socket in the caller's network namespace (like
// moby's handle, it stays bound to it).
func newIPVSBatcher() (*ipvsBatcher, error) {
	fam, err := netlink.GenlFamilyGet(ipvsGenlName)
	if err != nil {
		return nil, fmt.Errorf("ipvs: resolve generic netlink family %q: %w", ipvsGenlName, err)
	}
	b, err := newNLBatch(unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	r, err := newNLBatch(unix.NETLINK_GENERIC)
	if err != nil {
		b.close()
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	return &ipvsBatcher{sock: b, reads: r, family: fam.ID}, nil
}

func (b *ipvsBatcher) close() {
	b.sock.close()
	b.reads.close()
}

// message appends the generic-netlink request for op to buf.
func (b *ipvsBatcher) message(op kernel.IPVSOp, buf []byte) ([]byte, uint16, uint16) {
	var cmd uint8
	switch op.Kind {
	case kernel.AddVirtualServer:
		cmd = ipvsCmdNewService
	case kernel.UpdateVirtualServer:
		cmd = ipvsCmdSetService
	case kernel.DeleteVirtualServer:
		cmd = ipvsCmdDelService
	case kernel.AddDestination:
		cmd = ipvsCmdNewDest
	case kernel.UpdateDestination:
		cmd = ipvsCmdSetDest
	case kernel.DeleteDestination:
		cmd = ipvsCmdDelDest
	}
	buf = append(buf, cmd, ipvsGenlVersion, 0, 0) // genlmsghdr
	switch op.Kind {
	case kernel.AddVirtualServer, kernel.UpdateVirtualServer:
		buf = appendServiceAttr(buf, op.Server, true)
	case kernel.DeleteVirtualServer:
		buf = appendServiceAttr(buf, kernel.VirtualServer{Key: op.Server.Key}, false)
	case kernel.AddDestination, kernel.UpdateDestination, kernel.DeleteDestination:
		buf = appendServiceAttr(buf, kernel.VirtualServer{Key: op.Server.Key}, false)
		buf = appendDestAttr(buf, op.Destination, op.Kind != kernel.DeleteDestination)
	}
	return buf, b.family, 0
}

// appendServiceAttr appends IPVS_CMD_ATTR_SERVICE: the key, plus
// scheduler, flags, timeout and netmask when full (add and update).
func appendServiceAttr(b []byte, vs kernel.VirtualServer, full bool) []byte {
	vs = vs.Normalize()
	k := vs.Key
	b, nest := nlaNest(b, ipvsCmdAttrService)
	b = nlaU16(b, ipvsSvcAttrAF, afOf(k.Family))
	if k.FWMark != 0 {
		b = nlaU32(b, ipvsSvcAttrFWMark, k.FWMark)
	} else {
		b = nlaU16(b, ipvsSvcAttrProtocol, uint16(k.Protocol))
		b = nlaAddr(b, ipvsSvcAttrAddr, k.Address)
		b = nlaBE16(b, ipvsSvcAttrPort, k.Port)
	}
	if full {
		b = nlaString(b, ipvsSvcAttrSchedName, vs.Scheduler)
		var flags [8]byte
		binary.NativeEndian.PutUint32(flags[0:], uint32(vs.Flags))
		binary.NativeEndian.PutUint32(flags[4:], 0xffffffff) // mask: set every flag as given
		b = nlaBytes(b, ipvsSvcAttrFlags, flags[:])
		b = nlaU32(b, ipvsSvcAttrTimeout, vs.Timeout)
		b = nlaU32(b, ipvsSvcAttrNetmask, netmaskToKernel(k.Family, vs.Netmask))
	}
	return nlaEnd(b, nest)
}

// appendDestAttr appends IPVS_CMD_ATTR_DEST: address and port, plus
// forwarding method, weight and (zero) thresholds when full (add and
// update).
func appendDestAttr(b []byte, d kernel.Destination, full bool) []byte {
	b, nest := nlaNest(b, ipvsCmdAttrDest)
	b = nlaAddr(b, ipvsDestAttrAddr, d.Address.Unmap())
	b = nlaBE16(b, ipvsDestAttrPort, d.Port)
	if full {
		b = nlaU32(b, ipvsDestAttrFwdMethod, uint32(d.Forward))
		b = nlaU32(b, ipvsDestAttrWeight, uint32(d.Weight))
		b = nlaU32(b, ipvsDestAttrUThresh, 0)
		b = nlaU32(b, ipvsDestAttrLThresh, 0)
	}
	return nlaEnd(b, nest)
}

// apply runs ops in batches and returns one error per op, errnos mapped to
// sentinels by ipvsError.
func (b *ipvsBatcher) apply(ops []kernel.IPVSOp) []error {
	errs := make([]error, len(ops))
	valid := validOps(ops, validateOp, errs)
	res := b.sock.do(len(valid), func(j int) nlPayload {
		return func(buf []byte) ([]byte, uint16, uint16) { return b.message(ops[valid[j]], buf) }
	})
	for j, i := range valid {
		switch {
		case res[j].lost != nil:
			errs[i] = fmt.Errorf("%s: %w: %w", describeOp(ops[i]), errBatchLost, res[j].lost)
		case res[j].errno != 0:
			errs[i] = ipvsError(describeOp(ops[i]), res[j].errno, enoentMeaning(ops[i].Kind))
		}
	}
	return errs
}

func validateOp(op kernel.IPVSOp) error {
	switch op.Kind {
	case kernel.AddVirtualServer, kernel.UpdateVirtualServer:
		return op.Server.Validate()
	case kernel.DeleteVirtualServer:
		return op.Server.Key.Validate()
	case kernel.AddDestination, kernel.UpdateDestination, kernel.DeleteDestination:
		if err := op.Server.Key.Validate(); err != nil {
			return err
		}
		d := op.Destination
		if op.Kind == kernel.DeleteDestination {
			d = kernel.Destination{Address: d.Address, Port: d.Port}
		}
		return d.Validate(op.Server.Key.Normalize().Family)
	}
	return fmt.Errorf("ipvs: %v: %w", op.Kind, kernel.ErrInvalid)
}

// enoentMeaning: ENOENT on a server add/update names an unknown scheduler.
func enoentMeaning(k kernel.IPVSOpKind) error {
	if k == kernel.AddVirtualServer || k == kernel.UpdateVirtualServer {
		return kernel.ErrUnsupported
	}
	return kernel.ErrNotFound
}

// describeOp words an op for its error.
func describeOp(op kernel.IPVSOp) string {
	switch op.Kind {
	case kernel.AddVirtualServer, kernel.UpdateVirtualServer:
		return fmt.Sprintf("ipvs: %v %v (scheduler %s)", op.Kind, op.Server.Key, op.Server.Scheduler)
	case kernel.DeleteVirtualServer:
		return fmt.Sprintf("ipvs: %v %v", op.Kind, op.Server.Key)
	}
	return fmt.Sprintf("ipvs: %v %v of %v", op.Kind, op.Destination.Key(), op.Server.Key)
}
