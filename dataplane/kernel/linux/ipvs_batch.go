package linux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"

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

// Batch limits. A batch is one sendmsg: the kernel handles its messages in
// order and answers only failures plus the last message (the only one
// asking for an ACK), so a batch costs two syscalls however many writes it
// holds. maxBatchOps bounds the error replies that can pile up in the
// receive buffer (each ~1 KiB of buffer accounting) when every op fails;
// maxBatchBytes stays well under the default socket send buffer (208 KiB).
const (
	maxBatchOps   = 512
	maxBatchBytes = 96 << 10
	batchRecvBuf  = 2 << 20
	batchTimeout  = 30 * time.Second
)

// ipvsBatcher writes IPVS objects over its own generic-netlink socket,
// many requests per syscall. It is used under IPVS.mu.
type ipvsBatcher struct {
	fd     int
	family uint16
	seq    uint32
	buf    []byte
	recv   []byte
}

// newIPVSBatcher opens the socket in the caller's network namespace (like
// moby's handle, it stays bound to it).
func newIPVSBatcher() (*ipvsBatcher, error) {
	fam, err := netlink.GenlFamilyGet(ipvsGenlName)
	if err != nil {
		return nil, fmt.Errorf("ipvs: resolve generic netlink family %q: %w", ipvsGenlName, err)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("ipvs: open netlink socket: %w", err)
	}
	b := &ipvsBatcher{fd: fd, family: fam.ID, recv: make([]byte, 64<<10)}
	setup := func() error {
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		// Error replies without a copy of the request: smaller, so more fit.
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1); err != nil {
			return fmt.Errorf("NETLINK_CAP_ACK: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, batchRecvBuf); err != nil {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, batchRecvBuf); err != nil {
				return fmt.Errorf("SO_RCVBUF: %w", err)
			}
		}
		tv := unix.NsecToTimeval(batchTimeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("SO_RCVTIMEO: %w", err)
		}
		return nil
	}
	if err := setup(); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ipvs: netlink socket: %w", err)
	}
	return b, nil
}

func (b *ipvsBatcher) close() { unix.Close(b.fd) }

// message appends one request for op to b.buf and returns its offset.
func (b *ipvsBatcher) message(op kernel.IPVSOp, seq uint32) int {
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
	start := len(b.buf)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // length, set below
	b.buf = binary.NativeEndian.AppendUint16(b.buf, b.family)
	b.buf = binary.NativeEndian.AppendUint16(b.buf, unix.NLM_F_REQUEST)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, seq)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, 0) // port id: the kernel
	b.buf = append(b.buf, cmd, ipvsGenlVersion, 0, 0)
	for _, a := range attrs {
		b.buf = append(b.buf, a.Serialize()...)
	}
	binary.NativeEndian.PutUint32(b.buf[start:], uint32(len(b.buf)-start))
	return start
}

// askAck sets NLM_F_ACK on the message at offset start.
func (b *ipvsBatcher) askAck(start int) {
	const flagsAt = 6 // nlmsghdr: len u32, type u16, flags u16
	f := binary.NativeEndian.Uint16(b.buf[start+flagsAt:])
	binary.NativeEndian.PutUint16(b.buf[start+flagsAt:], f|unix.NLM_F_ACK)
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

// errBatchLost marks ops whose outcome a broken exchange left unknown.
var errBatchLost = errors.New("ipvs: netlink batch exchange failed; outcome unknown")

// send writes the ops in b.buf (sequence numbers first..first+n-1) and
// returns the errno per op (0: done). An exchange failure returns err and
// leaves the outcome of every op unknown.
func (b *ipvsBatcher) send(first uint32, n int) ([]syscall.Errno, error) {
	if err := unix.Sendto(b.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sendto: %w", err)
	}
	errnos := make([]syscall.Errno, n)
	last := first + uint32(n) - 1
	for {
		m, _, err := unix.Recvfrom(b.fd, b.recv, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			// ENOBUFS (replies dropped), EAGAIN (SO_RCVTIMEO): replies are
			// lost, so is the knowledge of which ops failed.
			return nil, fmt.Errorf("recvfrom: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(b.recv[:m])
		if err != nil {
			return nil, fmt.Errorf("parse reply: %w", err)
		}
		for _, msg := range msgs {
			seq := msg.Header.Seq
			if msg.Header.Type != unix.NLMSG_ERROR || seq < first || seq > last {
				continue // not ours (a reply to an earlier, abandoned exchange)
			}
			if len(msg.Data) < 4 {
				return nil, fmt.Errorf("short error reply for sequence %d", seq)
			}
			if code := int32(binary.NativeEndian.Uint32(msg.Data[:4])); code < 0 {
				errnos[seq-first] = syscall.Errno(-code)
			}
			if seq == last {
				// The kernel answers in order: every failure before the
				// last message has been read.
				return errnos, nil
			}
		}
	}
}

// apply runs ops in batches and returns one error per op, mapped like the
// single calls map them.
func (b *ipvsBatcher) apply(ops []kernel.IPVSOp) []error {
	errs := make([]error, len(ops))
	// Validate first: bad input never reaches the kernel (contract).
	valid := make([]int, 0, len(ops))
	for i, op := range ops {
		if err := validateOp(op); err != nil {
			errs[i] = err
			continue
		}
		valid = append(valid, i)
	}
	for len(valid) > 0 {
		if b.seq > math.MaxUint32-maxBatchOps {
			b.seq = 0 // keep first..last increasing within a batch
		}
		b.buf = b.buf[:0]
		n, lastAt := 0, 0
		first := b.seq + 1
		for n < len(valid) && n < maxBatchOps && len(b.buf) < maxBatchBytes {
			b.seq++
			lastAt = b.message(ops[valid[n]], b.seq)
			n++
		}
		// Only the last message asks for an ACK: failures are answered
		// anyway, so the reply to the last one closes the batch.
		b.askAck(lastAt)
		errnos, err := b.send(first, n)
		for j := 0; j < n; j++ {
			i := valid[j]
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("%s: %w: %w", describeOp(ops[i]), errBatchLost, err)
			case errnos[j] != 0:
				errs[i] = ipvsError(describeOp(ops[i]), errnos[j], enoentMeaning(ops[i].Kind))
			}
		}
		valid = valid[n:]
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
