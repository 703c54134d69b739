package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// SystemVersion is the XOR of sha256(name 0x00 version)[:16] over the pairs,
// whatever their order, and folding a pair in twice takes it out again.
func TestSystemVersion(t *testing.T) {
	if got, want := SystemVersion(nil), "00000000000000000000000000000000"; got != want {
		t.Fatalf("empty set = %s, want %s", got, want)
	}
	versions := map[string]string{"node/settings": "s1", "service/a/b": "v1", "service/a/c": "v2"}
	var want [16]byte
	for name, v := range versions {
		sum := sha256.Sum256([]byte(name + "\x00" + v))
		for i := range want {
			want[i] ^= sum[i]
		}
	}
	if got := SystemVersion(versions); got != hex.EncodeToString(want[:]) {
		t.Fatalf("SystemVersion = %s, want %x", got, want)
	}
	sys, _ := hex.DecodeString(SystemVersion(versions))
	var s [16]byte
	copy(s[:], sys)
	XORInto(&s, PairHash("service/a/c", "v2"))
	delete(versions, "service/a/c")
	if FormatSystemVersion(s) != SystemVersion(versions) {
		t.Fatal("folding a pair out does not give the smaller set's version")
	}
	if SystemVersion(map[string]string{"a": "1"}) == SystemVersion(map[string]string{"a": "2"}) {
		t.Fatal("a version change does not change the system version")
	}
}
