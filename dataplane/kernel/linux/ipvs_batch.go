package linux

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
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
// many requests per syscall (nlBatch). It is used under IPVS.mu.
type ipvsBatcher struct {
	sock   *nlBatch
	family uint16
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
	return &ipvsBatcher{sock: b, family: fam.ID}, nil
}

func (b *ipvsBatcher) close() { b.sock.close() }

// message is the generic-netlink request for op: type and payload.
func (b *ipvsBatcher) message(op kernel.IPVSOp) (uint16, []byte) {
	var cmd uint8
	var attrs []*nl.RtAttr
	switch op.Kind {
	case kernel.AddVirtualServer, kernel.UpdateVirtualServer:
		cmd = ipvsCmdNewService
		if op.Kind == kernel.UpdateVirtualServer {
			cmd = ipvsCmdSetService
		}
		attrs = append(attrs, serviceAttr(op.Server, true))
	case kernel.DeleteVirtualServer:
		cmd = ipvsCmdDelService
		attrs = append(attrs, serviceAttr(kernel.VirtualServer{Key: op.Server.Key}, false))
	case kernel.AddDestination, kernel.UpdateDestination, kernel.DeleteDestination:
		cmd = map[kernel.IPVSOpKind]uint8{kernel.AddDestination: ipvsCmdNewDest,
			kernel.UpdateDestination: ipvsCmdSetDest, kernel.DeleteDestination: ipvsCmdDelDest}[op.Kind]
		attrs = append(attrs, serviceAttr(kernel.VirtualServer{Key: op.Server.Key}, false),
			destAttr(op.Destination, op.Kind != kernel.DeleteDestination))
	}
	payload := []byte{cmd, ipvsGenlVersion, 0, 0} // genlmsghdr
	for _, a := range attrs {
		payload = append(payload, a.Serialize()...)
	}
	return b.family, payload
}

// serviceAttr is IPVS_CMD_ATTR_SERVICE: the key, plus scheduler, flags,
// timeout and netmask when full (add and update).
func serviceAttr(vs kernel.VirtualServer, full bool) *nl.RtAttr {
	vs = vs.Normalize()
	k := vs.Key
	a := nl.NewRtAttr(ipvsCmdAttrService, nil)
	a.AddRtAttr(ipvsSvcAttrAF, nl.Uint16Attr(afOf(k.Family)))
	if k.FWMark != 0 {
		a.AddRtAttr(ipvsSvcAttrFWMark, nl.Uint32Attr(k.FWMark))
	} else {
		a.AddRtAttr(ipvsSvcAttrProtocol, nl.Uint16Attr(uint16(k.Protocol)))
		a.AddRtAttr(ipvsSvcAttrAddr, k.Address.AsSlice())
		a.AddRtAttr(ipvsSvcAttrPort, be16(k.Port))
	}
	if full {
		a.AddRtAttr(ipvsSvcAttrSchedName, nl.ZeroTerminated(vs.Scheduler))
		flags := binary.NativeEndian.AppendUint32(nil, uint32(vs.Flags))
		flags = binary.NativeEndian.AppendUint32(flags, 0xffffffff) // mask: set every flag as given
		a.AddRtAttr(ipvsSvcAttrFlags, flags)
		a.AddRtAttr(ipvsSvcAttrTimeout, nl.Uint32Attr(vs.Timeout))
		a.AddRtAttr(ipvsSvcAttrNetmask, nl.Uint32Attr(netmaskToKernel(k.Family, vs.Netmask)))
	}
	return a
}

// destAttr is IPVS_CMD_ATTR_DEST: address and port, plus forwarding
// method, weight and (zero) thresholds when full (add and update).
func destAttr(d kernel.Destination, full bool) *nl.RtAttr {
	a := nl.NewRtAttr(ipvsCmdAttrDest, nil)
	a.AddRtAttr(ipvsDestAttrAddr, d.Address.Unmap().AsSlice())
	a.AddRtAttr(ipvsDestAttrPort, be16(d.Port))
	if full {
		a.AddRtAttr(ipvsDestAttrFwdMethod, nl.Uint32Attr(uint32(d.Forward)))
		a.AddRtAttr(ipvsDestAttrWeight, nl.Uint32Attr(uint32(d.Weight)))
		a.AddRtAttr(ipvsDestAttrUThresh, nl.Uint32Attr(0))
		a.AddRtAttr(ipvsDestAttrLThresh, nl.Uint32Attr(0))
	}
	return a
}

// apply runs ops in batches and returns one error per op, mapped like the
// single calls map them.
func (b *ipvsBatcher) apply(ops []kernel.IPVSOp) []error {
	errs := make([]error, len(ops))
	valid := validOps(ops, validateOp, errs)
	res := b.sock.do(len(valid), func(j int) (uint16, []byte) { return b.message(ops[valid[j]]) })
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

// describeOp words an op like the single calls' errors.
func describeOp(op kernel.IPVSOp) string {
	switch op.Kind {
	case kernel.AddVirtualServer, kernel.UpdateVirtualServer:
		return fmt.Sprintf("ipvs: %v %v (scheduler %s)", op.Kind, op.Server.Key, op.Server.Scheduler)
	case kernel.DeleteVirtualServer:
		return fmt.Sprintf("ipvs: %v %v", op.Kind, op.Server.Key)
	}
	return fmt.Sprintf("ipvs: %v %v of %v", op.Kind, op.Destination.Key(), op.Server.Key)
}
