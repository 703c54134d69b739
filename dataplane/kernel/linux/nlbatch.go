package linux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Batch limits. A batch is one sendmsg: the kernel handles its messages in
// order and answers only failures plus the last message (the only one
// asking for an ACK), so a batch costs two syscalls however many writes it
// holds. This holds for every netlink family that handles a request buffer
// with netlink_rcv_skb: generic netlink (IPVS), nfnetlink outside its
// transaction batches (ipset), rtnetlink (addresses). maxBatchOps bounds
// the error replies that can pile up in the receive buffer (each ~1 KiB of
// buffer accounting) when every op fails; maxBatchBytes stays well under
// the default socket send buffer (208 KiB).
const (
	maxBatchOps   = 512
	maxBatchBytes = 96 << 10
	batchRecvBuf  = 2 << 20
	batchTimeout  = 30 * time.Second
)

// errBatchLost marks ops whose outcome a broken exchange left unknown.
var errBatchLost = errors.New("netlink batch exchange failed; outcome unknown")

// nlBatch sends many netlink requests per syscall on its own socket of one
// netlink protocol and maps the answers back to the requests by sequence
// number. It is not safe for concurrent use: its owner serializes calls
// (IPVS.mu, IPSets.mu, Links.mu).
type nlBatch struct {
	fd   int
	seq  uint32
	buf  []byte
	recv []byte
	// sends counts sendmsg calls (tests).
	sends int
}

// nlResult is the kernel's answer to one request of a batch: errno 0 is
// done; lost non-nil means the exchange of its batch failed and the
// outcome is unknown.
type nlResult struct {
	errno syscall.Errno
	lost  error
}

// newNLBatch opens a netlink socket of protocol proto in the caller's
// network namespace (it stays bound to it, like every netlink handle).
func newNLBatch(proto int) (*nlBatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("open netlink socket: %w", err)
	}
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
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	return &nlBatch{fd: fd, recv: make([]byte, 64<<10)}, nil
}

func (b *nlBatch) close() { unix.Close(b.fd) }

// nlPayload appends one request's payload (what follows its netlink
// header) to buf and returns the grown buf, the message type and the
// request flags beside NLM_F_REQUEST (NLM_F_ACK is the batch's).
type nlPayload func(buf []byte) (out []byte, typ, flags uint16)

// do sends n requests, msg(j) writing the j-th, in as few batches as the
// limits allow, and returns the answer to each.
func (b *nlBatch) do(n int, msg func(j int) nlPayload) []nlResult {
	res := make([]nlResult, n)
	for done := 0; done < n; {
		if b.seq > math.MaxUint32-maxBatchOps {
			b.seq = 0 // keep first..last increasing within a batch
		}
		b.buf = b.buf[:0]
		first := b.seq + 1
		k, lastAt := 0, 0
		for done+k < n && k < maxBatchOps && len(b.buf) < maxBatchBytes {
			b.seq++
			lastAt = b.message(b.seq, msg(done+k))
			k++
		}
		// Only the last message asks for an ACK: failures are answered
		// anyway, so the reply to the last one closes the batch.
		b.askAck(lastAt)
		errnos, err := b.send(first, k)
		for j := range k {
			if err != nil {
				res[done+j].lost = err
			} else {
				res[done+j].errno = errnos[j]
			}
		}
		done += k
	}
	return res
}

// message appends one request to b.buf, its payload written by payload
// after the header, 4-byte aligned, and returns its offset.
func (b *nlBatch) message(seq uint32, payload nlPayload) int {
	start := len(b.buf)
	b.buf = append(b.buf, make([]byte, unix.NLMSG_HDRLEN)...)
	buf, typ, flags := payload(b.buf)
	b.buf = buf
	hdr := b.buf[start:]
	binary.NativeEndian.PutUint32(hdr[0:], uint32(len(b.buf)-start))
	binary.NativeEndian.PutUint16(hdr[4:], typ)
	binary.NativeEndian.PutUint16(hdr[6:], unix.NLM_F_REQUEST|flags)
	binary.NativeEndian.PutUint32(hdr[8:], seq)
	binary.NativeEndian.PutUint32(hdr[12:], 0) // port id: the kernel
	for len(b.buf)%unix.NLMSG_ALIGNTO != 0 {
		b.buf = append(b.buf, 0)
	}
	return start
}

// askAck sets NLM_F_ACK on the message at offset start.
func (b *nlBatch) askAck(start int) {
	const flagsAt = 6 // nlmsghdr: len u32, type u16, flags u16
	f := binary.NativeEndian.Uint16(b.buf[start+flagsAt:])
	binary.NativeEndian.PutUint16(b.buf[start+flagsAt:], f|unix.NLM_F_ACK)
}

// send writes the requests in b.buf (sequence numbers first..first+n-1)
// and returns the errno per request (0: done). An exchange failure returns
// err and leaves the outcome of every request unknown.
func (b *nlBatch) send(first uint32, n int) ([]syscall.Errno, error) {
	b.sends++
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
			// lost, so is the knowledge of which requests failed.
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

// validOps returns the indexes of the ops validate accepts and records the
// others' errors in errs: bad input never reaches the kernel (contract).
func validOps[T any](ops []T, validate func(T) error, errs []error) []int {
	valid := make([]int, 0, len(ops))
	for i, op := range ops {
		if err := validate(op); err != nil {
			errs[i] = err
			continue
		}
		valid = append(valid, i)
	}
	return valid
}
