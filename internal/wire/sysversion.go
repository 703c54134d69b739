package wire

import (
	"crypto/sha256"
	"encoding/hex"
)

// A node's system version stands for the whole set of its resources' (name,
// version) pairs: the XOR of one hash per pair. The control plane's store
// keeps it up to date per change (XOR the old pair out, the new one in);
// an agent computes the same over what it holds, so a reconnecting agent
// can say "I hold system version X" instead of listing every version
// (Hello.held_system_version), and any replica can tell whether that is
// the node's desired state. XOR of 128-bit hashes: two different sets
// collide only by accident (about 2^-128), and an agent can only mislead
// the control plane about its own node, as it could with a wrong list.

// PairHash is one resource's contribution to a system version: the first
// 16 bytes of sha256(name 0x00 version).
func PairHash(name, version string) [16]byte {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(version))
	var sum [sha256.Size]byte
	var out [16]byte
	copy(out[:], h.Sum(sum[:0]))
	return out
}

// XORInto folds a pair hash into (or, again, out of) a system version.
func XORInto(sys *[16]byte, pair [16]byte) {
	for i := range sys {
		sys[i] ^= pair[i]
	}
}

// FormatSystemVersion is the wire form of a system version (hex).
func FormatSystemVersion(sys [16]byte) string { return hex.EncodeToString(sys[:]) }

// SystemVersion returns the system version of versions (name -> version).
func SystemVersion(versions map[string]string) string {
	var sys [16]byte
	for name, v := range versions {
		XORInto(&sys, PairHash(name, v))
	}
	return FormatSystemVersion(sys)
}

// ResumeBySystemVersionHeader is the response header (value "1") by which
// a control plane announces that it understands Hello.held_system_version
// (proto/vsplane/v1/agent.proto, AgentService).
const ResumeBySystemVersionHeader = "vsplane-resume-by-system-version"
