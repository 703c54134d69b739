package linux

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Netlink dumps read in place. A library read of a large table (moby's
// GetServices: 20k virtual servers at 10k Services) allocated a message
// slice, an attribute slice and a struct per object and made the full
// pass's read the agent's memory peak (vmbench heap profile: 56 MB per
// pass at 10k). dump hands each reply's bytes, still in the receive
// buffer, to a callback; walkAttrs walks attributes without a slice.

// dump sends one request (payload's flags must include NLM_F_DUMP) and
// calls each with the payload of every reply message, after its netlink
// header, until the kernel's NLMSG_DONE. The bytes alias the receive
// buffer: each copies what it keeps. After an error from each, the rest of
// the dump is read and dropped before the error is returned: the kernel
// refuses (EBUSY) a socket's next dump while one is unfinished. A dump the
// kernel marks inconsistent (a concurrent change, NLM_F_DUMP_INTR) returns
// nl.ErrDumpInterrupted once read whole, as the netlink library does;
// retryDump repeats it.
func (b *nlBatch) dump(payload nlPayload, each func(msg []byte) error) error {
	if b.seq == math.MaxUint32 {
		b.seq = 0
	}
	b.seq++
	seq := b.seq
	b.buf = b.buf[:0]
	b.message(seq, payload)
	b.sends++
	if err := unix.Sendto(b.fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sendto: %w", err)
	}
	var failed error // from each: drain, then return it
	interrupted := false
	for {
		// MSG_TRUNC: netlink returns a datagram's real length, so a reply
		// larger than the buffer is an error, not a silently short dump.
		n, _, err := unix.Recvfrom(b.fd, b.recv, unix.MSG_TRUNC)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("recvfrom: %w", err)
		}
		if n > len(b.recv) {
			return fmt.Errorf("reply of %d bytes exceeds the %d-byte receive buffer", n, len(b.recv))
		}
		for data := b.recv[:n]; len(data) > 0; {
			if len(data) < unix.NLMSG_HDRLEN {
				return fmt.Errorf("short netlink message (%d bytes)", len(data))
			}
			l := int(binary.NativeEndian.Uint32(data[0:4]))
			typ := binary.NativeEndian.Uint16(data[4:6])
			flags := binary.NativeEndian.Uint16(data[6:8])
			mseq := binary.NativeEndian.Uint32(data[8:12])
			if l < unix.NLMSG_HDRLEN || l > len(data) {
				return fmt.Errorf("netlink message of bad length %d (%d bytes left)", l, len(data))
			}
			msg := data[unix.NLMSG_HDRLEN:l]
			data = data[min(nlmsgAlign(l), len(data)):]
			if mseq != seq {
				continue // a reply to an earlier, abandoned exchange
			}
			if flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch typ {
			case unix.NLMSG_DONE:
				if failed == nil && interrupted {
					return nl.ErrDumpInterrupted
				}
				return failed
			case unix.NLMSG_ERROR:
				if len(msg) < 4 {
					return fmt.Errorf("short error reply")
				}
				if code := int32(binary.NativeEndian.Uint32(msg[:4])); code < 0 {
					return cmp.Or(failed, error(syscall.Errno(-code)))
				}
			default:
				if failed == nil {
					failed = each(msg)
				}
			}
		}
	}
}

func nlmsgAlign(l int) int { return (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// walkAttrs calls fn with the type (flag bits cleared) and value of each
// attribute in b, in order; a malformed length is an error.
func walkAttrs(b []byte, fn func(typ uint16, v []byte) error) error {
	for len(b) > 0 {
		if len(b) < unix.NLA_HDRLEN {
			return fmt.Errorf("netlink attribute: %d trailing bytes", len(b))
		}
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.NLA_HDRLEN || l > len(b) {
			return fmt.Errorf("netlink attribute %d has bad length %d (%d bytes left)", typ, l, len(b))
		}
		if err := fn(typ, b[unix.NLA_HDRLEN:l]); err != nil {
			return err
		}
		b = b[min((l+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1), len(b)):]
	}
	return nil
}
